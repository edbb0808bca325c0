//! Stream behaviour under stress and faults: a client that does not read (and is caught
//! up from etcd once it falls behind the cache's window), a
//! require-leader watch when etcd goes away, the health service, the send limit.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use etcd_client::{ConnectOptions, WatchOptions};
use support::scrape::scrape_until;
use support::{client, free_port, start_etcd, start_proxy, EtcdOptions};

/// A proxy with a small window (64 revisions, 1 MiB: 64 of the tests' 16 KiB values,
/// so that a client that lags falls behind it) and small queues, serving metrics.
async fn small_window_proxy(etcd: &support::EtcdServer) -> (support::Proxy, SocketAddr) {
    let maddr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let proxy = start_proxy(
        etcd.endpoint(),
        vec![
            "--history-window".into(),
            "64".into(),
            "--history-bytes".into(),
            (1024 * 1024).to_string(),
            "--subscriber-buffer".into(),
            "4".into(),
            "--watch-send-queue".into(),
            "4".into(),
            "--metrics-addr".into(),
            maddr.to_string(),
        ],
    )
    .await;
    (proxy, maddr)
}

/// Writes `n` puts of `value` to keys `{prefix}{i % keys}`, one after another; their
/// revisions, in order.
async fn put_keys(
    writer: &mut etcd_client::Client,
    prefix: &str,
    keys: usize,
    value: &str,
    n: usize,
) -> Vec<i64> {
    let mut revisions = Vec::with_capacity(n);
    for i in 0..n {
        let r = writer
            .put(format!("{prefix}{}", i % keys), value, None)
            .await
            .unwrap();
        revisions.push(r.header().unwrap().revision());
    }
    revisions
}

/// Waits until the one watch away with etcd has come back to the cache: rejoined once,
/// none served by etcd, one by the cache.
async fn back_in_the_cache(maddr: SocketAddr, what: &str) {
    scrape_until(maddr, what, |s| {
        s.get("etcd_cache_proxy_watches_rejoined_total", &[]) == Some(1.0)
            && s.get("etcd_cache_proxy_watches", &[("served", "etcd")]) == Some(0.0)
            && s.get("etcd_cache_proxy_watches", &[("served", "cache")]) == Some(1.0)
    })
    .await;
}

/// etcd's own count of its Watch streams (`etcd_debugging_mvcc_watch_stream_total`).
fn etcd_watch_streams(etcd: &support::EtcdServer) -> f64 {
    let (_, _, body) = support::scrape::http_get(etcd.client_addr(), "/metrics");
    body.lines()
        .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_watch_stream_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("etcd_debugging_mvcc_watch_stream_total in etcd's metrics")
}

/// Waits (up to 20 s) until etcd has `want` Watch streams.
async fn etcd_watch_streams_become(etcd: &support::EtcdServer, want: f64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = etcd_watch_streams(etcd);
        if now == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: etcd has {now} Watch streams, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads `stream` until its watch has seen revision `last` or ends; the mod revisions
/// of its events, checked contiguous, and the cancel that ended it, if one did.
async fn read_to(
    stream: &mut etcd_client::WatchStream,
    last: i64,
) -> (Vec<i64>, Option<etcd_client::WatchResponse>) {
    let mut seen: Vec<i64> = Vec::new();
    while seen.last().is_none_or(|&r| r < last) {
        let r = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .expect("the slow client got no answer")
            .unwrap()
            .expect("the stream ended");
        if r.canceled() {
            return (seen, Some(r));
        }
        for e in r.events() {
            let rev = e.kv().unwrap().mod_revision();
            if let Some(&prev) = seen.last() {
                assert_eq!(rev, prev + 1, "slow client: {prev} then {rev}");
            }
            seen.push(rev);
        }
    }
    (seen, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_stalls_nobody_and_is_caught_up_from_etcd_then_returns() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let (proxy, maddr) = small_window_proxy(&etcd).await;
    let mut writer = client(&etcd.endpoint()).await;
    // The slow client opens a watch and never reads it (id 7: the cache reads id 0 as
    // "any id", so a watch 0 caught up from etcd stays there).
    let mut slow = client(&proxy.endpoint()).await;
    let mut slow_stream = slow
        .watch(
            "/s/",
            Some(WatchOptions::new().with_prefix().with_watch_id(7)),
        )
        .await
        .unwrap();
    let created = slow_stream.message().await.unwrap().unwrap();
    assert!(created.created());
    let first = created.header().unwrap().revision() + 1;
    // The fast client reads everything, promptly.
    let mut fast = client(&proxy.endpoint()).await;
    let mut fast_stream = fast
        .watch("/s/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(fast_stream.message().await.unwrap().unwrap().created());
    let value = "v".repeat(16 * 1024);
    let writes = 400;
    let started = Instant::now();
    let reader = tokio::spawn(async move {
        let mut seen = Vec::new();
        while seen.len() < writes {
            let r = tokio::time::timeout(Duration::from_secs(10), fast_stream.message())
                .await
                .expect("the fast client stalled")
                .unwrap()
                .unwrap();
            assert!(!r.canceled(), "fast client canceled: {}", r.cancel_reason());
            seen.extend(r.events().iter().map(|e| e.kv().unwrap().mod_revision()));
        }
        seen
    });
    let last = *put_keys(&mut writer, "/s/", 10, &value, writes)
        .await
        .last()
        .unwrap();
    let seen = reader.await.unwrap();
    assert_eq!(seen.len(), writes);
    assert!(seen.windows(2).all(|w| w[1] == w[0] + 1), "gap or reorder");
    assert_eq!(*seen.last().unwrap(), last);
    eprintln!(
        "{writes} writes seen by the fast client in {:?}",
        started.elapsed()
    );
    // The slow client fell out of the 64-revision window; etcd still holds every
    // revision, so it is not canceled (as etcd would not cancel it): reading at last, it
    // gets every event once, in order, the later ones from etcd.
    let (got, canceled) = read_to(&mut slow_stream, last).await;
    assert!(canceled.is_none(), "canceled: {canceled:?}");
    assert_eq!(got.first(), Some(&first));
    assert_eq!(got.last(), Some(&last));
    // Caught up, it returned to the cache: etcd holds no watch of it any more (the fast
    // client's stream ended with its reader).
    scrape_until(
        maddr,
        "the slow watch caught up from etcd, then back in the cache",
        |s| {
            s.get("etcd_cache_proxy_watches_caught_up_total", &[]) == Some(1.0)
                && s.get("etcd_cache_proxy_watches_rejoined_total", &[]) == Some(1.0)
                && s.get("etcd_cache_proxy_watches", &[("served", "etcd")]) == Some(0.0)
                && s.get("etcd_cache_proxy_watches", &[("served", "cache")]) == Some(1.0)
        },
    )
    .await;
    // The watch goes on, from the cache: a new write reaches it once.
    let next = writer.put("/s/after", "x", None).await.unwrap();
    let next = next.header().unwrap().revision();
    let (got, canceled) = read_to(&mut slow_stream, next).await;
    assert!(canceled.is_none(), "canceled: {canceled:?}");
    assert_eq!(got, vec![next]);
    // The proxy still serves new watches.
    let mut again = fast.watch("/s/0", Some(WatchOptions::new())).await.unwrap();
    assert!(again.message().await.unwrap().unwrap().created());
}

/// A burst longer than the window, within --history-bytes, is caught up from the
/// cache's memory: the client that lagged reads every event once, in order, and no
/// watch was moved to etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_longer_than_the_window_is_caught_up_from_memory() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let maddr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let args = [
        "--history-window",
        "64",
        "--subscriber-buffer",
        "4",
        "--watch-send-queue",
        "4",
    ];
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    args.extend(["--metrics-addr".to_string(), maddr.to_string()]);
    let proxy = start_proxy(etcd.endpoint(), args).await;
    let mut writer = client(&etcd.endpoint()).await;
    let mut slow = client(&proxy.endpoint()).await;
    let mut stream = slow
        .watch(
            "/m/",
            Some(WatchOptions::new().with_prefix().with_watch_id(4)),
        )
        .await
        .unwrap();
    let created = stream.message().await.unwrap().unwrap();
    let first = created.header().unwrap().revision() + 1;
    let last = *put_keys(&mut writer, "/m/", 10, "v", 400)
        .await
        .last()
        .unwrap();
    let (got, canceled) = read_to(&mut stream, last).await;
    assert!(canceled.is_none(), "canceled: {canceled:?}");
    assert_eq!((got.first(), got.len()), (Some(&first), 400));
    scrape_until(maddr, "no watch moved to etcd", |s| {
        s.get("etcd_cache_proxy_watches_caught_up_total", &[]) == Some(0.0)
            && s.get("etcd_cache_proxy_watches", &[("served", "cache")]) == Some(1.0)
    })
    .await;
}

/// A watch that starts below the cache's window (a client resuming after a proxy
/// restart, say) is served by etcd until etcd has brought it into the window; then it
/// comes to the cache under its id, and etcd holds no watch of it any more. Nothing is
/// missed or seen twice across the move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_below_the_window_moves_to_the_cache_once_caught_up() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let (proxy, maddr) = small_window_proxy(&etcd).await;
    let mut writer = client(&etcd.endpoint()).await;
    let first = put_keys(&mut writer, "/r/", 7, "v", 200).await[0];
    let mut c = client(&proxy.endpoint()).await;
    let opts = WatchOptions::new()
        .with_prefix()
        .with_prev_key()
        .with_start_revision(first)
        .with_watch_id(3);
    let mut stream = c.watch("/r/", Some(opts)).await.unwrap();
    let created = stream.message().await.unwrap().unwrap();
    assert!(created.created() && created.watch_id() == 3);
    let head = created.header().unwrap().revision();
    let (got, canceled) = read_to(&mut stream, head).await;
    assert!(canceled.is_none(), "canceled: {canceled:?}");
    assert_eq!((got.first(), got.len()), (Some(&first), 200));
    back_in_the_cache(maddr, "the watch from below the window, in the cache").await;
    // It goes on from the cache: each new write once, with its previous value.
    for i in 0..3 {
        let next = writer.put("/r/0", format!("after{i}"), None).await.unwrap();
        let next = next.header().unwrap().revision();
        let r = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("no event")
            .unwrap()
            .unwrap();
        assert_eq!(r.watch_id(), 3);
        let revs: Vec<_> = r
            .events()
            .iter()
            .map(|e| e.kv().unwrap().mod_revision())
            .collect();
        assert_eq!(revs, [next]);
        assert!(r.events()[0].prev_kv().is_some(), "prev_kv asked for");
    }
    drop(proxy);
}

/// The same for the first watch of a client's stream, whose id is 0 (clientv3 and
/// kube-apiserver open one stream per watch; the cache reads 0 as its next free id, which
/// on that stream is still 0), while writes go on: etcd's answer to the watch usually
/// comes before the cache has applied the same revision, and the watch still comes to
/// the cache (after a proxy restart, kube-apiserver's every watch resumes from below the
/// new cache's window: without this, etcd kept all of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_zero_from_below_the_window_moves_to_the_cache_while_writes_go_on() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let mut writer = client(&etcd.endpoint()).await;
    let first = put_keys(&mut writer, "/z/", 2, "v", 2).await[0];
    // The proxy starts after them: its window starts above `first`.
    let (proxy, maddr) = small_window_proxy(&etcd).await;
    let mut c = client(&proxy.endpoint()).await;
    let opts = WatchOptions::new().with_prefix().with_start_revision(first);
    let mut stream = c.watch("/z/", Some(opts)).await.unwrap();
    let created = stream.message().await.unwrap().unwrap();
    assert!(created.created() && created.watch_id() == 0);
    let last = *put_keys(&mut writer, "/z/", 3, "w", 20)
        .await
        .last()
        .unwrap();
    let (got, canceled) = read_to(&mut stream, last).await;
    assert!(canceled.is_none(), "canceled: {canceled:?}");
    assert_eq!((got.first(), got.len()), (Some(&first), 22));
    back_in_the_cache(maddr, "watch 0 from below the window, in the cache").await;
    let next = put_keys(&mut writer, "/z/", 1, "after", 1).await[0];
    let (got, canceled) = read_to(&mut stream, next).await;
    assert!(canceled.is_none(), "canceled: {canceled:?}");
    assert_eq!(got, [next], "the next write once, from the cache");
    drop(proxy);
}

/// A watch from below the window on a range nobody writes to any more (kube-apiserver's
/// watches of quiet resources, resumed after a proxy restart) gets nothing from etcd
/// that tells it has caught up: the proxy asks etcd for stream-level progress, and the
/// answer brings it to the cache, where etcd's progress answers are trusted (not 3.4.23,
/// etcd#15220: there it stays with etcd, which serves it). Writes elsewhere in the
/// cache's prefix go on meanwhile; the watch's next write is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_watch_from_below_the_window_moves_to_the_cache_where_progress_is_trusted() {
    let trusted = testkit::EtcdVersion::from_env()
        .server_version()
        .trusts_progress();
    let etcd = start_etcd(EtcdOptions::default()).await;
    let mut writer = client(&etcd.endpoint()).await;
    let first = put_keys(&mut writer, "/q/", 1, "v", 1).await[0];
    writer.put("/other", "v", None).await.unwrap();
    let (proxy, maddr) = small_window_proxy(&etcd).await;
    let mut c = client(&proxy.endpoint()).await;
    // The cache's own stream.
    etcd_watch_streams_become(&etcd, 1.0, "the cache's").await;
    let opts = WatchOptions::new().with_prefix().with_start_revision(first);
    let mut stream = c.watch("/q/", Some(opts)).await.unwrap();
    assert!(stream.message().await.unwrap().unwrap().created());
    assert_eq!(etcd_watch_streams(&etcd), 2.0, "the watch away on its own");
    let (got, canceled) = read_to(&mut stream, first).await;
    assert!(canceled.is_none(), "canceled: {canceled:?}");
    assert_eq!(got, [first]);
    for _ in 0..5 {
        writer.put("/other", "w", None).await.unwrap();
    }
    if trusted {
        back_in_the_cache(maddr, "the quiet watch, in the cache").await;
        // Nothing is left on the client stream's stream to etcd: it ends.
        etcd_watch_streams_become(&etcd, 1.0, "the quiet watch back in the cache").await;
    } else {
        // Served by etcd now. That it is never brought back on this version is the
        // trust check in `moves.rs` (nothing here waits to watch it not happen).
        scrape_until(maddr, "the quiet watch, served by etcd", |s| {
            s.get("etcd_cache_proxy_watches", &[("served", "etcd")]) == Some(1.0)
                && s.get("etcd_cache_proxy_watches_rejoined_total", &[]) == Some(0.0)
        })
        .await;
    }
    let next = put_keys(&mut writer, "/q/", 1, "after", 1).await[0];
    let r = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("no event")
        .unwrap()
        .unwrap();
    let revs: Vec<_> = (r.events().iter())
        .map(|e| e.kv().unwrap().mod_revision())
        .collect();
    assert_eq!(revs, [next], "the next write once");
    drop(proxy);
}

/// A watch behind the cache's window whose next revision etcd has compacted ends as
/// etcd ends it: canceled with etcd's compact revision, after every event before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_behind_the_window_and_etcds_compaction_gets_etcds_answer() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let (proxy, _maddr) = small_window_proxy(&etcd).await;
    let mut writer = client(&etcd.endpoint()).await;
    let mut slow = client(&proxy.endpoint()).await;
    let mut slow_stream = slow
        .watch("/c/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(slow_stream.message().await.unwrap().unwrap().created());
    let value = "v".repeat(16 * 1024);
    let last = *put_keys(&mut writer, "/c/", 10, &value, 400)
        .await
        .last()
        .unwrap();
    writer.compact(last, None).await.unwrap();
    // The cache applies a later revision, so that its window moves on.
    writer.put("/c/after", "x", None).await.unwrap();
    let (got, canceled) = read_to(&mut slow_stream, last + 1).await;
    let canceled = canceled.expect("etcd compacted what the watch needed: it ends");
    assert_eq!(
        canceled.compact_revision(),
        last,
        "etcd's compact revision: {canceled:?}"
    );
    assert!(got.last().is_some_and(|&r| r < last), "{:?}", got.last());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_leader_watch_ends_when_etcd_is_gone() {
    let mut etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(etcd.endpoint(), vec![]).await;
    let _ = client(&proxy.endpoint()).await;
    let opts = ConnectOptions::new().with_require_leader(true);
    let mut c = etcd_client::Client::connect([proxy.endpoint()], Some(opts))
        .await
        .unwrap();
    let mut plain = client(&proxy.endpoint()).await;
    let mut leader_watch = c.watch("/l", None).await.unwrap();
    assert!(leader_watch.message().await.unwrap().unwrap().created());
    let mut plain_watch = plain.watch("/l", None).await.unwrap();
    assert!(plain_watch.message().await.unwrap().unwrap().created());
    let etcd = tokio::task::spawn_blocking(move || {
        etcd.kill();
        etcd
    })
    .await
    .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(20), leader_watch.message())
        .await
        .expect("the require-leader watch did not end");
    let err = end.expect_err("expected an error");
    assert!(err.to_string().contains("no leader"), "{err}");
    // A watch without the requirement stays open.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), plain_watch.message())
            .await
            .is_err()
    );
    drop(etcd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_the_cache_and_the_send_limit_holds() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::{health_check_response::ServingStatus, health_client::HealthClient};

    let mut etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(
        etcd.endpoint(),
        vec!["--max-send-bytes".into(), "4096".into()],
    )
    .await;
    let channel = tonic::transport::Endpoint::from_shared(proxy.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let check = HealthCheckRequest {
        service: String::new(),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = health
            .check(check.clone())
            .await
            .unwrap()
            .into_inner()
            .status;
        if s == ServingStatus::Serving as i32 {
            break;
        }
        assert!(Instant::now() < deadline, "never SERVING");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A response above --max-send-bytes is refused; small ones still go.
    let mut c = client(&proxy.endpoint()).await;
    c.put("/big", "x".repeat(10_000), None).await.unwrap();
    assert!(c.get("/big", None).await.is_err());
    c.put("/small", "y", None).await.unwrap();
    assert_eq!(c.get("/small", None).await.unwrap().count(), 1);
    // Without etcd the cache stops following it: NOT_SERVING.
    let etcd_back = tokio::task::spawn_blocking(move || {
        etcd.kill();
        etcd
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = health
            .check(check.clone())
            .await
            .unwrap()
            .into_inner()
            .status;
        if s == ServingStatus::NotServing as i32 {
            break;
        }
        assert!(Instant::now() < deadline, "still SERVING without etcd");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(etcd_back);
}

/// A watch that catches up from the cache's history gets its events merged into few
/// responses (as etcd sends a catching-up watcher), in order, with nothing lost; a second
/// watch on the same stream keeps its own order, and header revisions never go down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catching_up_watch_gets_its_events_merged_in_order() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let proxy = start_proxy(etcd.endpoint(), vec!["--prefix".into(), "/m/".into()]).await;
    let mut through = client(&proxy.endpoint()).await;
    through.get("/m/", None).await.unwrap();
    let mut writer = client(&etcd.endpoint()).await;
    let revisions = put_keys(&mut writer, "/m/k", 7, "v", 300).await;
    let key1: Vec<i64> = revisions.iter().copied().skip(1).step_by(7).collect();
    // A linearizable read through the proxy: the cache has applied every put.
    through.get("/m/", None).await.unwrap();
    let from = revisions[0];
    let mut stream = through
        .watch(
            "/m/",
            Some(WatchOptions::new().with_prefix().with_start_revision(from)),
        )
        .await
        .unwrap();
    stream
        .watch("/m/k1", Some(WatchOptions::new().with_start_revision(from)))
        .await
        .unwrap();
    let mut ids = Vec::new();
    let mut seen: std::collections::HashMap<i64, (Vec<i64>, usize)> = Default::default();
    let mut header = 0;
    let done = |seen: &std::collections::HashMap<i64, (Vec<i64>, usize)>, ids: &[i64]| {
        ids.len() == 2
            && seen.get(&ids[0]).map_or(0, |s| s.0.len()) == revisions.len()
            && seen.get(&ids[1]).map_or(0, |s| s.0.len()) == key1.len()
    };
    while !done(&seen, &ids) {
        let r = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("the stream stalled")
            .unwrap()
            .unwrap();
        let h = r.header().unwrap().revision();
        assert!(h >= header, "header revision went down: {h} after {header}");
        header = h;
        assert!(!r.canceled(), "canceled: {}", r.cancel_reason());
        if r.created() {
            ids.push(r.watch_id());
            continue;
        }
        let entry = seen.entry(r.watch_id()).or_default();
        entry
            .0
            .extend(r.events().iter().map(|e| e.kv().unwrap().mod_revision()));
        entry.1 += 1;
        if let Some(last) = r.events().last() {
            assert!(
                h >= last.kv().unwrap().mod_revision(),
                "header below its events"
            );
        }
    }
    let (all, all_responses) = &seen[&ids[0]];
    let (one, _) = &seen[&ids[1]];
    assert_eq!(
        all, &revisions,
        "the prefix watch: every revision, in order"
    );
    assert_eq!(one, &key1, "the key watch: its revisions, in order");
    assert!(
        *all_responses * 4 <= revisions.len(),
        "{} events came in {all_responses} responses: not merged",
        revisions.len()
    );
}
