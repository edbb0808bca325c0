//! Operating the cache against a real etcd: the consistency check finds a store
//! corrupted behind etcd's back and repairs it without ending any subscriber, and never
//! reports a mismatch on a healthy cache under writes.

use std::time::Duration;

use etcd_cache::{GetOptions, KeyValue, WatchOptions};

const LIMIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consistency_check_repairs_a_corrupted_store() {
    testkit::init_tracing();
    testkit::bounded(LIMIT, async {
        let (_etcd, mut client, cache) = testkit::cache_on_etcd(|b| {
            b.prefix("/app/")
                .page_size(7)
                .consistency_check(Duration::from_millis(300))
        })
        .await;
        let mut last = 0;
        for i in 0..40 {
            last = client
                .put(format!("/app/k{i:02}"), format!("v{i}"), None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
        }
        cache.wait_for_revision(last).await.unwrap();
        let mut w = cache
            .watch("/app/", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        assert!(w.message().await.unwrap().unwrap().created());
        // A healthy cache passes its checks.
        while cache.stats().consistency_checks < 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(cache.stats().consistency_mismatches, 0);

        // A bug writes a wrong value into the store.
        cache.corrupt_store_for_test(KeyValue::new("/app/k07", "wrong", 2, 999, 9, 0));
        let serializable = || GetOptions::new().with_serializable();
        while cache.stats().consistency_mismatches == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        loop {
            let r = cache.get("/app/k07", Some(serializable())).await.unwrap();
            if r.kvs()[0].value() == b"v7" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The subscriber continues: the next write arrives, no compaction signal.
        let rev = client
            .put("/app/after", "1", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let r = w.message().await.unwrap().unwrap();
        assert!(!r.canceled(), "{r:?}");
        assert_eq!(r.events()[0].revision(), rev);
        // And the repaired cache equals etcd everywhere.
        let ours = cache
            .get("/app/", Some(GetOptions::new().with_prefix()))
            .await
            .unwrap();
        let theirs = client
            .get("/app/", Some(etcd_client::GetOptions::new().with_prefix()))
            .await
            .unwrap();
        let ours: Vec<_> = ours
            .kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.mod_revision()))
            .collect();
        let theirs: Vec<_> = theirs
            .kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.mod_revision()))
            .collect();
        assert_eq!(ours, theirs);
        let before = cache.stats().consistency_mismatches;
        let checks = cache.stats().consistency_checks;
        while cache.stats().consistency_checks < checks + 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            cache.stats().consistency_mismatches,
            before,
            "repaired for good"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_cache_under_writes_never_reports_a_mismatch() {
    testkit::init_tracing();
    testkit::bounded(LIMIT, async {
        let (_etcd, mut client, cache) = testkit::cache_on_etcd(|b| {
            b.prefix("/app/")
                .page_size(5)
                .consistency_check(Duration::from_millis(100))
        })
        .await;
        let writes = tokio::spawn(async move {
            for i in 0..600u32 {
                let key = format!("/app/k{}", i % 37);
                if i % 5 == 4 {
                    client.delete(key, None).await.unwrap();
                } else {
                    client.put(key, format!("v{i}"), None).await.unwrap();
                }
                client.put(format!("/other/{i}"), "x", None).await.unwrap();
            }
        });
        while !writes.is_finished() || cache.stats().consistency_checks < 10 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        writes.await.unwrap();
        let s = cache.stats();
        assert!(s.consistency_checks >= 10, "{s:?}");
        assert_eq!(s.consistency_mismatches, 0, "{s:?}");
    })
    .await;
}
