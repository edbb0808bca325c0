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
use crate::status::CacheStatus;
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
    h.up.hang_next_barrier_reads(1);
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
    h.up.hang_next_barrier_reads(1);
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
    assert!(e.to_string().to_lowercase().contains("permission"), "{e}");
    assert!(matches!(e, Error::Failed { .. }), "{e:?}");
    assert!(matches!(cache.status(), CacheStatus::Failed { .. }));
    assert_eq!(up.lists().len(), 1, "not retried");
    let e = cache.get(k("a"), None).await.unwrap_err();
    assert!(matches!(e, Error::Failed { .. }), "{e:?}");
}

/// Connections closed right after they were made, before etcd ever answered (a TLS
/// refusal of a missing client certificate whose alert was lost): the cache stops after
/// `CLOSED_AT_CONNECT_LIMIT` of them in a row, whatever the timing.
#[tokio::test(start_paused = true)]
async fn closes_at_connect_before_any_answer_stop_the_cache() {
    let (up, _watches) = FakeUpstream::new(&["3.5.13"], &[], 10);
    up.close_lists(true);
    let cache = Cache::start(config(), up.clone()).unwrap();
    let e = within(cache.wait_ready()).await.unwrap_err();
    let Error::Failed { source } = &e else {
        panic!("{e:?}")
    };
    assert!(
        matches!(**source, Error::ClosedAtConnect { attempts: 5, .. }),
        "{source:?}"
    );
    assert!(e.to_string().contains("client certificate"), "{e}");
    assert_eq!(up.lists().len(), 5);
}

/// Closes at connect count only in a row and only before etcd first answered: a refused
/// connect between them (etcd down) starts the count again, and a cache that was
/// answered once retries them forever.
#[tokio::test(start_paused = true)]
async fn closes_at_connect_are_retried_when_not_in_a_row_or_after_an_answer() {
    let (up, mut watches) = FakeUpstream::new(&["3.5.13"], &[], 10);
    let cache = Cache::start(config(), up.clone()).unwrap();
    for _ in 0..4 {
        up.close_lists(true);
        let before = up.lists().len();
        within(async {
            while up.lists().len() < before + 4 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
        up.close_lists(false);
        up.refuse_lists(Some(tonic::Code::Unavailable));
        let before = up.lists().len();
        within(async {
            while up.lists().len() < before + 1 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
        up.refuse_lists(None);
        up.close_lists(true);
        assert!(!matches!(cache.status(), CacheStatus::Failed { .. }));
    }
    up.close_lists(false);
    let mut w = next_watch(&mut watches).await;
    w.created();
    within(cache.wait_ready()).await.unwrap();
    // Answered once: closes at connect are retried, however many.
    for _ in 0..(2 * 5) {
        w.send_raw(Err(crate::error::closed_after_connect()));
        w = next_watch(&mut watches).await;
        assert!(!matches!(cache.status(), CacheStatus::Failed { .. }));
    }
    w.created();
    within(cache.wait_ready()).await.unwrap();
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

/// The consistency check finds a store that differs from etcd (corrupted behind its
/// back), counts it, and repairs it by listing again at the cache's own revision: the
/// subscribers continue, and the next check finds nothing.
#[tokio::test(start_paused = true)]
async fn the_consistency_check_finds_and_repairs_a_corrupted_store() {
    let cfg = Config {
        consistency_check: Some(Duration::from_secs(10)),
        ..config()
    };
    let keys = [(k("a").as_str(), "1"), (k("b").as_str(), "2")].map(|(a, b)| (a.to_owned(), b));
    let keys: Vec<(&str, &str)> = keys.iter().map(|(a, b)| (a.as_str(), *b)).collect();
    let mut h = ready(cfg, &["3.5.13"], &keys, 10).await;
    let mut w = watch_prefix(&h.cache, WatchOptions::new()).await;
    created(&mut w).await;
    advance(Duration::from_secs(11)).await;
    settle().await;
    assert_eq!(h.cache.stats().consistency_checks, 1);
    assert_eq!(h.cache.stats().consistency_mismatches, 0);

    h.cache
        .shared()
        .hooks
        .corrupt(crate::kv::KeyValue::new(k("a"), "wrong", 2, 9, 3, 0));
    settle().await;
    let read = |cache: Cache| async move {
        let r = cache
            .get(k("a"), Some(GetOptions::new().with_serializable()))
            .await
            .unwrap();
        r.kvs()[0].value().to_vec()
    };
    assert_eq!(read(h.cache.clone()).await, b"wrong");
    advance(Duration::from_secs(10)).await;
    // The follower stops its session to repair, then watches again from 11.
    let again = next_watch(&mut h.watches).await;
    assert_eq!(again.start, 11);
    again.created();
    within(h.cache.wait_ready()).await.unwrap();
    assert_eq!(h.cache.stats().consistency_mismatches, 1);
    assert_eq!(read(h.cache.clone()).await, b"1", "repaired from etcd");
    again.events(vec![put(&k("c"), "3", 11, 11, 1)]);
    assert_eq!(next_rev(&mut w).await, 11, "the subscriber continued");
    // etcd's data at 11, for the next check.
    use crate::kv::KeyValue;
    h.up.set_kvs(
        vec![
            KeyValue::new(k("a"), "1", 2, 2, 1, 0),
            KeyValue::new(k("b"), "2", 3, 3, 1, 0),
            KeyValue::new(k("c"), "3", 11, 11, 1, 0),
        ],
        11,
    );
    advance(Duration::from_secs(11)).await;
    settle().await;
    assert_eq!(h.cache.stats().consistency_checks, 3);
    assert_eq!(h.cache.stats().consistency_mismatches, 1);
}

/// With the `metrics` feature, the cache records through the `metrics` facade: events
/// received, deliveries, connects, watchers, reads, and the published state.
#[cfg(feature = "metrics")]
#[tokio::test(start_paused = true)]
async fn metrics_are_recorded_through_the_facade() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (up, mut watches) = FakeUpstream::new(&["3.5.13"], &[(&k("a"), "1")], 10);
    let cache =
        metrics::with_local_recorder(&recorder, || Cache::start(config(), up.clone())).unwrap();
    let watch = next_watch(&mut watches).await;
    watch.created();
    within(cache.wait_ready()).await.unwrap();
    let mut w = watch_prefix(&cache, WatchOptions::new()).await;
    created(&mut w).await;
    watch.events(vec![
        put(&k("a"), "2", 2, 11, 2),
        put(&k("b"), "1", 11, 11, 1),
    ]);
    assert_eq!(next_rev(&mut w).await, 11);
    within(cache.get(k("a"), None)).await.unwrap();
    drop(w);
    // A replay from the history is counted too.
    let mut replay = watch_prefix(&cache, WatchOptions::new().with_start_revision(11)).await;
    created(&mut replay).await;
    assert_eq!(next_rev(&mut replay).await, 11);
    drop(replay);
    // One snapshot: taking one resets the recorder's counters.
    let snapshot = snapshotter.snapshot().into_vec();
    let value = |name: &str, label: Option<(&str, &str)>| -> f64 {
        snapshot
            .iter()
            .find(|(key, _, _, _)| {
                key.key().name() == name
                    && label.is_none_or(|(k, v)| {
                        key.key().labels().any(|l| l.key() == k && l.value() == v)
                    })
            })
            .map(|(_, _, _, v)| match v {
                DebugValue::Counter(c) => *c as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(h) => h.len() as f64,
            })
            .unwrap_or_else(|| panic!("no metric {name} {label:?}"))
    };
    assert_eq!(value("etcd_cache_upstream_events_total", None), 2.0);
    assert_eq!(value("etcd_cache_upstream_revisions_total", None), 1.0);
    assert_eq!(value("etcd_cache_deliveries_total", None), 1.0);
    assert_eq!(value("etcd_cache_replayed_total", None), 1.0);
    assert_eq!(
        value("etcd_cache_watch_responses_total", Some(("kind", "events"))),
        2.0
    );
    assert_eq!(value("etcd_cache_upstream_connects_total", None), 1.0);
    assert_eq!(value("etcd_cache_revision", None), 11.0);
    assert_eq!(value("etcd_cache_store_keys", None), 2.0);
    assert_eq!(value("etcd_cache_watches_opened_total", None), 2.0);
    assert_eq!(
        value(
            "etcd_cache_watches_ended_total",
            Some(("reason", "dropped"))
        ),
        2.0
    );
    assert_eq!(
        value(
            "etcd_cache_consistent_reads_total",
            Some(("served", "memory"))
        ),
        1.0
    );
    assert_eq!(value("etcd_cache_consistent_read_wait_seconds", None), 1.0);
}
