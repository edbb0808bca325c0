//! Proxies in tiers (issue 20): `etcd → A → B → clients`, B's cache following A exactly
//! as it follows etcd (list, watch, progress requests, consistent reads, the version
//! check, which reaches etcd through A). What B's clients get must be what etcd gives:
//! every event once, in order, across a restart of A; and a consistent read through B
//! sees every write completed before it, as etcd's linearizable read does.

mod support;

use std::time::Duration;

use etcd_client::{GetOptions, WatchOptions};
use support::{client, EtcdOptions, EtcdServer, Proxy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_tier_serves_what_etcd_gives() {
    let etcd = EtcdServer::start_with(EtcdOptions::default());
    let mut direct = client(&etcd.endpoint()).await;
    let mut a = Proxy::start(&etcd.endpoint(), &[]);
    let b = Proxy::start(&a.endpoint(), &[]);
    let mut via_b = client(&b.endpoint()).await;
    let mut stream = via_b
        .watch(
            "/t/",
            Some(WatchOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .unwrap();
    assert!(stream.message().await.unwrap().unwrap().created());
    let mut written = Vec::new();
    // Read-your-writes through two proxies: each write is seen by a consistent read
    // through B made after it completed.
    for i in 0..30 {
        let value = format!("v{i}");
        let put = direct
            .put(format!("/t/{}", i % 4), value.clone(), None)
            .await
            .unwrap();
        let revision = put.header().unwrap().revision();
        written.push(revision);
        let got = via_b.get(format!("/t/{}", i % 4), None).await.unwrap();
        assert!(
            got.header().unwrap().revision() >= revision,
            "a consistent read through B below a completed write: {} < {revision}",
            got.header().unwrap().revision()
        );
        assert_eq!(
            got.kvs()[0].value(),
            value.as_bytes(),
            "stale read through B"
        );
    }
    // A restarts (its cache starts again from a new list); writes go on meanwhile.
    a.kill();
    for i in 0..20 {
        let put = direct
            .put(format!("/t/{}", i % 4), "w", None)
            .await
            .unwrap();
        written.push(put.header().unwrap().revision());
    }
    a.start_again();
    for i in 0..10 {
        let put = direct
            .put(format!("/t/{}", i % 4), "x", None)
            .await
            .unwrap();
        written.push(put.header().unwrap().revision());
    }
    // B's clients get every event once, in order, with prev_kv (B resumed its own
    // watch on A from its last revision, its clients' streams never broke).
    let mut seen = Vec::new();
    while seen.len() < written.len() {
        let r = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .expect("B's watch stalled")
            .unwrap()
            .expect("B's stream ended");
        assert!(!r.canceled(), "canceled: {}", r.cancel_reason());
        for e in r.events() {
            seen.push(e.kv().unwrap().mod_revision());
            let first_of_key = e.kv().unwrap().version() == 1;
            assert!(
                first_of_key || e.prev_kv().is_some(),
                "prev_kv missing at {}",
                seen.last().unwrap()
            );
        }
    }
    assert_eq!(
        seen, written,
        "every event once, in order, through two tiers"
    );
    // And a read through B at the end is etcd's.
    let opts = || Some(GetOptions::new().with_prefix());
    let want = direct.get("/t/", opts()).await.unwrap();
    let got = via_b.get("/t/", opts()).await.unwrap();
    let kvs = |r: &etcd_client::GetResponse| {
        r.kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.mod_revision()))
            .collect::<Vec<_>>()
    };
    assert_eq!(kvs(&got), kvs(&want));
}
