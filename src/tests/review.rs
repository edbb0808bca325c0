//! Defects found by an adversarial review of the watch and read paths, each pinned by
//! the test that reproduced it: a spurious compaction of a slow sparse subscriber, a
//! hung revision probe, a progress-request storm, a flat back-off, a serializable read
//! that timed out, revisions that went backwards on a stream, and the smaller ones
//! (a read racing close, a panicking follower, a scope that did not keep the cache
//! alive, a slow version probe on the reconnect path, a message whose revisions go
//! backwards), plus permanent upstream failures.

use std::time::Duration;

use tokio::time::{advance, Instant};
use tokio_test::{assert_pending, task};

use super::*;
use crate::read::GetOptions;
use crate::shared::CacheStatus;
use crate::upstream::fake::put;

/// A slow subscriber on one key, whose only missed revision is still in the window,
/// catches up instead of being ended as compacted: revisions that did not match it
/// (other keys) must not count against its position.
#[tokio::test(start_paused = true)]
async fn slow_sparse_subscriber_is_not_compacted_while_its_revisions_are_in_the_window() {
    let cfg = Config {
        subscriber_buffer: 1,
        history_window: 4,
        ..config()
    };
    let h = ready(cfg, &["3.5.13"], &[], 10).await;
    let mut a = h.cache.watch(k("a"), None).await.unwrap();
    created(&mut a).await;
    h.watch.events(vec![put(&k("a"), "1", 11, 11, 1)]); // queued, not read
    for rev in 12..=20 {
        h.watch.events(vec![put(&k("b"), "x", 12, rev, rev - 11)]);
    }
    h.watch.events(vec![put(&k("a"), "2", 11, 21, 2)]); // finds the buffer full
    settle().await;
    assert_eq!(h.cache.lagging_count(), 1);
    assert_eq!(h.cache.history_span().0, 18, "revision 11 left the window");
    assert_eq!(next_rev(&mut a).await, 11);
    assert_eq!(next_rev(&mut a).await, 21, "caught up, not compacted");
    assert!(now(&mut a).is_none(), "nothing else is owed");
    assert_eq!(h.cache.lagging_count(), 0);
}

/// A revision probe that never answers (a half-open connection to one endpoint) holds
/// up neither consistent reads nor watches from now: a fresh probe is sent beside it.
#[tokio::test(start_paused = true)]
async fn a_hung_revision_probe_does_not_block_consistent_reads_or_watches() {
    let h = ready(config(), &["3.5.13"], &[(&k("a"), "1")], 10).await;
    h.up.hang_next_probes(1);
    let t0 = Instant::now();
    let r = within(h.cache.get(k("a"), None)).await.unwrap();
    assert_eq!(r.kvs().len(), 1);
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "answered after {:?}, not after the 3 s timeout",
        t0.elapsed()
    );
    for _ in 0..10 {
        let t = Instant::now();
        within(h.cache.get(k("a"), None)).await.unwrap();
        assert!(t.elapsed() < Duration::from_secs(1));
    }
    h.up.hang_next_probes(1);
    h.up.set_current_revision(12);
    let t = Instant::now();
    let mut w = h.cache.watch(k("a"), None).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(
        created(&mut w).await,
        12,
        "from the cluster's revision, not the cache's"
    );
    assert_eq!(h.up.fallbacks(), 0, "all from memory");
}

/// When no probe answers at all, a consistent read honours `ReadFallback::Etcd`.
#[tokio::test(start_paused = true)]
async fn a_consistent_read_falls_back_to_etcd_when_no_probe_answers() {
    let h = ready(config(), &["3.5.13"], &[(&k("a"), "1")], 10).await;
    h.up.set_stalled(true);
    let r = within(h.cache.get(k("a"), None)).await.unwrap();
    assert_eq!(r.kvs().len(), 1);
    assert_eq!(h.up.fallbacks(), 1);
}

/// While a read waits for a revision the cluster has not reached, `RequestProgress`
/// goes out once per `progress_request_interval`, not once per answer.
#[tokio::test(start_paused = true)]
async fn progress_requests_are_paced_while_a_read_waits_for_a_future_revision() {
    let cfg = Config {
        progress_request_interval: Duration::from_millis(100),
        ..config()
    };
    let h = ready(cfg, &["3.5.13"], &[], 10).await;
    let mut waiter = task::spawn(h.cache.wait_for_revision(100));
    assert_pending!(waiter.poll());
    settle().await;
    let mut answered = 0;
    for _ in 0..100 {
        // etcd answers every request at once, with a revision below the one awaited.
        while answered < h.up.requests() {
            h.watch.progress(10, true);
            answered += 1;
            settle().await;
        }
        advance(Duration::from_millis(10)).await;
        settle().await;
    }
    assert_pending!(waiter.poll());
    let sent = h.up.requests();
    assert!(
        (9..=12).contains(&sent),
        "{sent} requests in 1 s at a 100 ms interval"
    );
}

/// When compaction keeps outrunning list-plus-watch, re-lists back off exponentially
/// instead of listing the prefix every few milliseconds.
#[tokio::test(start_paused = true)]
async fn relist_backoff_grows_when_compaction_outruns_the_list() {
    let mut h = ready(config(), &["3.5.13"], &[], 10).await;
    let t0 = Instant::now();
    h.watch.compacted(15);
    while t0.elapsed() < Duration::from_secs(10) {
        let w = next_watch(&mut h.watches).await;
        w.created();
        w.compacted(w.start + 5);
    }
    let lists = h.up.lists().len();
    assert!(lists <= 12, "{lists} lists in 10 s");
}

/// A flapping upstream (each watch created, then broken) reconnects with growing
/// delays: the `created` message alone does not reset the back-off.
#[tokio::test(start_paused = true)]
async fn a_flapping_upstream_reconnects_with_growing_delays() {
    let mut h = ready(config(), &["3.5.13"], &[], 10).await;
    let t0 = Instant::now();
    h.watch.fail();
    let mut watches = 0;
    while t0.elapsed() < Duration::from_secs(10) {
        let w = next_watch(&mut h.watches).await;
        w.created();
        w.fail();
        watches += 1;
    }
    assert!(watches <= 12, "{watches} reconnects in 10 s");
}

/// A serializable read at a revision the cluster has reached but the cache has not
/// (a quiet prefix on a server whose progress answers cannot be trusted) is answered
/// at once, by etcd, instead of timing out.
#[tokio::test(start_paused = true)]
async fn a_serializable_read_at_a_revision_only_the_cluster_has_is_answered() {
    let h = ready(config(), &["3.4.23"], &[(&k("a"), "1")], 10).await;
    h.up.set_current_revision(12);
    let t0 = Instant::now();
    let r = within(h.cache.get(
        k("a"),
        Some(GetOptions::new().with_serializable().with_revision(12)),
    ))
    .await
    .unwrap();
    assert_eq!(r.kvs().len(), 1);
    assert!(
        t0.elapsed() < Duration::from_millis(100),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(h.up.fallbacks(), 1);
    // The same for the revision a watch from now was created at.
    h.up.set_current_revision(14);
    let mut w = h.cache.watch(k("a"), None).await.unwrap();
    let at = created(&mut w).await;
    assert_eq!(at, 14);
    let r = within(h.cache.get(
        k("a"),
        Some(GetOptions::new().with_serializable().with_revision(at)),
    ))
    .await
    .unwrap();
    assert_eq!(r.kvs().len(), 1);
}

/// Every response on a stream reports a revision at or above the previous one: a watch
/// from now created at the cluster's revision does not then report the cache's older
/// revision in a progress response.
#[tokio::test(start_paused = true)]
async fn response_revisions_never_go_backwards_on_a_stream() {
    let h = ready(config(), &["3.4.23"], &[], 2).await;
    h.up.set_current_revision(7);
    let mut w = watch_prefix(&h.cache, WatchOptions::new()).await;
    assert_eq!(created(&mut w).await, 7);
    w.request_progress().await.unwrap();
    let p = next(&mut w).await.unwrap().unwrap();
    assert!(p.is_progress_notify());
    assert!(p.revision() >= 7, "progress at {}", p.revision());
    h.watch.events(vec![put(&k("a"), "1", 8, 8, 1)]);
    assert_eq!(next_rev(&mut w).await, 8);
}

/// A consistent read that is waiting when the cache closes returns `Closed`; it does
/// not fall back to etcd.
#[tokio::test(start_paused = true)]
async fn a_consistent_read_racing_close_returns_closed() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    h.up.set_current_revision(20);
    let mut read = task::spawn(h.cache.get(k("a"), None));
    assert_pending!(read.poll());
    settle().await;
    assert_pending!(read.poll());
    h.cache.close().await;
    let r = within(read).await;
    assert!(matches!(r, Err(Error::Closed)), "{r:?}");
    assert_eq!(h.up.fallbacks(), 0);
}

/// If the follower task panics, streams end with an error (not as after `close()`),
/// and the status says the cache failed.
#[tokio::test(start_paused = true)]
async fn a_panicking_follower_ends_streams_with_an_error() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut w = watch_prefix(&h.cache, WatchOptions::new()).await;
    created(&mut w).await;
    h.watch.panic();
    let r = next(&mut w).await;
    match r {
        Err(Error::Failed { source }) => {
            assert!(matches!(*source, Error::Internal { .. }), "{source}")
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    assert!(next(&mut w).await.unwrap().is_none());
    assert!(matches!(h.cache.status(), CacheStatus::Failed { .. }));
}

/// A `WatchScope` is a handle: it keeps the cache alive after the last `Cache` is
/// dropped.
#[tokio::test(start_paused = true)]
async fn a_scope_keeps_the_cache_alive() {
    let Harness { cache, watch, .. } = ready(config(), &["3.5.13"], &[], 10).await;
    let scope = cache.scope(4);
    drop(cache);
    settle().await;
    let mut w = scope
        .watch(PREFIX, Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    created(&mut w).await;
    watch.events(vec![put(&k("a"), "1", 11, 11, 1)]);
    assert_eq!(next_rev(&mut w).await, 11);
}

/// The per-member version probe runs off the reconnect path: members that take long
/// to answer do not delay the next watch.
#[tokio::test(start_paused = true)]
async fn a_slow_version_probe_does_not_delay_reconnects() {
    let mut h = ready(config(), &["3.5.13"], &[], 10).await;
    h.up.set_versions_delay(Duration::from_secs(3));
    let t0 = Instant::now();
    h.watch.fail();
    let w = next_watch(&mut h.watches).await;
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    w.created();
    within(h.cache.wait_ready()).await.unwrap();
}

/// An upstream message whose revisions go backwards (etcd never sends one; a buggy
/// proxy could) is rejected as a whole, and the watch resumes from the last applied
/// revision.
#[tokio::test(start_paused = true)]
async fn a_message_whose_revisions_go_backwards_is_rejected() {
    let mut h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut w = watch_prefix(&h.cache, WatchOptions::new()).await;
    created(&mut w).await;
    h.watch.events(vec![
        put(&k("a"), "1", 12, 12, 1),
        put(&k("b"), "1", 11, 11, 1),
    ]);
    let again = next_watch(&mut h.watches).await;
    assert_eq!(again.start, 11, "resumes after the last applied revision");
    assert_eq!(h.cache.revision(), 10);
    again.created();
    again.events(vec![put(&k("b"), "1", 11, 11, 1)]);
    again.events(vec![put(&k("a"), "1", 12, 12, 1)]);
    assert_eq!(next_rev(&mut w).await, 11);
    assert_eq!(next_rev(&mut w).await, 12);
}

/// A permanent refusal (here: permission denied on the list) stops the cache instead
/// of retrying forever: `wait_ready` returns the cause, the status says failed.
#[tokio::test(start_paused = true)]
async fn a_permanent_failure_stops_the_cache_with_its_cause() {
    let (up, _watches) = FakeUpstream::new(&["3.5.13"], &[], 10);
    up.refuse_lists(Some(tonic::Code::PermissionDenied));
    let cache = Cache::start(config(), up.clone()).unwrap();
    let e = within(cache.wait_ready()).await.unwrap_err();
    assert!(e.to_string().contains("permission"), "{e}");
    assert!(matches!(e, Error::Failed { .. }), "{e:?}");
    assert!(matches!(cache.status(), CacheStatus::Failed { .. }));
    assert_eq!(up.lists().len(), 1, "not retried");
    let e = cache.get(k("a"), None).await.unwrap_err();
    assert!(matches!(e, Error::Failed { .. }), "{e:?}");
}

/// A transient failure is retried, and visible while it lasts: the status carries the
/// last error and `wait_ready_timeout` names it.
#[tokio::test(start_paused = true)]
async fn a_transient_failure_is_retried_and_visible() {
    let (up, mut watches) = FakeUpstream::new(&["3.5.13"], &[], 10);
    up.refuse_lists(Some(tonic::Code::Unavailable));
    let cache = Cache::start(config(), up.clone()).unwrap();
    let e = cache
        .wait_ready_timeout(Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    assert!(e.to_string().contains("scripted refusal"), "{e}");
    match cache.status() {
        CacheStatus::Reconnecting { error, attempts } => {
            assert!(attempts >= 2, "{attempts}");
            assert!(error.to_string().contains("scripted refusal"));
        }
        other => panic!("{other:?}"),
    }
    up.refuse_lists(None);
    let w = next_watch(&mut watches).await;
    w.created();
    within(cache.wait_ready()).await.unwrap();
}
