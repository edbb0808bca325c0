//! Recovery against real etcd: a restart in the middle of a write burst, and member
//! failover in a three-member cluster. Every subscriber must see exactly etcd's history.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_cache::{WatchOptions, WatchStream};
use etcd_client::Client;
use testkit::{EtcdCluster, EtcdOptions, TcpProxy};

/// Every revision (with its keys) of `prefix` in `(from, to]`, from a direct etcd watch.
/// `to` must be the revision of an event in `prefix` (the writers only write there).
async fn truth(client: &Client, prefix: &str, from: i64, to: i64) -> Vec<(i64, Vec<String>)> {
    if to <= from {
        return Vec::new();
    }
    let mut w = client
        .watch_client()
        .watch(
            prefix,
            Some(
                etcd_client::WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(from + 1),
            ),
        )
        .await
        .unwrap();
    let mut out: Vec<(i64, Vec<String>)> = Vec::new();
    while out.last().is_none_or(|(r, _)| *r < to) {
        let resp = tokio::time::timeout(Duration::from_secs(20), w.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        for ev in resp.events() {
            let kv = ev.kv().unwrap();
            let rev = kv.mod_revision();
            if rev > to {
                break;
            }
            match out.last_mut() {
                Some((r, keys)) if *r == rev => keys.push(kv.key_str().unwrap().to_owned()),
                _ => out.push((rev, vec![kv.key_str().unwrap().to_owned()])),
            }
        }
    }
    out
}

/// Reads a stream until it has delivered revision `to`.
async fn collect(s: &mut WatchStream, to: i64) -> Vec<(i64, Vec<String>)> {
    let mut out = Vec::new();
    while out.last().is_none_or(|(r, _)| *r < to) {
        let r = tokio::time::timeout(Duration::from_secs(60), s.message())
            .await
            .expect("subscriber stalled")
            .expect("stream error")
            .expect("stream ended");
        if r.events().is_empty() {
            continue;
        }
        let keys = r
            .events()
            .iter()
            .map(|e| e.kv().unwrap().key_str().unwrap().to_owned())
            .collect();
        out.push((r.revision(), keys));
    }
    out
}

/// Every subscriber delivered exactly etcd's history of `prefix` in `(start, end]`.
async fn each_matches_etcd(
    client: &Client,
    prefix: &str,
    start: i64,
    end: i64,
    subs: &mut [WatchStream],
) {
    let want = truth(client, prefix, start, end).await;
    assert!(!want.is_empty(), "the writers wrote nothing in {prefix}");
    let last = want.last().expect("non-empty").0;
    for s in subs {
        assert_eq!(
            collect(s, last).await,
            want,
            "a subscriber's history differs from etcd's"
        );
    }
}

/// Writes puts in a loop until stopped, retrying through failures.
fn writer(
    client: Client,
    prefix: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut c = client;
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let put = c.put(format!("{prefix}k{}", n % 50), format!("{n}"), None);
            match tokio::time::timeout(Duration::from_secs(2), put).await {
                Ok(Ok(_)) => n += 1,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        n
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restart_mid_burst_no_gap_no_duplicate() {
    testkit::init_tracing();
    testkit::bounded(Duration::from_secs(120), async {
        let (mut etcd, client, cache) = testkit::cache_on_etcd(|b| {
            b.prefix("/r/")
                .backoff(Duration::from_millis(20), Duration::from_millis(200))
                .subscriber_buffer(4)
        })
        .await;
        let start = cache.revision();
        let mut subs = Vec::new();
        for i in 0..20 {
            let opts = if i % 2 == 0 {
                WatchOptions::new().with_prefix()
            } else {
                WatchOptions::new().with_prefix().with_prev_key()
            };
            subs.push(cache.watch("/r/", Some(opts)).await.unwrap());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let w = writer(client.clone(), "/r/", stop.clone());
        tokio::time::sleep(Duration::from_millis(300)).await;
        etcd = testkit::blocking(move || {
            etcd.kill();
            std::thread::sleep(Duration::from_millis(300));
            etcd.restart();
            etcd
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::Relaxed);
        let written = w.await.unwrap();
        assert!(written > 0);
        let mut c = testkit::client(&[etcd.endpoint()]).await;
        let end = c
            .get("/r/", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        cache.wait_ready().await.unwrap();
        tokio::time::timeout(Duration::from_secs(30), cache.wait_for_revision(end))
            .await
            .ok();
        each_matches_etcd(&c, "/r/", start, end, &mut subs).await;
        assert!(cache.stats().connects >= 2, "the cache reconnected");
        cache.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_member_and_leader_failover() {
    testkit::init_tracing();
    testkit::bounded(Duration::from_secs(150), async {
        let mut cluster = testkit::blocking(EtcdCluster::start).await;
        let endpoints = cluster.endpoints();
        // The cache talks to member 0 first; the writers to all of them.
        let cache_client = testkit::client(&endpoints).await;
        let writer_client = testkit::client(&endpoints).await;
        let cache = testkit::ready_cache(cache_client, |b| {
            b.prefix("/f/")
                .backoff(Duration::from_millis(20), Duration::from_millis(300))
        })
        .await;
        let start = cache.revision();
        let mut subs = Vec::new();
        for _ in 0..10 {
            subs.push(
                cache
                    .watch("/f/", Some(WatchOptions::new().with_prefix()))
                    .await
                    .unwrap(),
            );
        }
        let stop = Arc::new(AtomicBool::new(false));
        let w = writer(writer_client.clone(), "/f/", stop.clone());
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Kill members one at a time (keeping quorum), the leader among them, then restart.
        for round in 0..2 {
            cluster = testkit::blocking(move || {
                let victim = if round == 0 { 0 } else { cluster.leader() };
                cluster.kill(victim);
                std::thread::sleep(Duration::from_millis(800));
                cluster.restart(victim);
                cluster
            })
            .await;
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        stop.store(true, Ordering::Relaxed);
        assert!(w.await.unwrap() > 0);
        let mut c = testkit::client(&cluster.endpoints()).await;
        let end = c
            .get("/f/", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        each_matches_etcd(&c, "/f/", start, end, &mut subs).await;
        cache.close().await;
    })
    .await;
}

/// Compaction while the cache is cut off: it must re-list. Subscribers that may have
/// missed events get `Compacted`; those that provably missed nothing continue.
/// A ready cache of `prefix` that reaches `etcd` through a TCP proxy (to cut it), with a
/// short reconnect backoff.
async fn cache_behind_a_cut(
    etcd: &testkit::EtcdServer,
    prefix: &str,
) -> (TcpProxy, etcd_cache::Cache) {
    let proxy = TcpProxy::start(etcd.client_addr()).await;
    let via_proxy = testkit::client(&[proxy.endpoint()]).await;
    let cache = testkit::ready_cache(via_proxy, |b| {
        b.prefix(prefix)
            .backoff(Duration::from_millis(20), Duration::from_millis(100))
    })
    .await;
    (proxy, cache)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_while_disconnected_relists() {
    testkit::init_tracing();
    testkit::bounded(Duration::from_secs(90), async {
        let (etcd, mut direct) = testkit::etcd_with_client(EtcdOptions::default()).await;
        direct.put("/c/stable", "s", None).await.unwrap();
        direct.put("/c/changes", "1", None).await.unwrap();
        let (proxy, cache) = cache_behind_a_cut(&etcd, "/c/").await;
        let before = cache.revision();
        let mut prefix = cache
            .watch("/c/", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        let mut stable = cache.watch("/c/stable", None).await.unwrap();
        let mut changed = cache.watch("/c/changes", None).await.unwrap();
        let mut absent = cache.watch("/c/absent", None).await.unwrap();
        let mut future = cache
            .watch(
                "/c/",
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(before + 1000),
                ),
            )
            .await
            .unwrap();
        for s in [
            &mut prefix,
            &mut stable,
            &mut changed,
            &mut absent,
            &mut future,
        ] {
            assert!(s.message().await.unwrap().unwrap().created());
        }
        proxy.set_refuse(true);
        proxy.drop_all_connections();
        direct.put("/c/changes", "2", None).await.unwrap();
        direct.put("/c/absent", "x", None).await.unwrap();
        direct.delete("/c/absent", None).await.unwrap();
        let gap_end = direct
            .put("/other", "x", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        direct.compact(gap_end, None).await.unwrap();
        proxy.set_refuse(false);
        for s in [&mut prefix, &mut changed, &mut absent] {
            match tokio::time::timeout(Duration::from_secs(30), s.message())
                .await
                .unwrap()
            {
                // As etcd signals it: canceled, with the compact revision and a reason.
                Ok(Some(r)) if r.canceled() && r.compact_revision() > 0 => {
                    assert!(r.compact_revision() > gap_end);
                    assert!(!r.cancel_reason().is_empty());
                }
                other => panic!("expected a canceled response, got {other:?}"),
            }
            assert!(s.message().await.unwrap().is_none());
        }
        assert_eq!(cache.stats().lists, 2, "re-listed once");
        let got = cache.get("/c/changes", None).await.unwrap();
        assert_eq!(got.kvs()[0].value(), b"2", "the store holds the new state");
        assert!(cache.get("/c/absent", None).await.unwrap().kvs().is_empty());
        // The unchanged key's subscriber continues without a gap.
        let r = direct
            .put("/c/stable", "t", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let resp = loop {
            let resp = tokio::time::timeout(Duration::from_secs(30), stable.message())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            if !resp.events().is_empty() {
                break resp;
            }
        };
        assert_eq!(resp.revision(), r);
        // The future subscriber still waits for its revision.
        assert!(
            tokio::time::timeout(Duration::from_millis(200), future.message())
                .await
                .is_err()
        );
        cache.close().await;
    })
    .await;
}

/// Puts `keys` keys of `value_bytes` each under `prefix`, `per_txn` to a txn; returns
/// each txn's revision with its keys (what a watch of the prefix must deliver).
async fn put_large(
    client: &Client,
    prefix: &str,
    keys: usize,
    value_bytes: usize,
    per_txn: usize,
) -> Vec<(i64, Vec<String>)> {
    let value = vec![b'v'; value_bytes];
    let mut kv = client.kv_client();
    let mut written = Vec::new();
    for start in (0..keys).step_by(per_txn) {
        let names: Vec<String> = (start..(start + per_txn).min(keys))
            .map(|i| format!("{prefix}{i:06}"))
            .collect();
        let ops: Vec<etcd_client::TxnOp> = names
            .iter()
            .map(|k| etcd_client::TxnOp::put(k.as_str(), value.clone(), None))
            .collect();
        let resp = kv.txn(etcd_client::Txn::new().and_then(ops)).await.unwrap();
        written.push((resp.header().unwrap().revision(), names));
    }
    written
}

/// A page of the cache's list larger than tonic's default limit of 4 MiB (1,000 keys of
/// 5 KiB, Kubernetes Pods' size) is taken: the cache loads with its default page size,
/// as etcd's Go client would read it (it takes up to 2 GiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_page_over_4_mib_loads() {
    testkit::init_tracing();
    testkit::bounded(Duration::from_secs(120), async {
        let (_etcd, client) = testkit::etcd_with_client(EtcdOptions::default()).await;
        put_large(&client, "/big/", 1_100, 5 * 1024, 100).await;
        let cache = testkit::ready_cache(client, |b| b.prefix("/big/")).await;
        let all = cache
            .get("/big/", Some(etcd_cache::GetOptions::new().with_prefix()))
            .await
            .unwrap();
        assert_eq!(all.kvs().len(), 1_100);
        assert!(all.kvs().iter().all(|kv| kv.value().len() == 5 * 1024));
        assert_eq!(cache.stats().lists, 1);
        cache.close().await;
    })
    .await;
}

/// A resume whose catch-up is one response over 4 MiB (etcd sends up to 1,000 revisions
/// of events to a watch that is behind in one message): the cache takes it, without a
/// re-list, and its subscriber gets every revision once and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_whose_catch_up_is_over_4_mib_delivers_it() {
    testkit::init_tracing();
    testkit::bounded(Duration::from_secs(120), async {
        let (etcd, direct) = testkit::etcd_with_client(EtcdOptions::default()).await;
        let (proxy, cache) = cache_behind_a_cut(&etcd, "/r/").await;
        let mut sub = cache
            .watch("/r/", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        assert!(sub.message().await.unwrap().unwrap().created());
        proxy.set_refuse(true);
        proxy.drop_all_connections();
        // 6 revisions of 100 keys of 10 KiB: about 6 MiB that etcd sends in one response.
        // (Not compared with `truth`: its plain etcd-client watch takes 4 MiB at most.)
        let want = put_large(&direct, "/r/", 600, 10 * 1024, 100).await;
        proxy.set_refuse(false);
        let end = want.last().unwrap().0;
        assert_eq!(collect(&mut sub, end).await, want);
        assert_eq!(cache.stats().lists, 1, "resumed, not listed again");
        cache.close().await;
    })
    .await;
}
