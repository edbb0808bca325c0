//! A Watch stream takes whatever etcd takes: raw gRPC streams, pipelined requests sent
//! before any answer is read, watch ids of every kind and requests etcd refuses, each sent
//! to etcd and to the proxy, answers compared.

mod raw;
mod support;

use std::time::Duration;

use raw::etcdserverpb::{
    kv_client::KvClient, watch_client::WatchClient, watch_request::RequestUnion, PutRequest,
    RangeRequest, WatchCancelRequest, WatchCreateRequest, WatchProgressRequest, WatchRequest,
    WatchResponse,
};
use support::{scrape, start_etcd, start_proxy, EtcdOptions};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const WAIT: Duration = Duration::from_secs(30);

fn create(key: &str, watch_id: i64) -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: key.as_bytes().to_vec().into(),
            watch_id,
            ..Default::default()
        })),
    }
}

fn progress() -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})),
    }
}

/// A response as compared: id, created, canceled, reason, the events' keys.
fn shape(r: &WatchResponse) -> String {
    let keys: Vec<String> = r
        .events
        .iter()
        .map(|e| String::from_utf8_lossy(&e.kv.as_ref().unwrap().key).into_owned())
        .collect();
    format!(
        "id={} created={} canceled={} reason={:?} events={keys:?}",
        r.watch_id, r.created, r.canceled, r.cancel_reason
    )
}

/// Opens a Watch stream to `endpoint` with `requests` already queued (sent before any
/// answer is read), and returns the sender (for more) and the response stream.
async fn pipelined(
    endpoint: &str,
    requests: Vec<WatchRequest>,
) -> (mpsc::Sender<WatchRequest>, tonic::Streaming<WatchResponse>) {
    let (tx, rx) = mpsc::channel(requests.len() + 16);
    for r in requests {
        tx.send(r).await.unwrap();
    }
    let mut client = WatchClient::new(raw::channel(endpoint).await);
    let stream = client
        .watch(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, stream)
}

/// Like [`pipelined`], but the call itself may fail (etcd sends an early error in the
/// response headers): the status it ended with, or `None` if it went on.
async fn ends_with(endpoint: &str, requests: Vec<WatchRequest>) -> Option<tonic::Status> {
    let (tx, rx) = mpsc::channel(requests.len() + 1);
    for r in requests {
        tx.send(r).await.unwrap();
    }
    let mut client = WatchClient::new(raw::channel(endpoint).await);
    let mut stream = match client.watch(ReceiverStream::new(rx)).await {
        Ok(s) => s.into_inner(),
        Err(s) => return Some(s),
    };
    match tokio::time::timeout(WAIT, stream.message()).await {
        Ok(Err(s)) => Some(s),
        _ => None,
    }
}

async fn take(stream: &mut tonic::Streaming<WatchResponse>, n: usize) -> Vec<WatchResponse> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match tokio::time::timeout(WAIT, stream.message()).await {
            Ok(Ok(Some(r))) => out.push(r),
            other => panic!("after {} of {n} responses: {other:?}", out.len()),
        }
    }
    out
}

/// Floods of progress requests and of creates, sent without reading: every request is
/// answered, and a unary call on the same connection goes on working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_floods_are_answered_in_full() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(etcd.endpoint(), vec!["--prefix".into(), "/app/".into()]).await;
    for endpoint in [etcd.endpoint(), proxy.endpoint()] {
        let channel = raw::channel(&endpoint).await;
        // 3,000 progress requests on a stream with one watch: the proxy answers each
        // (etcd 3.4 does too; 3.5 and later drop some while a watch is unsynced).
        let v34 = testkit::EtcdVersion::from_env().major_minor() == (3, 4);
        if endpoint == proxy.endpoint() || v34 {
            let mut reqs = vec![create("/app/p", 0)];
            reqs.extend((0..3000).map(|_| progress()));
            let (tx, mut stream) = pipelined(&endpoint, reqs).await;
            let got = take(&mut stream, 3001).await;
            assert!(got[0].created, "{endpoint}: {:?}", got[0]);
            assert!(
                got[1..]
                    .iter()
                    .all(|r| r.watch_id == -1 && r.events.is_empty()),
                "{endpoint}"
            );
            drop(tx);
        }
        // 10,000 creates without waiting for `created`.
        let n = 10_000;
        let reqs = (0..n)
            .map(|i| create(&format!("/app/c{}", i % 100), 0))
            .collect();
        let (tx, mut stream) = pipelined(&endpoint, reqs).await;
        let mut kv = KvClient::new(channel.clone());
        let range = RangeRequest {
            key: b"/app/p".to_vec().into(),
            ..Default::default()
        };
        kv.range(range)
            .await
            .expect("a unary call beside the flood");
        let got = take(&mut stream, n).await;
        let ids: std::collections::HashSet<i64> = got.iter().map(|r| r.watch_id).collect();
        assert!(got.iter().all(|r| r.created && !r.canceled), "{endpoint}");
        assert_eq!(ids.len(), n, "{endpoint}: every watch its own id");
        drop(tx);
    }
}

/// A flood of progress requests on a stream with a watch from far beyond etcd's
/// revision, sent without reading, then a cancel of that watch and one more request:
/// fixed etcd drops the flood (`rev < w.startRev`, etcd#20221) and answers the last
/// request; through the proxy the same, with the flood costing nothing that lasts: the
/// stream's other watch still gets its events. (3.4.23 answers every request, below the
/// start.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_flood_etcd_would_drop_is_dropped() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(etcd.endpoint(), vec!["--prefix".into(), "/app/".into()]).await;
    let channel = raw::channel(&etcd.endpoint()).await;
    let mut kv = KvClient::new(channel);
    let put = |key: &str| PutRequest {
        key: key.as_bytes().to_vec().into(),
        value: b"v".to_vec().into(),
        ..Default::default()
    };
    let now = kv.put(put("/app/n")).await.unwrap().into_inner();
    let far = now.header.unwrap().revision + 1_000_000;
    let flood = 3000;
    let fixed = testkit::EtcdVersion::from_env().major_minor() >= (3, 5);
    for endpoint in [etcd.endpoint(), proxy.endpoint()] {
        let mut reqs = vec![
            create("/app/n", 0),
            WatchRequest {
                request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                    key: b"/app/f".to_vec().into(),
                    start_revision: far,
                    ..Default::default()
                })),
            },
        ];
        reqs.extend((0..flood).map(|_| progress()));
        reqs.push(WatchRequest {
            request_union: Some(RequestUnion::CancelRequest(WatchCancelRequest {
                watch_id: 1,
            })),
        });
        reqs.push(progress());
        let (tx, mut stream) = pipelined(&endpoint, reqs).await;
        let created = take(&mut stream, 2).await;
        assert!(
            created.iter().all(|r| r.created && !r.canceled),
            "{endpoint}"
        );
        assert_eq!((created[0].watch_id, created[1].watch_id), (0, 1));
        // Until the far watch's `canceled` and the answer to the last request (the
        // first answer not below the far start, or the only one).
        let (mut canceled, mut answers) = (false, Vec::new());
        while !canceled
            || answers.is_empty()
            || (!fixed && endpoint == etcd.endpoint() && answers.len() < flood + 1)
        {
            let r = take(&mut stream, 1).await.remove(0);
            if r.canceled {
                assert_eq!(r.watch_id, 1, "{endpoint}");
                canceled = true;
            } else {
                assert_eq!((r.watch_id, r.events.len()), (-1, 0), "{endpoint}: {r:?}");
                answers.push(r.header.unwrap().revision);
            }
        }
        // The other watch goes on: the next thing on the stream is its event.
        let rev = kv.put(put("/app/n")).await.unwrap().into_inner();
        let r = take(&mut stream, 1).await.remove(0);
        assert_eq!(
            (r.watch_id, r.header.unwrap().revision),
            (0, rev.header.unwrap().revision),
            "{endpoint}: {r:?}"
        );
        println!(
            "PROGRESS FLOOD | {endpoint} | {} answers to {} requests",
            answers.len(),
            flood + 1
        );
        if endpoint == proxy.endpoint() || fixed {
            assert_eq!(answers.len(), 1, "{endpoint}: {answers:?}");
        }
        drop(tx);
    }
}

/// Watch ids: a client's id taken by a cached watch is refused for a forwarded one (and
/// the other way round), a negative id is taken as etcd takes it, and the replies to
/// creates come in the order of the creates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_ids_and_reply_order_as_etcd() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(etcd.endpoint(), vec!["--prefix".into(), "/app/".into()]).await;
    let cases: Vec<(&str, Vec<WatchRequest>, Vec<&str>)> = vec![
        // cached then forwarded with one id, and the other way round
        (
            "cache, then etcd, id 7",
            vec![create("/app/d", 7), create("/o/d", 7)],
            vec!["/app/d"],
        ),
        (
            "etcd, then cache, id 8",
            vec![create("/o/e", 8), create("/app/e", 8)],
            vec!["/o/e"],
        ),
        // two cached creates with one id: the refusal comes after the first's created
        (
            "cache twice, id 9",
            vec![create("/app/f", 9), create("/app/g", 9)],
            vec!["/app/f"],
        ),
        // a negative id of the client's own
        ("negative id", vec![create("/app/w", -5)], vec!["/app/w"]),
        // automatic ids on both sides never meet a client's
        (
            "automatic and chosen",
            vec![
                create("/o/h", 1),
                create("/app/h", 0),
                create("/app/i", 0),
                create("/o/i", 0),
            ],
            vec!["/o/h", "/app/h"],
        ),
    ];
    for (what, reqs, puts) in cases {
        let n = reqs.len();
        let mut answers = Vec::new();
        let mut streams = Vec::new();
        for endpoint in [etcd.endpoint(), proxy.endpoint()] {
            let (tx, mut stream) = pipelined(&endpoint, reqs.clone()).await;
            let got: Vec<String> = take(&mut stream, n).await.iter().map(shape).collect();
            answers.push(got);
            streams.push((tx, stream));
        }
        assert_eq!(
            answers[1], answers[0],
            "{what}: created/refused through the proxy vs etcd"
        );
        // Then each key's event, under the id its watch got.
        let mut kv = KvClient::new(raw::channel(&etcd.endpoint()).await);
        for key in &puts {
            kv.put(PutRequest {
                key: key.as_bytes().to_vec().into(),
                value: b"v".to_vec().into(),
                ..Default::default()
            })
            .await
            .unwrap();
        }
        let mut events = Vec::new();
        for (_, stream) in streams.iter_mut() {
            let mut got: Vec<String> = take(stream, puts.len()).await.iter().map(shape).collect();
            got.sort();
            events.push(got);
        }
        assert_eq!(
            events[1], events[0],
            "{what}: events through the proxy vs etcd"
        );
    }
}

/// A request over the receive limit ends the stream with etcd's status, not OK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_request_ends_the_stream_with_etcds_status() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(etcd.endpoint(), vec!["--prefix".into(), "/app/".into()]).await;
    let mut codes = Vec::new();
    for endpoint in [etcd.endpoint(), proxy.endpoint()] {
        let big = "k".repeat(3 << 20);
        match ends_with(&endpoint, vec![create(&big, 0)]).await {
            Some(s) => codes.push(format!("{:?}", s.code())),
            None => panic!("{endpoint}: the stream went on or ended cleanly"),
        }
    }
    assert_eq!(codes[1], codes[0]);
}

/// etcd's own count of its watchers (`etcd_debugging_mvcc_watcher_total`).
fn etcd_watchers(etcd: &support::EtcdServer) -> f64 {
    let (_, _, body) = scrape::http_get(etcd.client_addr(), "/metrics");
    body.lines()
        .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_watcher_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("etcd_debugging_mvcc_watcher_total in etcd's metrics")
}

/// Streams that close leave nothing behind. Three rounds of `STREAMS` Watch streams, each
/// with a cached and a forwarded watch, opened and closed: after each, the proxy's
/// gauges are back to zero and etcd has only the watchers it had before (the forwarded
/// watches were canceled upstream). The memory a round takes stays with the process
/// (glibc's heap does not shrink under live allocations) and is used again: the third
/// round grows the proxy by at most a quarter of what the first did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_streams_leave_no_state() {
    const STREAMS: usize = 2000;
    let etcd = start_etcd(EtcdOptions::default()).await;
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], support::free_port()));
    let proxy = start_proxy(
        etcd.endpoint(),
        vec![
            "--prefix".into(),
            "/app/".into(),
            "--metrics-addr".into(),
            metrics.to_string(),
        ],
    )
    .await;
    let pid = proxy.pid().unwrap();
    let watchers_before = etcd_watchers(&etcd);
    let gauges = |s: &scrape::Scrape| {
        (
            s.value("etcd_cache_proxy_watch_streams", &[]),
            s.value("etcd_cache_proxy_watches", &[("served", "cache")]),
            s.value("etcd_cache_proxy_watches", &[("served", "etcd")]),
        )
    };
    let n = STREAMS as f64;
    let rss_start = support::rss_kib(pid);
    let mut after_round = Vec::new();
    for round in 0..3 {
        let channel = raw::channel(&proxy.endpoint()).await;
        let mut open = Vec::with_capacity(STREAMS);
        for i in 0..STREAMS {
            let (tx, rx) = mpsc::channel(4);
            tx.send(create(&format!("/app/k{}", i % 10), 0))
                .await
                .unwrap();
            tx.send(create(&format!("/o/k{}", i % 10), 0))
                .await
                .unwrap();
            let mut stream = WatchClient::new(channel.clone())
                .watch(ReceiverStream::new(rx))
                .await
                .unwrap()
                .into_inner();
            let created = take(&mut stream, 2).await;
            assert!(
                created.iter().all(|r| r.created),
                "round {round}: {created:?}"
            );
            open.push((tx, stream));
        }
        scrape::scrape_until(metrics, "every stream and watch open", |s| {
            gauges(s) == (n, n, n)
        })
        .await;
        let rss_open = support::rss_kib(pid);
        drop(open);
        drop(channel);
        scrape::scrape_until(metrics, "every stream and watch closed", |s| {
            gauges(s) == (0.0, 0.0, 0.0)
        })
        .await;
        let deadline = std::time::Instant::now() + WAIT;
        while etcd_watchers(&etcd) > watchers_before {
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: etcd still has {} watchers, {watchers_before} before",
                etcd_watchers(&etcd)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let rss_closed = support::rss_kib(pid);
        eprintln!(
            "round {round}: RSS {rss_start} KiB at the start, {rss_open} KiB with {STREAMS} \
             streams open, {rss_closed} KiB after they closed"
        );
        after_round.push(rss_closed);
    }
    // Measured (debug build, etcd 3.4.23, jemalloc): the rounds grow the proxy by 74 MB,
    // 8 MB, then 1.6 MB: a plateau (the allocator's retained pages used again; with glibc's
    // allocator 92, 20, 5, 1 and 0.2 MB, the same with MALLOC_ARENA_MAX=1
    // MALLOC_TRIM_THRESHOLD_=0). State kept per closed stream would grow every round by the
    // first's amount.
    let first = after_round[0].saturating_sub(rss_start);
    let third = after_round[2].saturating_sub(after_round[1]);
    assert!(
        third <= first / 4,
        "the third round grew the proxy by {third} KiB, the first by {first} KiB \
         (RSS after each: {after_round:?}): state kept per closed stream?"
    );
}

/// `--max-connections`: a connection beyond the limit is closed at once and the log names
/// the limit; the open ones keep working, and a connection is taken again once one
/// closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_are_refused_and_the_others_go_on() {
    use raw::etcdserverpb::{kv_client::KvClient, RangeRequest};
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(
        etcd.endpoint(),
        ["--prefix", "/t/", "--max-connections", "2"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
    )
    .await;
    let read = || RangeRequest {
        key: b"/t/a".to_vec().into(),
        ..Default::default()
    };
    let connect = || async {
        tonic::transport::Endpoint::from_shared(proxy.endpoint())
            .unwrap()
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
    };
    let mut first = KvClient::new(connect().await.unwrap());
    let mut second = KvClient::new(connect().await.unwrap());
    first.range(read()).await.unwrap();
    second.range(read()).await.unwrap();
    // The third: closed at once (the dial or its first call fails).
    let third = match connect().await {
        Ok(ch) => KvClient::new(ch).range(read()).await.map(|_| ()),
        Err(e) => Err(tonic::Status::unavailable(e.to_string())),
    };
    assert!(third.is_err(), "a third connection was served");
    assert!(
        proxy.log_text().contains("--max-connections"),
        "{}",
        proxy.log_tail()
    );
    first.range(read()).await.unwrap();
    drop(first);
    // The slot comes back when the connection is closed (the server sees it end).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let again = match connect().await {
            Ok(ch) => KvClient::new(ch).range(read()).await.map(|_| ()),
            Err(e) => Err(tonic::Status::unavailable(e.to_string())),
        };
        if again.is_ok() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no connection taken after one closed: {again:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    second.range(read()).await.unwrap();
}
