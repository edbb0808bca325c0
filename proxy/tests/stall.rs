//! etcd-cache-proxy stopped (SIGSTOP) for 3 s while 64 writers put one-byte values to
//! etcd under its prefix and under a forwarded watch's: when it continues, thousands of
//! small watch responses wait on its connections to etcd at once. h2's small-frame
//! guard once closed the cache's connection here (`too_many_data_frames`, 4 runs of 4);
//! now both connections to etcd stay up, and calls of a client in flight through the
//! stall succeed.

mod support;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{GetOptions, WatchOptions};
use support::{scrape, start_etcd, start_proxy, EtcdOptions};

/// The stall (the scenario, not a wait).
const STALL: Duration = Duration::from_secs(3);
/// The stall of a `--full-matrix` run: long enough that hyper's default windows would
/// lose the connection on this 2-core machine (see tests/upstream_stall.rs in the root).
const LONG_STALL: Duration = Duration::from_secs(8);
/// How long the watchers through the proxy may take to see the last put.
const CATCH_UP: Duration = Duration::from_secs(60);

/// Reads a watch through the proxy on `prefix` and publishes the newest revision seen;
/// checks that revisions only go up.
fn follow(
    mut stream: etcd_client::WatchStream,
    seen: Arc<AtomicI64>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(resp) = stream.message().await.expect("the watch through the proxy") {
            for ev in resp.events() {
                let rev = ev.kv().unwrap().mod_revision();
                let before = seen.swap(rev, Ordering::Relaxed);
                assert!(rev > before, "revision {rev} after {before}");
            }
        }
    })
}

async fn wait_seen(seen: &AtomicI64, revision: i64, what: &str) {
    let waited = tokio::time::timeout(CATCH_UP, async {
        while seen.load(Ordering::Relaxed) < revision {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "{what}: revision {revision} not seen, at {}",
        seen.load(Ordering::Relaxed)
    );
}

/// Three rounds (with 8 s stalls in a `--full-matrix` run): the proxy's cache keeps its one
/// connection to etcd (`etcd_cache_upstream_connects_total` stays 1, no disconnect of
/// any cause), the forwarding channel keeps its own (a forwarded watch sees every put
/// without a break), and a client's calls through the proxy, one of them in flight when
/// the proxy stops, all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_under_small_events_keeps_the_connections_to_etcd() {
    let stall = if testkit::full_matrix() {
        LONG_STALL
    } else {
        STALL
    };
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
    let direct = support::client(&etcd.endpoint()).await;
    let through = support::client(&proxy.endpoint()).await;
    scrape::scrape_until(metrics, "the cache connected", |s| {
        s.get("etcd_cache_upstream_connects_total", &[("cache", "/app/")]) == Some(1.0)
    })
    .await;
    // One watch served by the cache, one forwarded to etcd (outside the prefix).
    let (cached, forwarded) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicI64::new(0)));
    let mut watchers = Vec::new();
    for (prefix, seen) in [("/app/", &cached), ("/o/", &forwarded)] {
        let mut stream = through
            .watch_client()
            .watch(prefix, Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        // etcd-client returns before the watch exists: a watch from now created after
        // the stop could start past the round's sentinel.
        let created = stream.message().await.unwrap().expect("created");
        assert!(created.created(), "{created:?}");
        watchers.push(follow(stream, seen.clone()));
    }
    for round in 0..3 {
        // A client of the proxy calling all through the round: a read served by the
        // cache and a write forwarded to etcd, one of them in flight at the stop.
        let stop = Arc::new(AtomicBool::new(false));
        let calls = {
            let (mut c, stop) = (through.clone(), stop.clone());
            tokio::spawn(async move {
                let mut done = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    c.get(
                        "/app/",
                        Some(GetOptions::new().with_prefix().with_count_only()),
                    )
                    .await
                    .expect("a read through the proxy across the stall");
                    c.put("/o/calls", "x", None)
                        .await
                        .expect("a forwarded write across the stall");
                    done += 2;
                }
                done
            })
        };
        let r = testkit::small_puts_while_stopped(&direct, &["/app/", "/o/"], pid, stall).await;
        // One more put under each prefix: each watch has caught up once it has its own.
        let mut kv = direct.kv_client();
        for (key, seen, what) in [
            ("/app/sentinel", &cached, "the cached watch"),
            ("/o/sentinel", &forwarded, "the forwarded watch"),
        ] {
            let rev = kv
                .put(key, "x", None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
            wait_seen(seen, rev, what).await;
        }
        stop.store(true, Ordering::Relaxed);
        let calls = calls.await.expect("the calls through the proxy");
        let s = tokio::task::spawn_blocking(move || scrape::scrape(metrics))
            .await
            .unwrap();
        let connects = s.value("etcd_cache_upstream_connects_total", &[("cache", "/app/")]);
        let disconnects: Vec<&str> = s
            .text
            .lines()
            .filter(|l| l.starts_with("etcd_cache_upstream_disconnects_total"))
            .filter(|l| !l.ends_with(" 0"))
            .collect();
        println!(
            "round {round}: {} puts in the stall, {calls} calls through the proxy, connects {connects}",
            r.puts
        );
        assert_eq!(
            connects,
            1.0,
            "round {round}: {disconnects:?}\n{}",
            proxy.log_tail()
        );
        assert!(disconnects.is_empty(), "round {round}: {disconnects:?}");
        assert!(calls > 0);
    }
    let log = proxy.log_text();
    assert!(
        !log.contains("too_many_data_frames"),
        "{}",
        proxy.log_tail()
    );
    assert!(
        !log.contains("upstream disconnected"),
        "{}",
        proxy.log_tail()
    );
    for w in watchers {
        w.abort();
    }
}
