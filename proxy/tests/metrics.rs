//! `--metrics-addr`: the cache's and the proxy's metrics, scraped over plain HTTP from a
//! running proxy after puts, reads and watches through it with etcd-client.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use etcd_client::{GetOptions, WatchOptions, WatchResponse, WatchStream};
use support::scrape::{http_get, scrape_until};
use support::{client, free_port, start_etcd, start_proxy, EtcdOptions};

const WAIT: Duration = Duration::from_secs(10);
/// The per-connection cap the proxy runs with.
const CAP: usize = 3;

async fn message(s: &mut WatchStream) -> WatchResponse {
    tokio::time::timeout(WAIT, s.message())
        .await
        .expect("no watch response in time")
        .expect("watch error")
        .expect("watch stream ended")
}

/// Reads until an event at `rev` arrived.
async fn until_revision(s: &mut WatchStream, rev: i64) {
    loop {
        let r = message(s).await;
        assert!(!r.canceled(), "canceled: {}", r.cancel_reason());
        if r.events()
            .iter()
            .any(|e| e.kv().unwrap().mod_revision() >= rev)
        {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_serves_the_caches_and_the_proxys_metrics() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let maddr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let cap = CAP.to_string();
    let proxy = start_proxy(
        etcd.endpoint(),
        vec![
            "--prefix".into(),
            "/m/".into(),
            "--metrics-addr".into(),
            maddr.to_string(),
            "--max-watches-per-connection".into(),
            cap,
        ],
    )
    .await;
    assert!(
        proxy
            .log_text()
            .contains(&format!("serving metrics at http://{maddr}/metrics")),
        "{}",
        proxy.log_tail()
    );

    // Writes and reads on one connection.
    let mut kv = client(&proxy.endpoint()).await;
    const PUTS: usize = 10;
    for i in 0..PUTS {
        kv.put(format!("/m/k{i}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    for _ in 0..3 {
        let r = kv
            .get("/m/", Some(GetOptions::new().with_prefix()))
            .await
            .unwrap();
        assert_eq!(r.count(), PUTS as i64);
    }
    kv.get("/elsewhere", None).await.unwrap();

    // CAP watches on another connection, each on its own stream; one more is refused.
    let mut w = client(&proxy.endpoint()).await;
    let mut held = Vec::new();
    for _ in 0..CAP {
        let mut s = w
            .watch("/m/", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        let r = message(&mut s).await;
        assert!(r.created() && !r.canceled(), "{r:?}");
        held.push(s);
    }
    let mut refused = w.watch("/m/k1", None).await.unwrap();
    let r = message(&mut refused).await;
    assert!(r.created() && r.canceled(), "{r:?}");
    assert_eq!(
        r.cancel_reason(),
        format!("ETCD_WATCH_LIMIT: at most {CAP} watches are allowed per connection")
    );
    // A watch outside the cached prefix, on a third connection: forwarded to etcd.
    let mut f = client(&proxy.endpoint()).await;
    let mut forwarded = f
        .watch("/elsewhere/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(message(&mut forwarded).await.created());

    // Two more puts, delivered to every watch.
    let mut last = 0;
    for i in 0..2 {
        last = kv
            .put(format!("/m/late{i}"), "x", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
    }
    kv.put("/elsewhere/x", "y", None).await.unwrap();
    for s in &mut held {
        until_revision(s, last).await;
    }
    assert!(!message(&mut forwarded).await.events().is_empty());

    let cache = [("cache", "/m/")];
    let s = scrape_until(maddr, "3 open cache watches", |s| {
        s.get("etcd_cache_watchers", &cache) == Some(CAP as f64)
            && s.get("etcd_cache_proxy_watches", &[("served", "etcd")]) == Some(1.0)
    })
    .await;
    println!("--- scrape ---\n{}", s.text);
    // The cache's metrics.
    assert!(s.value("etcd_cache_upstream_events_total", &cache) >= (PUTS + 2) as f64);
    assert!(s.value("etcd_cache_revision", &cache) >= last as f64);
    assert_eq!(s.value("etcd_cache_store_keys", &cache), (PUTS + 2) as f64);
    assert_eq!(
        s.value("etcd_cache_watches_opened_total", &cache),
        CAP as f64
    );
    assert_eq!(
        s.value(
            "etcd_cache_watches_refused_total",
            &[("cache", "/m/"), ("reason", "limit")]
        ),
        1.0
    );
    assert!(s.value("etcd_cache_deliveries_total", &cache) >= (2 * CAP) as f64);
    assert!(s.value("etcd_cache_watch_creation_seconds_count", &cache) >= CAP as f64);
    assert!(s
        .text
        .contains("etcd_cache_watch_creation_seconds_bucket{cache=\"/m/\",le=\"+Inf\"}"));
    assert_eq!(s.value("etcd_cache_upstream_connects_total", &cache), 1.0);
    // The proxy's.
    assert_eq!(
        s.value("etcd_cache_proxy_watches", &[("served", "cache")]),
        CAP as f64
    );
    assert_eq!(
        s.value(
            "etcd_cache_proxy_watches_created_total",
            &[("served", "cache")]
        ),
        CAP as f64
    );
    assert_eq!(
        s.value(
            "etcd_cache_proxy_watches_created_total",
            &[("served", "etcd")]
        ),
        1.0
    );
    assert_eq!(
        s.value(
            "etcd_cache_proxy_watches_refused_total",
            &[("reason", "connection_limit")]
        ),
        1.0
    );
    assert_eq!(
        s.value(
            "etcd_cache_proxy_watches_refused_total",
            &[("reason", "invalid")]
        ),
        0.0
    );
    // Every Watch stream is still open: CAP, the refused one's, the forwarded one's.
    assert_eq!(
        s.value("etcd_cache_proxy_watch_streams", &[]),
        (CAP + 2) as f64
    );
    assert_eq!(
        s.value(
            "etcd_cache_proxy_grpc_started_total",
            &[("service", "etcdserverpb.Watch"), ("method", "Watch")]
        ),
        (CAP + 2) as f64
    );
    assert_eq!(
        s.value(
            "etcd_cache_proxy_grpc_handled_total",
            &[
                ("service", "etcdserverpb.KV"),
                ("method", "Put"),
                ("code", "OK")
            ]
        ),
        (PUTS + 3) as f64
    );
    assert_eq!(
        s.value("etcd_cache_proxy_ranges_total", &[("served", "cache")]),
        3.0
    );
    // The probe read of each `client()` and the read of /elsewhere.
    assert!(s.value("etcd_cache_proxy_ranges_total", &[("served", "etcd")]) >= 4.0);
    assert!(s.value("etcd_cache_proxy_connections", &[]) >= 3.0);
    assert!(
        s.value(
            "etcd_cache_proxy_sent_bytes_total",
            &[("service", "etcdserverpb.Watch")]
        ) > 0.0
    );
    assert!(s.text.contains("# TYPE etcd_cache_proxy_watches gauge"));
    assert!(s
        .text
        .contains("# HELP etcd_cache_proxy_watches_refused_total"));

    // Cancelling a watch frees a slot: the cache's and the proxy's gauges follow.
    let mut first = held.remove(0);
    let id = message_id(&mut first, &mut w).await;
    first.cancel(id).await.unwrap();
    loop {
        let r = message(&mut first).await;
        if r.canceled() {
            break;
        }
    }
    // The cache samples `etcd_cache_watchers` when it applies a revision (not when a
    // watch opens or ends), so a write makes it current; the proxy's gauge is at once.
    kv.put("/m/after-cancel", "x", None).await.unwrap();
    scrape_until(maddr, "2 open watches after a cancel", |s| {
        s.get("etcd_cache_watchers", &cache) == Some((CAP - 1) as f64)
            && s.get("etcd_cache_proxy_watches", &[("served", "cache")]) == Some((CAP - 1) as f64)
            && s.get(
                "etcd_cache_watches_ended_total",
                &[("cache", "/m/"), ("reason", "canceled")],
            ) == Some(1.0)
    })
    .await;
    let mut again = w.watch("/m/k2", None).await.unwrap();
    let r = message(&mut again).await;
    assert!(r.created() && !r.canceled(), "{r:?}");

    // A stream the client drops ends as Canceled; the forwarded watch's gauge goes back.
    // The cache's watcher gauge is set when it applies a revision: the put's.
    drop(forwarded);
    kv.put("/m/after-drop", "x", None).await.unwrap();
    scrape_until(maddr, "the dropped stream", |s| {
        s.get("etcd_cache_watchers", &cache) == Some(CAP as f64)
            && s.get("etcd_cache_proxy_watches", &[("served", "etcd")]) == Some(0.0)
            && s.get(
                "etcd_cache_proxy_grpc_handled_total",
                &[
                    ("service", "etcdserverpb.Watch"),
                    ("method", "Watch"),
                    ("code", "Canceled"),
                ],
            ) == Some(1.0)
    })
    .await;

    // Only /metrics is served.
    let (status, _, _) = tokio::task::spawn_blocking(move || http_get(maddr, "/"))
        .await
        .unwrap();
    assert_eq!(status, 404);
    drop((held, refused, again, w, f, kv));
    drop(proxy);
}

/// The id of the watch on `s`: its first event response after one more put.
async fn message_id(s: &mut WatchStream, c: &mut etcd_client::Client) -> i64 {
    let rev = c
        .put("/m/id", "x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    loop {
        let r = message(s).await;
        if r.events()
            .iter()
            .any(|e| e.kv().unwrap().mod_revision() >= rev)
        {
            return r.watch_id();
        }
    }
}
