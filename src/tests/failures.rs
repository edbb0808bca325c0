//! Upstream failures and how the cache meets them: re-lists and reconnects back off
//! (a compaction that outruns the list, a flapping watch, a slow version probe kept off
//! the reconnect path), a message whose revisions go backwards is rejected, a permanent
//! refusal stops the cache with its cause while a transient one is retried and visible,
//! closes at connect stop it only in a row before any answer, a panicking follower ends
//! the streams with an error, and the consistency check repairs a corrupted store.

use std::time::Duration;

use tokio::time::{advance, Instant};

use super::*;
use crate::read::GetOptions;
use crate::upstream::fake::put;
use crate::CacheStatus;

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
        .hooks()
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
