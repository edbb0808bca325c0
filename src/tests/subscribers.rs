//! Slow subscribers, limits, scopes, shutdown and bad input.

use super::*;
use crate::read::GetOptions;
use crate::upstream::fake::put;
use crate::watch::WatchOptions;

/// Pushes revisions `from..=to` (a put of `/app/a` each, and of `/app/b` as well in
/// every tenth), waiting for each to be delivered to `fast`.
async fn burst(h: &Harness, fast: &mut WatchStream, from: i64, to: i64) {
    for rev in from..=to {
        let mut evs = vec![put("/app/a", &rev.to_string(), from, rev, rev - from + 1)];
        if rev % 10 == 0 {
            evs.push(put("/app/b", &rev.to_string(), from, rev, 1));
        }
        h.watch.events(evs);
        let r = next(fast).await.unwrap().unwrap();
        assert_eq!(r.revision(), rev, "the fast subscriber is not held back");
        assert_eq!(r.events().len(), if rev % 10 == 0 { 2 } else { 1 });
    }
}

/// Two prefix subscribers, their `created` taken: one to leave unread, one to read.
async fn slow_and_fast(h: &Harness) -> (WatchStream, WatchStream) {
    let mut slow = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    let mut fast = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    created(&mut slow).await;
    created(&mut fast).await;
    (slow, fast)
}

/// 10a. A capacity-1 subscriber that is not polled during 1000 revisions then reads
/// every one of them, in order, once.
#[tokio::test(start_paused = true)]
async fn slow_subscriber_catches_up_in_order() {
    let cfg = Config {
        subscriber_buffer: 1,
        ..config()
    };
    let h = ready(cfg, &["3.5.13"], &[], 10).await;
    let mut slow = watch_prefix(&h.cache, WatchOptions::new().with_prev_key()).await;
    let mut fast = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    let mut slow_b = h.cache.watch(k("b"), None).await.unwrap();
    created(&mut slow).await;
    created(&mut fast).await;
    created(&mut slow_b).await;
    burst(&h, &mut fast, 11, 1010).await;
    assert_eq!(h.cache.lagging_count(), 2);
    // A filtered slow subscriber catches up with its own revisions only.
    for rev in (20..=1010).step_by(10) {
        let r = next(&mut slow_b).await.unwrap().unwrap();
        assert_eq!((r.revision(), r.events().len()), (rev, 1));
    }
    // More events while it catches up.
    let mut expect = 11;
    for round in 0..2 {
        for _ in 0..300 {
            let r = next(&mut slow).await.unwrap().unwrap();
            assert_eq!(r.revision(), expect);
            let whole = if expect % 10 == 0 { 2 } else { 1 };
            assert_eq!(r.events().len(), whole, "a revision stays whole");
            let ev = &r.events()[0];
            assert_eq!(ev.kv().unwrap().value(), expect.to_string().as_bytes());
            if expect > 11 {
                assert_eq!(ev.prev_kv().unwrap().mod_revision(), expect - 1);
            }
            expect += 1;
        }
        let from = 1011 + round * 10;
        burst(&h, &mut fast, from, from + 9).await;
    }
    while expect <= 1030 {
        assert_eq!(next_rev(&mut slow).await, expect);
        expect += 1;
    }
    settle().await;
    assert!(now(&mut slow).is_none(), "no duplicate, nothing more");
    assert_eq!(next_rev(&mut slow_b).await, 1020);
    assert_eq!(next_rev(&mut slow_b).await, 1030);
    assert!(now(&mut slow_b).is_none());
    assert_eq!(h.cache.lagging_count(), 0);
    // Back on the live path.
    h.watch.events(vec![put("/app/b", "b", 1031, 1031, 1)]);
    assert_eq!(next_rev(&mut slow).await, 1031);
    assert_eq!(next_rev(&mut fast).await, 1031);
}

/// 10b. A slow subscriber whose position leaves the window gets `Compacted`, then the
/// end; its neighbour is unaffected.
#[tokio::test(start_paused = true)]
async fn slow_subscriber_out_of_window_is_compacted() {
    let cfg = Config {
        subscriber_buffer: 1,
        history_window: 100,
        ..config()
    };
    let h = ready(cfg, &["3.5.13"], &[], 10).await;
    let (mut slow, mut fast) = slow_and_fast(&h).await;
    burst(&h, &mut fast, 11, 1010).await;
    assert_eq!(h.cache.history_span(), (911, 1010));
    // What was queued before it lagged is still delivered.
    assert_eq!(next_rev(&mut slow).await, 11);
    assert_eq!(is_compacted(&next(&mut slow).await), Some(911));
    assert!(next(&mut slow).await.unwrap().is_none());
    assert!(next(&mut slow).await.unwrap().is_none());
    assert_eq!(h.cache.lagging_count(), 0);
    drop(slow);
    assert_eq!(h.cache.watcher_count(), 1);
    burst(&h, &mut fast, 1011, 1012).await;
}

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

/// A stream dropped while lagging frees its slot and the lagging count.
#[tokio::test(start_paused = true)]
async fn dropping_a_lagging_stream_frees_everything() {
    let cfg = Config {
        subscriber_buffer: 1,
        ..config()
    };
    let h = ready(cfg, &["3.5.13"], &[], 10).await;
    let mut slow = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    let mut fast = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    created(&mut slow).await;
    created(&mut fast).await;
    burst(&h, &mut fast, 11, 20).await;
    assert_eq!((h.cache.lagging_count(), h.cache.watcher_count()), (1, 2));
    drop(slow);
    assert_eq!((h.cache.lagging_count(), h.cache.watcher_count()), (0, 1));
}

/// 11a. `max_watchers`: the next watch fails with `WatchLimit` and its message; a dropped
/// stream frees its slot at once.
#[tokio::test(start_paused = true)]
async fn watch_limit_and_slots() {
    let cfg = Config {
        max_watchers: 3,
        ..config()
    };
    let h = ready(cfg, &["3.5.13"], &[], 10).await;
    let mut open = Vec::new();
    for i in 0..3 {
        open.push(h.cache.watch(k(&format!("k{i}")), None).await.unwrap());
    }
    let e = h.cache.watch(k("k9"), None).await.unwrap_err();
    assert!(matches!(e, Error::WatchLimit { limit: 3 }), "{e:?}");
    assert_eq!(e.to_string(), "at most 3 watches are allowed");
    assert_eq!(h.cache.watcher_count(), 3);
    drop(open.pop());
    assert_eq!(h.cache.watcher_count(), 2);
    let mut again = h.cache.watch(k("k2"), None).await.unwrap();
    created(&mut again).await;
    // The index entry went with the dropped stream: only the new one gets k2.
    h.watch.events(vec![put(&k("k2"), "x", 11, 11, 1)]);
    assert_eq!(next_rev(&mut again).await, 11);
    // Refused watches did not leak slots.
    for _ in 0..10 {
        assert!(h.cache.watch(k("k9"), None).await.is_err());
    }
    assert_eq!(h.cache.watcher_count(), 3);
}

/// 11b. A scope's own limit, counted against the cache's too; dropping the scope ends
/// its streams after what was queued.
#[tokio::test(start_paused = true)]
async fn scope_limit_and_drop() {
    let cfg = Config {
        max_watchers: 4,
        ..config()
    };
    let h = ready(cfg, &["3.5.13"], &[], 10).await;
    let scope = h.cache.scope(2);
    let mut a = scope.watch(PREFIX, prefix_opts()).await.unwrap();
    let mut b = scope.watch(k("a"), None).await.unwrap();
    let e = scope.watch(k("b"), None).await.unwrap_err();
    assert!(matches!(e, Error::WatchLimit { limit: 2 }), "{e:?}");
    assert_eq!(e.to_string(), "at most 2 watches are allowed");
    assert_eq!((scope.open(), scope.limit()), (2, 2));
    let mut outside = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    let _fill = h.cache.watch(k("z"), None).await.unwrap();
    let other = h.cache.scope(10);
    let e = other.watch(k("b"), None).await.unwrap_err();
    assert!(
        matches!(e, Error::WatchLimit { limit: 4 }),
        "the cache's limit applies: {e:?}"
    );
    assert_eq!(other.open(), 0, "a refused watch is not counted");

    for s in [&mut a, &mut b, &mut outside] {
        created(s).await;
    }
    h.watch.events(vec![put("/app/a", "1", 11, 11, 1)]);
    h.watch.events(vec![put("/app/a", "2", 11, 12, 2)]);
    settle().await;
    drop(scope);
    for s in [&mut a, &mut b] {
        assert_eq!(next_rev(s).await, 11);
        assert_eq!(next_rev(s).await, 12);
        assert!(next(s).await.unwrap().is_none(), "ended with the scope");
    }
    h.watch.events(vec![put("/app/a", "3", 11, 13, 3)]);
    for rev in 11..=13 {
        assert_eq!(next_rev(&mut outside).await, rev);
    }
    settle().await;
    assert!(
        next(&mut a).await.unwrap().is_none(),
        "nothing after the end"
    );
    drop((a, b));
    assert_eq!(h.cache.watcher_count(), 2);
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

/// 11c. `close()`: every stream ends after what it was delivered; the upstream task
/// stops; the cache refuses new work.
#[tokio::test(start_paused = true)]
async fn close_ends_streams_after_delivered_items() {
    let cfg = Config {
        subscriber_buffer: 2,
        ..config()
    };
    let h = ready(cfg, &["3.5.13"], &[("/app/a", "a0")], 10).await;
    let mut live = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    let mut lagging = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    let mut future = watch_prefix(&h.cache, WatchOptions::new().with_start_revision(100)).await;
    created(&mut live).await;
    for rev in 11..=15 {
        h.watch.events(vec![put("/app/a", "x", 11, rev, rev - 10)]);
        assert_eq!(next_rev(&mut live).await, rev);
    }
    h.watch.events(vec![put("/app/a", "x", 11, 16, 6)]);
    settle().await;
    let c2 = h.cache.clone();
    within(h.cache.close()).await;
    within(c2.close()).await; // idempotent, from another handle
    assert!(h.watch.is_closed(), "the upstream watch was dropped");
    assert!(!h.cache.is_ready());

    assert_eq!(next_rev(&mut live).await, 16);
    assert!(next(&mut live).await.unwrap().is_none());
    // The lagging one still gets everything it was owed.
    assert!(next(&mut lagging).await.unwrap().unwrap().created());
    for rev in 11..=16 {
        assert_eq!(next_rev(&mut lagging).await, rev);
    }
    assert!(next(&mut lagging).await.unwrap().is_none());
    assert!(next(&mut future).await.unwrap().unwrap().created());
    assert!(next(&mut future).await.unwrap().is_none());

    assert!(matches!(
        h.cache.watch(k("a"), None).await,
        Err(Error::Closed)
    ));
    assert!(matches!(
        h.cache
            .get(k("a"), Some(GetOptions::new().with_serializable()))
            .await,
        Err(Error::Closed)
    ));
    assert!(matches!(
        h.cache.get(k("a"), None).await,
        Err(Error::Closed)
    ));
    assert!(matches!(h.cache.wait_ready().await, Err(Error::Closed)));
    assert!(matches!(
        h.cache.wait_for_revision(100).await,
        Err(Error::Closed)
    ));
}

/// 11d. Dropping the last handle stops the task; clones keep it alive.
#[tokio::test(start_paused = true)]
async fn dropping_the_last_handle_stops_the_task() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let Harness {
        cache, up, watch, ..
    } = h;
    let mut s = cache.watch(PREFIX, prefix_opts()).await.unwrap();
    created(&mut s).await;
    let c2 = cache.clone();
    drop(cache);
    settle().await;
    assert!(!watch.is_closed(), "a clone keeps the cache alive");
    watch.events(vec![put("/app/a", "1", 11, 11, 1)]);
    assert_eq!(next_rev(&mut s).await, 11);
    watch.events(vec![put("/app/a", "2", 11, 12, 2)]);
    settle().await;
    drop(c2);
    settle().await;
    assert!(watch.is_closed(), "the upstream task stopped");
    assert_eq!(next_rev(&mut s).await, 12);
    assert!(next(&mut s).await.unwrap().is_none());
    drop(s);
    settle().await;
    assert_eq!(
        std::sync::Arc::strong_count(&up),
        1,
        "nothing holds the upstream any more"
    );
}

/// 12. Bad input: a clear error, no slot taken, and everyone else keeps going.
#[tokio::test(start_paused = true)]
async fn bad_input_is_refused_without_side_effects() {
    let h = ready(config(), &["3.5.13"], &[("/app/a", "a0")], 10).await;
    let mut s = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    created(&mut s).await;

    refuses_bad_watches(&h).await;
    refuses_bad_gets(&h).await;
    assert_eq!(h.up.fallbacks(), 0, "bad reads never reach etcd");

    // Everyone else is unaffected.
    h.watch.events(vec![put("/app/a", "a11", 2, 11, 2)]);
    assert_eq!(next_rev(&mut s).await, 11);
    let r = h.cache.get(k("a"), None).await.unwrap();
    assert_eq!(r.kvs()[0].value(), b"a11");
}

/// A refusal of bad input: `InvalidRange`, and its text.
fn invalid(e: Error, what: &str) -> String {
    assert!(matches!(e, Error::InvalidRange { .. }), "{what}: {e:?}");
    e.to_string()
}

/// A refusal of a range outside the cache's prefix.
fn out(e: Error, what: &str) {
    assert!(matches!(e, Error::OutOfRange { .. }), "{what}: {e:?}");
}

/// Watches a cache must refuse, each with its reason; none takes a slot.
async fn refuses_bad_watches(h: &Harness) {
    let msg = invalid(h.cache.watch("", None).await.unwrap_err(), "empty key");
    assert!(msg.contains("empty key"), "{msg}");
    let msg = invalid(
        h.cache
            .watch(k("b"), Some(WatchOptions::new().with_range(k("a"))))
            .await
            .unwrap_err(),
        "end before start",
    );
    assert!(msg.contains("not after the key"), "{msg}");
    invalid(
        h.cache
            .watch(k("b"), Some(WatchOptions::new().with_range(k("b"))))
            .await
            .unwrap_err(),
        "end == start",
    );
    let msg = invalid(
        h.cache
            .watch(k("a"), Some(WatchOptions::new().with_start_revision(-1)))
            .await
            .unwrap_err(),
        "negative start revision",
    );
    assert!(msg.contains("-1"), "{msg}");
    out(
        h.cache.watch("/other", None).await.unwrap_err(),
        "outside key",
    );
    out(
        h.cache
            .watch(k("a"), Some(WatchOptions::new().with_range("/zzz")))
            .await
            .unwrap_err(),
        "range past the prefix",
    );
    out(
        h.cache
            .watch(k("a"), Some(WatchOptions::new().with_from_key()))
            .await
            .unwrap_err(),
        "from-key on a prefixed cache",
    );
    out(
        h.cache
            .watch("", Some(WatchOptions::new().with_all_keys()))
            .await
            .unwrap_err(),
        "all keys on a prefixed cache",
    );
    out(
        h.cache
            .watch("/ap", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap_err(),
        "a prefix wider than the cache's",
    );
    assert_eq!(h.cache.watcher_count(), 1, "refused watches take no slot");
}

/// Reads a cache must refuse, each with its reason.
async fn refuses_bad_gets(h: &Harness) {
    invalid(h.cache.get("", None).await.unwrap_err(), "get empty key");
    let msg = invalid(
        h.cache
            .get(k("a"), Some(GetOptions::new().with_revision(-1)))
            .await
            .unwrap_err(),
        "negative get revision",
    );
    assert!(msg.contains("-1"), "{msg}");
    invalid(
        h.cache
            .get(
                k("a"),
                Some(GetOptions::new().with_revision(-1).with_serializable()),
            )
            .await
            .unwrap_err(),
        "negative serializable get revision",
    );
    invalid(
        h.cache
            .get(k("a"), Some(GetOptions::new().with_limit(-1)))
            .await
            .unwrap_err(),
        "negative limit",
    );
    invalid(
        h.cache
            .get(k("b"), Some(GetOptions::new().with_range(k("a"))))
            .await
            .unwrap_err(),
        "get end before start",
    );
    out(
        h.cache.get("/other", None).await.unwrap_err(),
        "get outside",
    );
    out(
        h.cache
            .get(k("a"), Some(GetOptions::new().with_from_key()))
            .await
            .unwrap_err(),
        "get from-key",
    );
}

/// Invalid configurations are refused before anything starts.
#[tokio::test(start_paused = true)]
async fn invalid_config_is_refused() {
    for cfg in [
        Config {
            history_window: 0,
            ..config()
        },
        Config {
            subscriber_buffer: 0,
            ..config()
        },
        Config {
            max_watchers: 0,
            ..config()
        },
        Config {
            page_size: 0,
            ..config()
        },
    ] {
        let (up, mut watches) = FakeUpstream::new(&["3.5.13"], &[], 1);
        let e = Cache::start(cfg, up.clone()).unwrap_err();
        assert!(matches!(e, Error::InvalidConfig { .. }), "{e:?}");
        settle().await;
        assert!(watches.try_recv().is_err());
        assert!(up.lists().is_empty());
    }
}

/// Subscribers of one range with the same options share the events of a revision, and
/// a value derived from them (`events_memo`) is derived once for all of them; others get
/// their own.
#[tokio::test(start_paused = true)]
async fn events_memo_is_derived_once_per_shared_events() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut a = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    let mut b = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    let mut with_prev = watch_prefix(&h.cache, WatchOptions::new().with_prev_key()).await;
    created(&mut a).await;
    created(&mut b).await;
    created(&mut with_prev).await;
    h.watch.events(vec![put("/app/a", "x", 11, 11, 1)]);
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let derive = |events: &[crate::kv::Event]| {
        calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        events.len()
    };
    let ra = next(&mut a).await.unwrap().unwrap();
    let rb = next(&mut b).await.unwrap().unwrap();
    let first: *const usize = ra.events_memo(derive).unwrap();
    let second: *const usize = rb.events_memo(derive).unwrap();
    assert_eq!(first, second, "one value, shared");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    let rp = next(&mut with_prev).await.unwrap().unwrap();
    assert_eq!(rp.events_memo(derive), Some(&1));
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "other options, other events"
    );
    assert!(ra.events_memo(|_| "another type").is_none());
    let created_only = h
        .cache
        .watch(k("z"), None)
        .await
        .unwrap()
        .message()
        .await
        .unwrap()
        .unwrap();
    assert!(
        created_only.events_memo(derive).is_none(),
        "no events, no memo"
    );
}

/// With `keep_history_while_lagging`, a subscriber that falls 100 revisions behind a
/// 10-revision window catches up from memory, every revision once, in order; without
/// it the same subscriber gets the compaction signal.
#[tokio::test(start_paused = true)]
async fn a_lagging_subscriber_keeps_the_history_it_needs_when_asked() {
    for keep in [true, false] {
        let cfg = Config {
            subscriber_buffer: 1,
            history_window: 10,
            keep_history_while_lagging: keep,
            ..config()
        };
        let h = ready(cfg, &["3.5.13"], &[], 10).await;
        let (mut slow, mut fast) = slow_and_fast(&h).await;
        burst(&h, &mut fast, 11, 110).await;
        let mut expect = 11;
        while expect <= 110 {
            let r = next(&mut slow).await.unwrap().unwrap();
            if r.canceled() {
                assert!(!keep, "canceled at {expect} although the history was kept");
                assert!(r.compact_revision() > expect);
                break;
            }
            assert_eq!(r.revision(), expect);
            expect += 1;
        }
        assert_eq!(expect > 110, keep, "keep = {keep}");
        if keep {
            // Caught up: the next write trims the history back to its window.
            h.watch.events(vec![put("/app/a", "x", 11, 111, 101)]);
            assert_eq!(next(&mut fast).await.unwrap().unwrap().revision(), 111);
            assert_eq!(next(&mut slow).await.unwrap().unwrap().revision(), 111);
            assert_eq!(h.cache.history_span().0, 102);
        }
    }
}

/// With `keep_history_while_lagging`, a burst of upstream messages flushed at once keeps
/// its revisions until its dispatch shows whether a subscriber lags: subscribers that
/// start lagging in the middle of the burst still get every revision; when none lags,
/// the history is back within its window as soon as the burst is flushed.
#[tokio::test(start_paused = true)]
async fn a_burst_keeps_the_history_for_subscribers_that_start_lagging_in_it() {
    for buffer in [1, 128] {
        let cfg = Config {
            subscriber_buffer: buffer,
            history_window: 10,
            keep_history_while_lagging: true,
            ..config()
        };
        let h = ready(cfg, &["3.5.13"], &[], 10).await;
        let (mut slow, mut fast) = slow_and_fast(&h).await;
        // Sent before the follower runs: one burst of 30 revisions, three windows.
        for rev in 11..=40 {
            h.watch.events(vec![put("/app/a", "v", 11, rev, rev - 10)]);
        }
        for s in [&mut fast, &mut slow] {
            for rev in 11..=40 {
                let r = next(s).await.unwrap().unwrap();
                assert_eq!(
                    (r.revision(), r.canceled()),
                    (rev, false),
                    "buffer {buffer}"
                );
            }
        }
        if buffer == 1 {
            // Caught up: the next write trims the history back to its window.
            h.watch.events(vec![put("/app/a", "v", 11, 41, 31)]);
            assert_eq!(next(&mut fast).await.unwrap().unwrap().revision(), 41);
            assert_eq!(h.cache.history_span().0, 32);
        } else {
            assert_eq!(
                h.cache.history_span().0,
                31,
                "none lagged: within the window"
            );
        }
    }
}
