//! What a client that floods one Watch stream can hold, and what it cannot break: the
//! proxy reads every Watch stream eagerly (h2 closes a whole connection whose small
//! frames sit unread) into a queue bounded per connection; a stream that outruns it
//! ends with `ResourceExhausted`, alone, and the connection's other streams and calls go
//! on.

mod raw;
mod support;

use std::time::Duration;

use raw::etcdserverpb::{
    kv_client::KvClient, watch_client::WatchClient, watch_request::RequestUnion, RangeRequest,
    WatchCreateRequest, WatchProgressRequest, WatchRequest,
};
use support::{go_program, start_etcd, start_proxy, EtcdOptions};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const WAIT: Duration = Duration::from_secs(60);

fn create(key: &str) -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: key.as_bytes().to_vec().into(),
            ..Default::default()
        })),
    }
}

fn progress() -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})),
    }
}

/// A client sends creates with 4 KiB keys on one stream, faster than the stream's
/// session takes them, and reads none of the answers: the stream ends with
/// `ResourceExhausted`, naming `--max-queued-watch-request-bytes`, once the connection's
/// queued requests (256 KiB here, to keep the flood short; 16 MiB by default) are spent, after
/// the answers sent before; a second stream and unary calls on the same connection are
/// served meanwhile and after. (etcd would stop reading the stream instead: it never
/// ends a stream for this.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_over_its_connections_request_queue_ends_alone() {
    flood_one_stream(
        "--max-queued-watch-request-bytes",
        "more than 262144 bytes of Watch requests queued on this connection \
         (--max-queued-watch-request-bytes)",
    )
    .await;
}

/// The same flood against the proxy's bound over every connection
/// (`--max-queued-watch-request-bytes-total`, 256 MiB by default, 256 KiB here): the
/// stream ends naming that flag, and the connection goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_over_the_proxys_request_queue_ends_alone() {
    flood_one_stream(
        "--max-queued-watch-request-bytes-total",
        "more than 262144 bytes of Watch requests queued over every connection \
         (--max-queued-watch-request-bytes-total)",
    )
    .await;
}

/// The flood, with `flag` set to 256 KiB; the stream's end must say `message`.
async fn flood_one_stream(flag: &str, message: &str) {
    const FLOOD: usize = 6_000;
    let key = |i: usize| format!("/app/{}/{i}", "k".repeat(4096));
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(
        etcd.endpoint(),
        vec![
            "--prefix".into(),
            "/app/".into(),
            flag.into(),
            (256 << 10).to_string(),
        ],
    )
    .await;
    let channel = tonic::transport::Endpoint::from_shared(proxy.endpoint())
        .unwrap()
        .initial_stream_window_size(65_535)
        .connect()
        .await
        .unwrap();
    let mut kv = KvClient::new(channel.clone());
    let range = || RangeRequest {
        key: b"/app/a".to_vec().into(),
        ..Default::default()
    };
    let (tx, rx) = mpsc::channel(1024);
    tx.send(create("/app/a")).await.unwrap();
    let mut flooded = WatchClient::new(channel.clone())
        .watch(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let sender = tokio::spawn(async move {
        let mut sent = 0;
        while sent < FLOOD && tx.send(create(&key(sent))).await.is_ok() {
            sent += 1;
        }
        sent
    });
    let sent = tokio::time::timeout(WAIT, sender)
        .await
        .expect("the flood was taken (read and queued, or drained)")
        .unwrap();
    // The connection serves another stream and a unary call.
    kv.range(range())
        .await
        .expect("a unary call beside the flood");
    let (tx2, rx2) = mpsc::channel(4);
    tx2.send(create("/app/b")).await.unwrap();
    let mut other = WatchClient::new(channel.clone())
        .watch(ReceiverStream::new(rx2))
        .await
        .unwrap()
        .into_inner();
    let created = tokio::time::timeout(WAIT, other.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(created.created, "{created:?}");
    tx2.send(progress()).await.unwrap();
    tokio::time::timeout(WAIT, other.message())
        .await
        .unwrap()
        .expect("a progress answer on the other stream")
        .unwrap();
    // The flooded stream: the answers sent before, then its end.
    let mut answers = 0usize;
    let status = loop {
        match tokio::time::timeout(WAIT, flooded.message()).await.unwrap() {
            Ok(Some(_)) => answers += 1,
            Ok(None) => panic!("the flooded stream ended without a status after {answers}"),
            Err(status) => break status,
        }
    };
    println!("sent {sent}, {answers} answers, then {status:?}");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains(message), "{status:?}");
    assert!(answers > 0 && answers < FLOOD, "{answers}");
    kv.range(range())
        .await
        .expect("a unary call after the flood");
    assert!(
        !proxy.log_text().contains("too_many_data_frames"),
        "{}",
        proxy.log_tail()
    );
}

/// The proxy's peak resident memory (`VmHWM`), in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status")
}

/// A hostile client (tests/go, `flood`): 16 connections, each with 16 Watch streams sent
/// a whole 64 KiB stream window of requests cut into 1-byte DATA frames, nothing read.
/// h2's guard may close such a connection (a GOAWAY to that client only, which is what
/// it is for); what the flood can hold in the proxy stays far under the bound of
/// docs/RELIABILITY.md (measured: about 1.6 MiB per connection at the peak), and the
/// proxy serves a client of its own afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_one_byte_frames_holds_little_memory() {
    const CONNS: u64 = 16;
    let Some(bin) = go_program() else { return };
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(etcd.endpoint(), vec!["--prefix".into(), "/app/".into()]).await;
    let pid = proxy.pid().unwrap();
    let before = peak_kib(pid);
    let endpoint = proxy.endpoint();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(bin)
            .args(["-proxy", &endpoint, "-conns", &CONNS.to_string()])
            .args(["-streams", "16", "flood"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("OK flood"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let grown = peak_kib(pid).saturating_sub(before);
    println!("{stdout}peak grew by {grown} KiB for {CONNS} connections");
    // Far under the bound (9 MiB of window and 16 MiB of queue per connection, and the
    // read buffers of 18,504 small frames), with room for the allocator's slack.
    assert!(grown < CONNS * 16 * 1024, "{grown} KiB");
    let mut kv = KvClient::new(raw::channel(&proxy.endpoint()).await);
    kv.range(RangeRequest {
        key: b"/app/a".to_vec().into(),
        ..Default::default()
    })
    .await
    .expect("a call after the flood");
}
