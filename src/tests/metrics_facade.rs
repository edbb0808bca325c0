//! With the `metrics` feature, what the cache records through the `metrics` facade:
//! events received, deliveries, connects, watchers, reads, and the published state.

use super::*;
use crate::upstream::fake::put;

/// With the `metrics` feature, the cache records through the `metrics` facade: events
/// received, deliveries, connects, watchers, reads, and the published state.
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

/// A watch stream closed by the client's own h2 (GOAWAY `ENHANCE_YOUR_CALM`,
/// `too_many_data_frames`, which tonic answers `ResourceExhausted`) is a broken stream,
/// counted under its own cause, not as an answer of etcd's.
#[tokio::test(start_paused = true)]
async fn a_connection_closed_by_h2s_small_frame_guard_is_counted_as_such() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (up, mut watches) = FakeUpstream::new(&["3.5.13"], &[(&k("a"), "1")], 10);
    let cache =
        metrics::with_local_recorder(&recorder, || Cache::start(config(), up.clone())).unwrap();
    let watch = next_watch(&mut watches).await;
    watch.created();
    within(cache.wait_ready()).await.unwrap();
    let status = tonic::Status::resource_exhausted(
        "h2 protocol error: error reading a body from connection: connection error detected: \
         detected excessive load generating behavior (b\"too_many_data_frames\")",
    );
    let e = Error::watch_stream(etcd_client::Error::GRpcStatus(status), 0);
    assert!(matches!(e, Error::Transport { .. }), "{e:?}");
    watch.send_raw(Err(e));
    // The follower reconnects.
    let again = next_watch(&mut watches).await;
    again.created();
    within(cache.wait_ready()).await.unwrap();
    let snapshot = snapshotter.snapshot().into_vec();
    let disconnects = |cause: &str| {
        snapshot
            .iter()
            .find(|(key, _, _, _)| {
                key.key().name() == "etcd_cache_upstream_disconnects_total"
                    && key
                        .key()
                        .labels()
                        .any(|l| l.key() == "cause" && l.value() == cause)
            })
            .map_or(0, |(_, _, _, v)| match v {
                DebugValue::Counter(c) => *c,
                _ => 0,
            })
    };
    assert_eq!(disconnects("too_many_data_frames"), 1);
    assert_eq!(disconnects("etcd"), 0);
    assert_eq!(disconnects("transport"), 0);
}
