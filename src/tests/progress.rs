//! Progress trust by server version, the progress requestor, consistent reads and
//! local progress responses.

use std::time::Duration;

use tokio::time::{advance, Instant};
use tokio_test::{assert_pending, assert_ready, task};

use super::*;
use crate::config::{ProgressTrust, ReadFallback};
use crate::read::GetOptions;
use crate::upstream::fake::put;
use crate::watch::WatchOptions;

/// 6. A `RequestProgress` answer moves the cache only on fixed servers; per-watch
/// periodic notifications move it everywhere.
#[tokio::test(start_paused = true)]
async fn requested_progress_is_trusted_only_on_fixed_versions() {
    let cases: &[(&[&str], bool)] = &[
        (&["3.4.23"], false),
        (&["3.5.12"], false),
        (&["3.5.13", "3.4.23"], false),
        (&["3.5.13", "unreachable:http://10.0.0.9:2379"], false),
        (&[], false),
        (&["3.4.31"], true),
        (&["3.5.13"], true),
        (&["3.6.0"], true),
        (&["3.5.13", "3.4.31", "3.6.2"], true),
    ];
    for &(versions, trusted) in cases {
        let h = ready(config(), versions, &[], 10).await;
        h.watch.progress(15, true);
        settle().await;
        let want = if trusted { 15 } else { 10 };
        assert_eq!(
            h.cache.revision(),
            want,
            "requested progress on {versions:?}"
        );
        // Per-watch periodic progress travels in order with the events.
        h.watch.progress(16, false);
        settle().await;
        assert_eq!(h.cache.revision(), 16, "periodic progress on {versions:?}");
        // Never backwards.
        h.watch.progress(12, false);
        h.watch.progress(13, true);
        settle().await;
        assert_eq!(h.cache.revision(), 16, "stale progress on {versions:?}");
        assert_eq!(
            h.cache.history_span(),
            (11, 16),
            "progress extends the covered span"
        );
        h.cache.close().await;
    }
}

/// `ProgressTrust::Never` / `Always` override the version check.
#[tokio::test(start_paused = true)]
async fn progress_trust_overrides() {
    let never = Config {
        progress_trust: ProgressTrust::Never,
        ..config()
    };
    let h = ready(never, &["3.6.0"], &[], 10).await;
    h.watch.progress(15, true);
    settle().await;
    assert_eq!(h.cache.revision(), 10);
    assert_eq!(
        h.up.versions_calls
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );

    let always = Config {
        progress_trust: ProgressTrust::Always,
        ..config()
    };
    let h = ready(always, &["3.4.23"], &[], 10).await;
    h.watch.progress(15, true);
    settle().await;
    assert_eq!(h.cache.revision(), 15);
}

/// The version decision is made again on every connect.
#[tokio::test(start_paused = true)]
async fn trust_is_rechecked_on_reconnect() {
    let mut h = ready(config(), &["3.5.13"], &[], 10).await;
    h.up.set_versions(&["3.5.13", "3.4.23"]); // a downgraded member joined
    h.watch.fail();
    let w = next_watch(&mut h.watches).await;
    w.created();
    within(h.cache.wait_ready()).await.unwrap();
    w.progress(15, true);
    settle().await;
    assert_eq!(h.cache.revision(), 10);
}

/// 7. The requestor: silent while nothing waits; one request per interval while any
/// number of waiters wait; silent again once they are done.
#[tokio::test(start_paused = true)]
async fn progress_requests_only_while_waiting_and_coalesced() {
    let cfg = Config {
        progress_request_interval: Duration::from_millis(100),
        ..config()
    };
    let h = ready(cfg, &["3.5.13"], &[], 10).await;
    for _ in 0..100 {
        advance(Duration::from_millis(100)).await;
        settle().await;
    }
    assert_eq!(h.up.requests(), 0, "no RequestProgress while nothing waits");

    // Three concurrent waiters.
    let mut waiters: Vec<_> = (0..3)
        .map(|_| task::spawn(h.cache.wait_for_revision(20)))
        .collect();
    for w in &mut waiters {
        assert_pending!(w.poll());
    }
    settle().await;
    assert_eq!(h.up.requests(), 1, "a request goes out at once");
    for i in 1..=5 {
        advance(Duration::from_millis(99)).await;
        settle().await;
        assert_eq!(h.up.requests(), i, "not before the interval");
        advance(Duration::from_millis(1)).await;
        settle().await;
        assert_eq!(
            h.up.requests(),
            i + 1,
            "one request per interval for all waiters"
        );
    }
    assert_eq!(h.cache.stats().progress_requests, 6);
    for w in &mut waiters {
        assert_pending!(w.poll());
    }

    h.watch.progress(20, true);
    settle().await;
    for w in &mut waiters {
        assert!(w.is_woken());
        assert_ready!(w.poll()).unwrap();
    }
    drop(waiters);
    let sent = h.up.requests();
    for _ in 0..50 {
        advance(Duration::from_millis(100)).await;
        settle().await;
    }
    assert_eq!(
        h.up.requests(),
        sent,
        "requests stop once the waiters are done"
    );

    // A waiter that gives up (dropped) stops the requests too.
    let mut w = task::spawn(h.cache.wait_for_revision(30));
    assert_pending!(w.poll());
    settle().await;
    assert_eq!(h.up.requests(), sent + 1);
    drop(w);
    for _ in 0..50 {
        advance(Duration::from_millis(100)).await;
        settle().await;
    }
    assert_eq!(
        h.up.requests(),
        sent + 1,
        "a cancelled waiter stops the requests"
    );

    // An event reaching the revision satisfies a waiter as well.
    let mut w = task::spawn(h.cache.wait_for_revision(21));
    assert_pending!(w.poll());
    h.watch.events(vec![put("/app/a", "x", 21, 21, 1)]);
    settle().await;
    assert_ready!(w.poll()).unwrap();
}

/// On a server whose answers are not trusted, requesting progress is pointless: none is
/// sent, and a waiter is served by events or periodic notifications.
#[tokio::test(start_paused = true)]
async fn no_progress_requests_on_untrusted_servers() {
    let h = ready(config(), &["3.4.23"], &[], 10).await;
    let mut w = task::spawn(h.cache.wait_for_revision(12));
    assert_pending!(w.poll());
    for _ in 0..20 {
        advance(Duration::from_millis(100)).await;
        settle().await;
    }
    assert_eq!(h.up.requests(), 0);
    h.watch.progress(12, true);
    settle().await;
    assert_pending!(w.poll());
    h.watch.progress(12, false);
    settle().await;
    assert_ready!(w.poll()).unwrap();
}

fn key_a() -> String {
    k("a")
}

/// 8a. Trusted server, cache behind: the read waits for a requested progress answer and
/// is then served from memory.
#[tokio::test(start_paused = true)]
async fn consistent_get_fast_path_on_trusted_server() {
    let h = ready(config(), &["3.5.13"], &[("/app/a", "a0")], 10).await;
    h.up.set_current_revision(15); // writes elsewhere moved the cluster on
    let mut get = task::spawn(h.cache.get(key_a(), None));
    assert_pending!(get.poll());
    settle().await;
    // The barrier read has answered; the read now waits for the cache.
    assert_pending!(get.poll());
    settle().await;
    assert_pending!(get.poll());
    assert!(h.up.requests() >= 1, "the waiting read asks for progress");
    assert_eq!(
        h.up.current_calls.load(std::sync::atomic::Ordering::SeqCst),
        1
    );

    h.watch.progress(15, true);
    settle().await;
    assert!(get.is_woken());
    let r = assert_ready!(get.poll()).unwrap();
    assert_eq!(r.revision(), 15);
    assert_eq!(r.kvs()[0].value(), b"a0");
    assert_eq!(h.up.fallbacks(), 0, "served from memory");
    assert_eq!(h.cache.stats().fallback_reads, 0);
}

/// A consistent read at an older revision passes the same barrier as one of the latest:
/// its data is that revision's, its header at least the cluster's revision when it was
/// called (here moved on by writes outside the prefix), as etcd's after a ReadIndex.
/// A serializable read at the same revision answers at once, with the cache's header.
#[tokio::test(start_paused = true)]
async fn consistent_get_at_an_older_revision_waits_for_the_cluster_revision() {
    let h = ready(config(), &["3.5.13"], &[("/app/a", "a0")], 10).await;
    h.watch.events(vec![put("/app/a", "a1", 2, 11, 2)]);
    within(h.cache.wait_for_revision(11)).await.unwrap();
    h.up.set_current_revision(15); // writes elsewhere moved the cluster on
    let calls = || h.up.current_calls.load(std::sync::atomic::Ordering::SeqCst);
    let before = calls();

    let at_11 = GetOptions::new().with_revision(11);
    let serializable = within(
        h.cache
            .get(key_a(), Some(at_11.clone().with_serializable())),
    )
    .await
    .unwrap();
    assert_eq!(serializable.kvs()[0].value(), b"a1");
    assert_eq!(serializable.header().unwrap().revision(), 11);
    assert_eq!(calls(), before, "a serializable read asks etcd nothing");

    let mut get = task::spawn(h.cache.get(key_a(), Some(at_11)));
    assert_pending!(get.poll());
    settle().await;
    assert_pending!(get.poll(), "waits for the cluster's revision, 15");
    assert_eq!(calls(), before + 1, "one barrier read");
    h.watch.progress(15, true);
    settle().await;
    let r = assert_ready!(get.poll()).unwrap();
    assert_eq!(r.revision(), 11);
    assert_eq!(r.kvs()[0].value(), b"a1", "the data at revision 11");
    assert_eq!(r.kvs()[0].mod_revision(), 11);
    assert_eq!(
        r.header().unwrap().revision(),
        15,
        "not below the cluster's"
    );
    assert_eq!(h.up.fallbacks(), 0, "served from memory");
}

/// 8b. Untrusted server, cache behind: etcd answers.
#[tokio::test(start_paused = true)]
async fn consistent_get_falls_back_on_untrusted_server() {
    let h = ready(config(), &["3.4.23"], &[("/app/a", "a0")], 10).await;
    // etcd at 15, "/app/a" unchanged (its fresh copy, at the same mod_revision).
    h.up.set_data(&[("/app/a", "a0")], 15);
    let t0 = Instant::now();
    let r = within(h.cache.get(key_a(), None)).await.unwrap();
    assert_eq!(
        t0.elapsed(),
        Duration::ZERO,
        "no point waiting: etcd answers at once"
    );
    assert_eq!(h.up.fallbacks(), 1);
    assert_eq!(h.cache.stats().fallback_reads, 1);
    assert_eq!(r.revision(), 15, "etcd's answer");
    assert_eq!(h.up.requests(), 0);
    // etcd's copy of a version the cache holds is replaced by the cache's own (one copy
    // in memory; what was derived from it, such as a typed object, is shared).
    let held = h
        .cache
        .get(key_a(), Some(GetOptions::new().with_serializable()))
        .await
        .unwrap();
    assert!(std::sync::Arc::ptr_eq(&r.kvs()[0].0, &held.kvs()[0].0));
}

/// 8b'. The fallback sends etcd the range's start, not the user's key: for an empty key
/// with a prefix, from-key or all-keys form that is "\0" (etcd refuses an empty key).
#[tokio::test(start_paused = true)]
async fn fallback_reads_send_the_range_start() {
    let cfg = Config {
        prefix: Bytes::new(),
        ..config()
    };
    let h = ready(cfg, &["3.4.23"], &[("/app/a", "a0")], 10).await;
    h.up.set_current_revision(15);
    for opts in [
        GetOptions::new().with_prefix(),
        GetOptions::new().with_from_key(),
        GetOptions::new().with_all_keys(),
    ] {
        within(h.cache.get("", Some(opts))).await.unwrap();
    }
    within(h.cache.get("x", Some(GetOptions::new().with_all_keys())))
        .await
        .unwrap();
    within(h.cache.get(key_a(), None)).await.unwrap();
    assert_eq!(
        h.up.fallback_keys(),
        [
            b"\0".to_vec(),
            b"\0".to_vec(),
            b"\0".to_vec(),
            b"\0".to_vec(),
            key_a().into_bytes()
        ]
    );
}

/// 8c. Cache current: served locally on both kinds of servers, without a fallback.
#[tokio::test(start_paused = true)]
async fn consistent_get_served_locally_when_current() {
    for versions in [&["3.5.13"][..], &["3.4.23"][..]] {
        let h = ready(config(), versions, &[("/app/a", "a0")], 10).await;
        h.watch.events(vec![put("/app/a", "a11", 2, 11, 2)]);
        within(h.cache.wait_for_revision(11)).await.unwrap();
        h.up.set_current_revision(11);
        let r = within(h.cache.get(key_a(), None)).await.unwrap();
        assert_eq!((r.revision(), r.kvs()[0].value()), (11, &b"a11"[..]));
        // A revision the cache holds is served locally too.
        let r = within(
            h.cache
                .get(key_a(), Some(GetOptions::new().with_revision(10))),
        )
        .await
        .unwrap();
        assert_eq!((r.revision(), r.kvs()[0].value()), (10, &b"a0"[..]));
        assert_eq!(h.up.fallbacks(), 0, "{versions:?}");
        // A revision the cluster has not reached.
        let e = within(
            h.cache
                .get(key_a(), Some(GetOptions::new().with_revision(12))),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(
                e,
                Error::FutureRevision {
                    requested: 12,
                    current: 11
                }
            ),
            "{e}"
        );
    }
}

/// 8d. `ReadFallback::Error`: a read that cannot be served in time fails with
/// `Timeout` after the configured wait, on trusted and untrusted servers; before the
/// cache is ready, with `NotReady`.
#[tokio::test(start_paused = true)]
async fn consistent_get_times_out_with_error_fallback() {
    for versions in [&["3.5.13"][..], &["3.4.23"][..]] {
        let cfg = Config {
            read_fallback: ReadFallback::Error,
            consistent_read_timeout: Duration::from_secs(1),
            ..config()
        };
        let h = ready(cfg, versions, &[("/app/a", "a0")], 10).await;
        h.up.set_current_revision(15);
        let mut get = task::spawn(h.cache.get(key_a(), None));
        assert_pending!(get.poll());
        settle().await;
        // The barrier read has answered; the read now waits for the cache.
        assert_pending!(get.poll());
        settle().await;
        advance(Duration::from_millis(999)).await;
        settle().await;
        assert_pending!(get.poll());
        advance(Duration::from_millis(1)).await;
        settle().await;
        let e = assert_ready!(get.poll()).unwrap_err();
        assert!(matches!(e, Error::Timeout), "{versions:?}: {e}");
        assert_eq!(h.up.fallbacks(), 0);
        drop(get);

        // Not ready (disconnected): NotReady at once.
        h.watch.fail();
        settle().await;
        assert!(!h.cache.is_ready());
        let e = within(h.cache.get(key_a(), None)).await.unwrap_err();
        assert!(matches!(e, Error::NotReady), "{e}");
        // Serializable reads are still served from memory.
        let r = within(
            h.cache
                .get(key_a(), Some(GetOptions::new().with_serializable())),
        )
        .await
        .unwrap();
        assert_eq!(r.revision(), 10);
    }
}

/// 8e. The default fallback: a trusted read that waits too long is answered by etcd; a
/// read while not ready is answered by etcd.
#[tokio::test(start_paused = true)]
async fn consistent_get_falls_back_after_timeout_and_while_not_ready() {
    let cfg = Config {
        consistent_read_timeout: Duration::from_secs(2),
        ..config()
    };
    let h = ready(cfg, &["3.5.13"], &[("/app/a", "a0")], 10).await;
    h.up.set_current_revision(15);
    let t0 = Instant::now();
    let r = within(h.cache.get(key_a(), None)).await.unwrap();
    assert_eq!(t0.elapsed(), Duration::from_secs(2));
    assert_eq!((r.revision(), h.up.fallbacks()), (15, 1));
    h.watch.fail();
    settle().await;
    let r = within(h.cache.get(key_a(), None)).await.unwrap();
    assert_eq!((r.revision(), h.up.fallbacks()), (15, 2));
}

/// 9a. Local progress: at the configured interval, with the cache's revision.
#[tokio::test(start_paused = true)]
async fn watch_progress_notify_at_interval() {
    let cfg = Config {
        progress_notify_interval: Duration::from_secs(1),
        ..config()
    };
    let h = ready(cfg, &["3.4.23"], &[], 10).await;
    let s = h
        .cache
        .watch(k("a"), Some(WatchOptions::new().with_progress_notify()))
        .await
        .unwrap();
    let mut s = task::spawn(s);
    let r = assert_ready!(s.poll_next()).unwrap().unwrap();
    assert!(r.created());
    assert_pending!(s.poll_next());
    advance(Duration::from_millis(999)).await;
    assert!(!s.is_woken());
    assert_pending!(s.poll_next());
    advance(Duration::from_millis(1)).await;
    assert!(s.is_woken());
    let r = assert_ready!(s.poll_next()).unwrap().unwrap();
    assert!(r.is_progress_notify() && r.events().is_empty());
    assert_eq!(r.revision(), 10);

    // Events elsewhere in the prefix and a periodic upstream progress move the revision.
    h.watch.events(vec![put("/app/b", "b", 11, 11, 1)]);
    h.watch.progress(14, false);
    settle().await;
    assert_pending!(s.poll_next(), "other keys are not delivered");
    advance(Duration::from_secs(1)).await;
    let r = assert_ready!(s.poll_next()).unwrap().unwrap();
    assert!(r.is_progress_notify());
    assert_eq!(r.revision(), 14);

    // Without with_progress_notify: nothing, however long.
    let quiet = h.cache.watch(k("a"), None).await.unwrap();
    let mut quiet = task::spawn(quiet);
    assert!(assert_ready!(quiet.poll_next()).unwrap().unwrap().created());
    assert_pending!(quiet.poll_next());
    advance(Duration::from_secs(60)).await;
    assert_pending!(quiet.poll_next());

    // On demand.
    quiet.request_progress().await.unwrap();
    let r = assert_ready!(quiet.poll_next()).unwrap().unwrap();
    assert_eq!((r.is_progress_notify(), r.revision()), (true, 14));
    assert_pending!(quiet.poll_next());
}

/// 9a'. A watch from a revision the cache has not reached (a client resuming from what
/// another proxy gave it) gets no progress until the cache reaches its start, as fixed
/// etcd (etcd#20221): the client's revision never moves backwards.
#[tokio::test(start_paused = true)]
async fn no_progress_below_a_start_the_cache_has_not_reached() {
    let cfg = Config {
        progress_notify_interval: Duration::from_secs(1),
        ..config()
    };
    let h = ready(cfg, &["3.4.23"], &[], 10).await;
    let options = WatchOptions::new()
        .with_progress_notify()
        .with_start_revision(14);
    let s = h.cache.watch(k("a"), Some(options)).await.unwrap();
    let mut s = task::spawn(s);
    let r = assert_ready!(s.poll_next()).unwrap().unwrap();
    assert!(r.created());
    assert_eq!(r.revision(), 10, "created at the cache's revision, as etcd");
    advance(Duration::from_secs(1)).await;
    assert_pending!(s.poll_next(), "no progress at 10 for a watch from 14");
    h.watch.events(vec![put("/app/b", "b", 11, 11, 1)]);
    h.watch.progress(12, false);
    settle().await;
    advance(Duration::from_secs(1)).await;
    assert_pending!(s.poll_next(), "nor at 12");
    h.watch.progress(13, false);
    settle().await;
    advance(Duration::from_secs(1)).await;
    assert_pending!(s.poll_next(), "nor at 13: etcd waits for its start, 14");
    h.watch.events(vec![put("/app/b", "b", 14, 14, 1)]);
    settle().await;
    advance(Duration::from_secs(1)).await;
    let r = assert_ready!(s.poll_next()).unwrap().unwrap();
    assert!(r.is_progress_notify(), "{r:?}");
    assert_eq!(r.revision(), 14, "once the cache is at its start");
    h.watch.events(vec![put(&k("a"), "v", 15, 15, 1)]);
    settle().await;
    let r = assert_ready!(s.poll_next()).unwrap().unwrap();
    assert_eq!(r.events()[0].revision(), 15);
    // Past its start, it is told its progress as any watch, also where its last event
    // is the cache's revision.
    advance(Duration::from_secs(1)).await;
    let r = assert_ready!(s.poll_next()).unwrap().unwrap();
    assert!(r.is_progress_notify(), "{r:?}");
    assert_eq!(r.revision(), 15, "at its last event, the cache's revision");
}

/// 9b. A lagging subscriber's progress never gets ahead of what it was delivered.
#[tokio::test(start_paused = true)]
async fn lagging_subscriber_progress_never_ahead_of_its_position() {
    let cfg = Config {
        subscriber_buffer: 1,
        progress_notify_interval: Duration::from_secs(1),
        ..config()
    };
    let h = ready(cfg, &["3.5.13"], &[], 10).await;
    let mut s = watch_prefix(&h.cache, WatchOptions::new().with_progress_notify()).await;
    created(&mut s).await;
    for rev in 11..=20 {
        h.watch.events(vec![put("/app/a", "x", 11, rev, rev - 10)]);
    }
    h.watch.progress(25, true);
    settle().await;
    assert_eq!(h.cache.revision(), 25);
    assert_eq!(h.cache.lagging_count(), 1);
    advance(Duration::from_secs(5)).await; // the timer is due
    s.request_progress().await.unwrap(); // and one is requested
    let mut delivered = 10;
    let mut progress = Vec::new();
    while progress.is_empty() || delivered < 20 {
        let r = next(&mut s).await.unwrap().unwrap();
        if r.is_progress_notify() {
            assert!(r.revision() >= delivered);
            progress.push(r.revision());
        } else {
            assert!(
                progress.iter().all(|p| *p < r.revision()),
                "event {} after progress {progress:?}",
                r.revision()
            );
            assert_eq!(r.revision(), delivered + 1, "in order, no gap");
            delivered = r.revision();
        }
    }
    assert_eq!(delivered, 20);
    assert_eq!(
        progress,
        [25],
        "one progress, at the cache's revision, after the events"
    );
    assert_eq!(h.cache.lagging_count(), 0);
}

/// A read that waits across a reconnect asks the new watch for progress at once.
#[tokio::test(start_paused = true)]
async fn waiting_read_requests_progress_on_the_resumed_watch() {
    let cfg = Config {
        backoff_initial: Duration::from_millis(100),
        ..config()
    };
    let mut h = ready(cfg, &["3.5.13"], &[], 10).await;
    h.watch.fail();
    settle().await;
    let mut w = task::spawn(h.cache.wait_for_revision(12));
    assert_pending!(w.poll());
    settle().await;
    assert_eq!(h.up.requests(), 0, "no watch to ask while disconnected");
    advance(Duration::from_millis(100)).await;
    settle().await;
    let resumed = h.watches.try_recv().expect("reconnected");
    resumed.created();
    settle().await;
    assert_eq!(h.up.requests(), 1);
    resumed.progress(12, true);
    settle().await;
    assert_ready!(w.poll()).unwrap();
}

/// Barrier reads are shared by the callers that wait at the same time (one round trip
/// for many consistent reads), but a caller never uses one sent before it asked: a
/// read that starts while one is in flight waits for the next one.
#[tokio::test(start_paused = true)]
async fn revision_barrier_reads_are_shared_but_never_older_than_the_caller() {
    let h = ready(config(), &["3.4.23"], &[("/app/a", "a0")], 10).await;
    let calls = || h.up.current_calls.load(std::sync::atomic::Ordering::SeqCst);
    let before = calls();
    // 50 reads at once: one barrier read.
    let reads: Vec<_> = (0..50)
        .map(|_| task::spawn(h.cache.get(key_a(), None)))
        .collect();
    let mut reads = reads;
    for r in &mut reads {
        assert_pending!(r.poll());
    }
    settle().await;
    for r in &mut reads {
        let resp = assert_ready!(r.poll()).unwrap();
        assert_eq!(resp.revision(), 10);
    }
    assert_eq!(
        calls() - before,
        1,
        "one barrier read served 50 concurrent reads"
    );

    // A barrier read in flight (stalled); a write completes; a second read starts. It must not
    // take the first one's answer, which may predate the write.
    h.up.set_stalled(true);
    let mut first = task::spawn(h.cache.get(key_a(), None));
    assert_pending!(first.poll());
    settle().await;
    let in_flight = calls();
    h.up.set_current_revision(11); // the write, applied by etcd
    let mut second = task::spawn(h.cache.get(key_a(), None));
    assert_pending!(second.poll());
    settle().await;
    assert_eq!(
        calls(),
        in_flight,
        "no second barrier read while one is in flight"
    );
    h.up.set_stalled(false);
    settle().await;
    assert_eq!(
        calls(),
        in_flight + 1,
        "the second read gets a barrier read of its own"
    );
    // Both see revision 11 (etcd answered both barrier reads after the write), and since the
    // cache is behind on an untrusted server, etcd answers them.
    let r1 = assert_ready!(first.poll()).unwrap();
    let r2 = assert_ready!(second.poll()).unwrap();
    assert_eq!((r1.revision(), r2.revision()), (11, 11));
}
