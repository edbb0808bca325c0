//! Consistent (linearizable) reads from the cache against the run's etcd (`ETCD_VERSION`).
//! 3.4.23 has etcd#15220: there the cache must stay correct, only slower; on fixed
//! versions the same reads wait for trusted progress answers instead.

use std::time::Duration;

use etcd_cache::{Error, GetOptions, ProgressTrust, ReadFallback, WatchOptions};
use testkit::{EtcdOptions, TcpProxy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_write_is_always_visible_to_the_next_consistent_get() {
    testkit::init_tracing();
    testkit::bounded(Duration::from_secs(120), async {
        let (_etcd, mut client, cache) = testkit::cache_on_etcd(|b| b.prefix("/c/")).await;
        // 3.4.23 has etcd#15220 and must be detected; fixed versions are trusted.
        let trusted = testkit::wait_for_version_verdict(&cache).await;
        let n = 2000;
        for i in 0..n {
            if i % 3 == 0 {
                // Outside the prefix: the revision moves while the prefix stays quiet.
                client
                    .put("/elsewhere", format!("{i}"), None)
                    .await
                    .unwrap();
            }
            let key = format!("/c/k{}", i % 10);
            let rev = client
                .put(key.clone(), format!("{i}"), None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
            if i % 4 == 1 {
                client.put("/elsewhere", "x", None).await.unwrap();
            }
            let got = cache.get(key.clone(), None).await.unwrap();
            assert!(
                got.revision() >= rev,
                "read at {} older than the write at {rev}",
                got.revision()
            );
            assert_eq!(got.kvs().len(), 1, "{key} missing at iteration {i}");
            assert_eq!(
                got.kvs()[0].value_str().unwrap(),
                i.to_string(),
                "stale read at iteration {i}"
            );
            assert_eq!(got.kvs()[0].mod_revision(), rev);
        }
        let stats = cache.stats();
        if !trusted {
            assert_eq!(
                stats.progress_requests, 0,
                "no RequestProgress to a server with etcd#15220"
            );
        }
        cache.close().await;
    })
    .await;
}

/// A consistent read at an older revision (inside the window) has etcd's header: at
/// least every revision committed before the call, also on a prefix whose revision
/// moves only by writes outside it; its data is the revision's. (Its header was the
/// cache's own revision, answered from the history at once: 8 < 64 on 3.4.23.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consistent_get_at_an_older_revision_has_a_header_at_least_every_earlier_write() {
    testkit::init_tracing();
    testkit::bounded(Duration::from_secs(120), async {
        let (_etcd, mut client, cache) = testkit::cache_on_etcd(|b| b.prefix("/r/")).await;
        let at = client
            .put("/r/a", "0", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        cache.wait_for_revision(at).await.unwrap();
        for i in 0..200 {
            // Outside the prefix, mostly: the cache's own revision stays behind.
            let key = if i % 10 == 9 { "/r/b" } else { "/elsewhere" };
            let written = client
                .put(key, format!("{i}"), None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
            let got = cache
                .get("/r/a", Some(GetOptions::new().with_revision(at)))
                .await
                .unwrap();
            let header = got.header().unwrap().revision();
            assert!(
                header >= written,
                "iteration {i}: header {header} below the write at {written} before the call"
            );
            assert_eq!(got.revision(), at);
            assert_eq!(got.kvs().len(), 1);
            assert_eq!(got.kvs()[0].value(), b"0");
            assert_eq!(got.kvs()[0].mod_revision(), at);
        }
        cache.close().await;
    })
    .await;
}

/// etcd#15220: on 3.4.23 the first `RequestProgress` after a watch resumed from an old
/// revision can report a revision ahead of queued events. Whatever the server says,
/// every revision the cache reports must match etcd's data at that revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumed_watch_never_reports_a_revision_it_has_not_applied() {
    testkit::init_tracing();
    testkit::bounded(Duration::from_secs(120), async {
        let (etcd, mut direct) = testkit::etcd_with_client(EtcdOptions::default()).await;
        let proxy = TcpProxy::start(etcd.client_addr()).await;
        let via_proxy = testkit::client(&[proxy.endpoint()]).await;
        let cache = testkit::ready_cache(via_proxy, |b| {
            b.prefix("/p/")
                .backoff(Duration::from_millis(10), Duration::from_millis(50))
                .progress_request_interval(Duration::from_millis(5))
        })
        .await;
        for round in 0..3 {
            // Cut the cache off, write a lot, let it resume from its old revision.
            proxy.set_refuse(true);
            proxy.drop_all_connections();
            for i in 0..2000 {
                direct
                    .put(format!("/p/k{}", i % 300), format!("{round}-{i}"), None)
                    .await
                    .unwrap();
            }
            let target = direct
                .get("/p/", None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
            proxy.set_refuse(false);
            // While it catches up, keep a read waiting (this is what makes a naive cache
            // send RequestProgress) and sample what the cache claims.
            let waiter = {
                let cache = cache.clone();
                tokio::spawn(async move {
                    cache
                        .get("/p/", Some(GetOptions::new().with_prefix()))
                        .await
                })
            };
            let mut last = 0;
            let mut samples = 0;
            while last < target {
                let got = cache
                    .get(
                        "/p/",
                        Some(GetOptions::new().with_prefix().with_serializable()),
                    )
                    .await
                    .unwrap();
                let rev = got.revision();
                assert!(rev >= last, "revision moved backwards: {last} -> {rev}");
                last = rev;
                if rev > 0 && samples % 7 == 0 {
                    let want = direct
                        .get(
                            "/p/",
                            Some(
                                etcd_client::GetOptions::new()
                                    .with_prefix()
                                    .with_revision(rev),
                            ),
                        )
                        .await
                        .unwrap();
                    let g: Vec<_> = got
                        .kvs()
                        .iter()
                        .map(|kv| (kv.key().to_vec(), kv.mod_revision()))
                        .collect();
                    let w: Vec<_> = want
                        .kvs()
                        .iter()
                        .map(|kv| (kv.key().to_vec(), kv.mod_revision()))
                        .collect();
                    assert_eq!(g, w, "the cache claims revision {rev} without its events");
                }
                samples += 1;
                tokio::task::yield_now().await;
            }
            let read = waiter.await.unwrap().unwrap();
            assert!(read.revision() >= target);
        }
        cache.close().await;
    })
    .await;
}

/// A read that etcd answers (here: the cache is reconnecting) is asked again when its
/// connection fails: a client channel that was reconnecting answers its first call with
/// the failure of its last connect (CI saw this break the test above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_etcd_answers_is_asked_again_when_its_connection_fails() {
    testkit::init_tracing();
    testkit::bounded(Duration::from_secs(60), async {
        let (etcd, mut direct) = testkit::etcd_with_client(EtcdOptions::default()).await;
        let rev = direct
            .put("/r/a", "1", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let proxy = TcpProxy::start(etcd.client_addr()).await;
        let via_proxy = testkit::client(&[proxy.endpoint()]).await;
        // A long backoff: once cut off, the follower makes no attempt during the test,
        // so every connection the proxy refuses is the read's.
        let cache = testkit::ready_cache(via_proxy, |b| {
            b.prefix("/r/")
                .backoff(Duration::from_secs(30), Duration::from_secs(30))
        })
        .await;
        proxy.set_refuse(true);
        proxy.drop_all_connections();
        let mut status = cache.status_stream();
        while let Some(s) = status.next().await {
            if matches!(s, etcd_cache::CacheStatus::Reconnecting { .. }) {
                break;
            }
        }
        let refused = proxy.refused();
        let read = {
            let cache = cache.clone();
            tokio::spawn(async move { cache.get("/r/a", None).await })
        };
        // The read's first connect is refused; then the proxy lets connections through.
        while proxy.refused() == refused {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        proxy.set_refuse(false);
        let got = read
            .await
            .unwrap()
            .expect("a read asked again after its connect was refused");
        assert_eq!(got.kvs()[0].value(), b"1");
        assert!(got.revision() >= rev);
        cache.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_requests_only_while_reads_wait() {
    testkit::init_tracing();
    testkit::bounded(Duration::from_secs(60), async {
        // Forced trust, so the requestor runs against the real server.
        let (_etcd, mut client, cache) = testkit::cache_on_etcd(|b| {
            b.prefix("/q/")
                .progress_trust(ProgressTrust::Always)
                .progress_request_interval(Duration::from_millis(20))
        })
        .await;
        client.put("/q/a", "1", None).await.unwrap();
        for _ in 0..20 {
            client.put("/outside", "x", None).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            cache.stats().progress_requests,
            0,
            "nothing waited, nothing was sent"
        );
        // A consistent read on the quiet prefix must wait for progress, then be served from memory.
        let got = cache.get("/q/a", None).await.unwrap();
        assert_eq!(got.kvs()[0].value(), b"1");
        let after_read = cache.stats();
        assert!(after_read.progress_requests >= 1);
        assert_eq!(after_read.fallback_reads, 0, "served from memory");
        // Many concurrent reads share requests.
        client.put("/outside", "y", None).await.unwrap();
        let reads: Vec<_> = (0..50)
            .map(|_| {
                let c = cache.clone();
                tokio::spawn(async move { c.get("/q/a", None).await.unwrap() })
            })
            .collect();
        for r in reads {
            r.await.unwrap();
        }
        let after_many = cache.stats().progress_requests;
        assert!(
            after_many - after_read.progress_requests < 50,
            "requests are coalesced"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            cache.stats().progress_requests,
            after_many,
            "no traffic once nothing waits"
        );
        cache.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_and_timeout_as_configured() {
    testkit::init_tracing();
    testkit::bounded(Duration::from_secs(60), async {
        let (_etcd, mut client) = testkit::etcd_with_client(EtcdOptions::default()).await;
        client.put("/t/a", "1", None).await.unwrap();
        let strict = testkit::ready_cache(client.clone(), |b| {
            b.prefix("/t/")
                .read_fallback(ReadFallback::Error)
                .consistent_read_timeout(Duration::from_millis(200))
        })
        .await;
        let lenient = testkit::ready_cache(client.clone(), |b| b.prefix("/t/")).await;
        let trusted = testkit::wait_for_version_verdict(&strict).await;
        assert_eq!(testkit::wait_for_version_verdict(&lenient).await, trusted);
        client
            .put("/outside", "moves the revision", None)
            .await
            .unwrap();
        match strict.get("/t/a", None).await {
            // A fixed server answers RequestProgress: the quiet prefix is proven current.
            Ok(got) if trusted => assert_eq!(got.kvs()[0].value(), b"1"),
            // 3.4.23: no trusted progress, a quiet prefix: the strict cache cannot prove it
            // is current.
            Err(Error::Timeout) if !trusted => {}
            other => panic!(
                "expected {}, got {other:?}",
                if trusted { "Ok" } else { "Timeout" }
            ),
        }
        // Serializable reads are still served.
        assert_eq!(
            strict
                .get("/t/a", Some(GetOptions::new().with_serializable()))
                .await
                .unwrap()
                .kvs()
                .len(),
            1
        );
        let got = lenient.get("/t/a", None).await.unwrap();
        assert_eq!(got.kvs()[0].value(), b"1");
        if trusted {
            assert_eq!(lenient.stats().fallback_reads, 0, "answered from memory");
        } else {
            assert!(lenient.stats().fallback_reads >= 1, "answered by etcd");
        }
        strict.close().await;
        lenient.close().await;
    })
    .await;
}

/// Per-watch periodic progress notifications travel in order with the events and are
/// trusted on every version: with the server flag set, even the strict cache serves
/// consistent reads on a quiet prefix from memory, and local progress responses flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_progress_serves_reads_on_buggy_servers() {
    testkit::init_tracing();
    testkit::bounded(Duration::from_secs(60), async {
        let (_etcd, mut client) = testkit::etcd_with_client(
            EtcdOptions::default().progress_notify_interval(Duration::from_millis(100)),
        )
        .await;
        client.put("/s/a", "1", None).await.unwrap();
        let cache = testkit::ready_cache(client.clone(), |b| {
            b.prefix("/s/")
                .read_fallback(ReadFallback::Error)
                .progress_notify_interval(Duration::from_millis(50))
        })
        .await;
        let mut w = cache
            .watch(
                "/s/",
                Some(WatchOptions::new().with_prefix().with_progress_notify()),
            )
            .await
            .unwrap();
        assert!(w.message().await.unwrap().unwrap().created());
        let rev = client
            .put("/outside", "x", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let got = cache.get("/s/a", None).await.unwrap();
        assert!(got.revision() >= rev);
        assert_eq!(cache.stats().fallback_reads, 0);
        // A progress response at or past `rev` arrives, with no events.
        loop {
            let r = w.message().await.unwrap().unwrap();
            assert!(r.events().is_empty(), "no events were written in /s/");
            if r.is_progress_notify() && r.revision() >= rev {
                break;
            }
        }
        w.request_progress().await.unwrap();
        let r = w.message().await.unwrap().unwrap();
        assert!(r.is_progress_notify() && r.revision() >= rev);
        cache.close().await;
    })
    .await;
}

/// A whole-keyspace cache: every range form with an empty key answers right after each
/// write, whether memory or etcd answers it (on 3.4.23, etcd answers whenever the cache
/// has not applied the write yet; the key such a fallback sends is pinned down by the
/// unit test `fallback_reads_send_the_range_start`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_reads_of_every_range_form_on_a_whole_keyspace_cache() {
    testkit::init_tracing();
    testkit::bounded(Duration::from_secs(60), async {
        let (_etcd, mut client, cache) = testkit::cache_on_etcd(|b| b).await;
        for i in 1..=300i64 {
            client.put(format!("k{i:03}"), "v", None).await.unwrap();
            let all = cache
                .get("", Some(GetOptions::new().with_prefix().with_count_only()))
                .await
                .unwrap();
            assert_eq!(all.count(), i, "prefix read after write {i}");
            let from = cache
                .get("", Some(GetOptions::new().with_from_key().with_keys_only()))
                .await
                .unwrap();
            assert_eq!(from.kvs().len() as i64, i);
            let every = cache
                .get("k", Some(GetOptions::new().with_all_keys().with_limit(1)))
                .await
                .unwrap();
            assert_eq!((every.count(), every.kvs()[0].key()), (i, &b"k001"[..]));
        }
        cache.close().await;
    })
    .await;
}
