//! What the proxy costs etcd beyond the cache's one list and one watch, counted by
//! etcd's own `grpc_server_started_total`: a watch from the revision right after the
//! cache's asks etcd nothing, and a proxy that stops lists nothing and opens no watch.
//! (`--auth-check-interval 1h`: the auth probe, one Range per interval while auth is
//! off, stays out of the counts.)

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use etcd_client::WatchOptions;
use support::scrape::http_get;
use support::{client, start_etcd, start_proxy, EtcdOptions};

/// How many calls of `method` etcd has started (`grpc_server_started_total`, every
/// service and type).
fn started(etcd: SocketAddr, method: &str) -> f64 {
    let (status, _, body) = http_get(etcd, "/metrics");
    assert_eq!(status, 200, "{body}");
    let label = format!("grpc_method=\"{method}\"");
    body.lines()
        .filter(|l| l.starts_with("grpc_server_started_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .sum()
}

fn addr(url: &str) -> SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

fn flags() -> Vec<String> {
    ["--prefix", "/k/", "--auth-check-interval", "1h"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_the_caches_next_revision_asks_etcd_nothing() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let mut direct = client(&etcd.endpoint()).await;
    for i in 0..5 {
        direct.put(format!("/k/{i}"), "v", None).await.unwrap();
    }
    let proxy = start_proxy(etcd.endpoint(), flags()).await;
    let mut via = client(&proxy.endpoint()).await;
    // A list through the proxy, as a watch cache starts: its revision is the cache's.
    let listed = via
        .get("/k/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(listed.kvs().len(), 5);
    let rev = listed.header().unwrap().revision();
    let ranges = started(addr(&etcd.endpoint()), "Range");
    let mut w = via
        .watch(
            "/k/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(rev + 1),
            ),
        )
        .await
        .unwrap();
    let created = w.message().await.unwrap().unwrap();
    assert!(created.created() && !created.canceled(), "{created:?}");
    direct.put("/k/new", "v", None).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(15), w.message())
        .await
        .expect("the event within 15 s")
        .unwrap()
        .unwrap();
    assert_eq!(r.events()[0].kv().unwrap().key(), b"/k/new");
    assert_eq!(r.events()[0].kv().unwrap().mod_revision(), rev + 1);
    let after = started(addr(&etcd.endpoint()), "Range");
    assert_eq!(
        after - ranges,
        0.0,
        "a watch from the cache's revision + 1 cost etcd {} Range(s)",
        after - ranges
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_proxy_lists_nothing_and_opens_no_watch() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let mut direct = client(&etcd.endpoint()).await;
    direct.put("/k/a", "v", None).await.unwrap();
    let mut proxy = start_proxy(etcd.endpoint(), flags()).await;
    let mut via = client(&proxy.endpoint()).await;
    let mut w = via
        .watch("/k/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(w.message().await.unwrap().unwrap().created());
    let etcd_addr = addr(&etcd.endpoint());
    let (ranges, watches) = (started(etcd_addr, "Range"), started(etcd_addr, "Watch"));
    let status = tokio::task::spawn_blocking(move || {
        let s = proxy.terminate(Duration::from_secs(30));
        (s, proxy.log_text())
    })
    .await
    .unwrap();
    assert!(
        status.0.is_some_and(|s| s.success()),
        "{:?}\n{}",
        status.0,
        status.1
    );
    let (ranges_after, watches_after) = (started(etcd_addr, "Range"), started(etcd_addr, "Watch"));
    assert_eq!(
        (ranges_after - ranges, watches_after - watches),
        (0.0, 0.0),
        "a stopping proxy listed or watched etcd again; its log:\n{}",
        status.1
    );
    assert!(!status.1.contains("cache built again"), "{}", status.1);
}
