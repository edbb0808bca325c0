//! Load, follow, batching, prev_kv, duplicates, reconnect and compaction.

use std::time::Duration;

use tokio_test::{assert_pending, assert_ready, task};

use super::*;
use crate::key_range::KeyRange;
use crate::read::GetOptions;
use crate::upstream::fake::{del, put, FakeUpstream, ListCall};
use crate::watch::WatchOptions;

async fn values(cache: &Cache) -> Vec<(String, String)> {
    let r = cache
        .get(
            PREFIX,
            Some(GetOptions::new().with_prefix().with_serializable()),
        )
        .await
        .expect("get");
    r.kvs()
        .iter()
        .map(|kv| (kv.key_str().unwrap().into(), kv.value_str().unwrap().into()))
        .collect()
}

/// 1. A paged list at one revision, then one watch from R + 1; ready only once the
/// watch is created.
#[tokio::test(start_paused = true)]
async fn load_pages_at_first_revision_then_watch_from_next() {
    let data = keys(5);
    let (up, mut watches) = FakeUpstream::new(&["3.5.13"], &refs(&data), 40);
    let cfg = Config {
        page_size: 2,
        ..config()
    };
    let cache = Cache::start(cfg, up.clone()).unwrap();
    let mut ready = task::spawn(cache.wait_ready());
    assert_pending!(ready.poll());
    assert!(!cache.is_ready());

    let w = next_watch(&mut watches).await;
    assert_eq!(w.start, 41, "watch from the list revision + 1");
    assert_eq!(w.range, KeyRange::for_prefix(PREFIX.as_bytes()));
    assert_eq!(
        up.lists(),
        vec![
            ListCall {
                start: "/app/".into(),
                end: "/app0".into(),
                revision: 0,
                limit: 2
            },
            ListCall {
                start: "/app/k1\0".into(),
                end: "/app0".into(),
                revision: 40,
                limit: 2
            },
            ListCall {
                start: "/app/k3\0".into(),
                end: "/app0".into(),
                revision: 40,
                limit: 2
            },
        ],
        "three pages, every page after the first at the first page's revision"
    );
    // Loaded but not confirmed: serializable reads work, ready does not.
    settle().await;
    assert_pending!(ready.poll());
    assert!(!cache.is_ready());
    assert_eq!(cache.revision(), 40);
    assert_eq!(values(&cache).await, data);

    w.created();
    settle().await;
    assert!(ready.is_woken());
    assert_ready!(ready.poll()).unwrap();
    assert!(cache.is_ready());
    assert_eq!(cache.stats().lists, 1);
    assert_eq!(cache.stats().connects, 1);
    assert_eq!(cache.stats().keys, 5);
}

/// An empty prefix lists in one page and is ready at the list revision.
#[tokio::test(start_paused = true)]
async fn empty_prefix_loads_in_one_page() {
    let h = ready(config(), &["3.5.13"], &[], 7).await;
    assert_eq!(h.up.lists().len(), 1);
    assert_eq!(h.cache.revision(), 7);
    assert!(values(&h.cache).await.is_empty());
}

/// 2. One upstream message with several revisions: one response per revision, each
/// revision's events together, prev_kv synthesized from the store.
#[tokio::test(start_paused = true)]
async fn one_response_per_revision_with_synthesized_prev_kv() {
    let h = ready(
        config(),
        &["3.5.13"],
        &[("/app/a", "a0"), ("/app/b", "b0")],
        10,
    )
    .await;
    let mut with_prev = watch_prefix(&h.cache, WatchOptions::new().with_prev_key()).await;
    let mut bare = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    let mut only_a = h
        .cache
        .watch(k("a"), Some(WatchOptions::new().with_prev_key()))
        .await
        .unwrap();
    let mut no_delete = h
        .cache
        .watch(
            PREFIX,
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_filters([crate::watch::WatchFilterType::NoDelete]),
            ),
        )
        .await
        .unwrap();
    for s in [&mut with_prev, &mut bare, &mut only_a, &mut no_delete] {
        assert_eq!(created(s).await, 10);
    }

    h.watch.events(vec![
        // 11: a transaction: a put over a listed key and a new key.
        put("/app/a", "a11", 2, 11, 2),
        put("/app/n", "n11", 11, 11, 1),
        // 12: put after put.
        put("/app/a", "a12", 2, 12, 3),
        // 13: a delete of a listed key and a key created in the same transaction.
        del("/app/b", 13),
        put("/app/m", "m13", 13, 13, 1),
    ]);
    h.watch.events(vec![
        // 14: two new keys in one transaction, and the delete of a key created at 11.
        put("/app/x", "x14", 14, 14, 1),
        put("/app/y", "y14", 14, 14, 1),
        del("/app/n", 14),
    ]);

    use EventType::Put as P;
    let s = |v: &str| v.to_string();
    let want = revisions_11_to_14();
    for (rev, evs) in &want {
        let r = next(&mut with_prev).await.unwrap().unwrap();
        assert_eq!((r.revision(), events(&r)), (*rev, evs.clone()));
        assert!(!r.is_progress_notify());

        let r = next(&mut bare).await.unwrap().unwrap();
        let no_prev: Vec<_> = evs
            .iter()
            .map(|(t, k, v, _)| (*t, k.clone(), v.clone(), None))
            .collect();
        assert_eq!((r.revision(), events(&r)), (*rev, no_prev));
    }
    // The single-key watch sees only its key's revisions.
    for (rev, prev) in [(11, "a0"), (12, "a11")] {
        let r = next(&mut only_a).await.unwrap().unwrap();
        assert_eq!(r.revision(), rev);
        assert_eq!(r.events().len(), 1);
        assert_eq!(r.events()[0].prev_kv().unwrap().value(), prev.as_bytes());
        assert_eq!(
            r.events()[0].prev_kv().unwrap().mod_revision(),
            if rev == 11 { 2 } else { 11 }
        );
    }
    // NoDelete drops the deletes, and revision 14 keeps its puts together.
    let got: Vec<(i64, usize)> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            let r = next(&mut no_delete).await.unwrap().unwrap();
            assert!(r.events().iter().all(|e| e.event_type() == P));
            v.push((r.revision(), r.events().len()));
        }
        v
    };
    assert_eq!(got, [(11, 2), (12, 1), (13, 1), (14, 2)]);

    assert_eq!(h.cache.revision(), 14);
    settle().await;
    assert!(now(&mut with_prev).is_none(), "nothing more");
    assert!(now(&mut only_a).is_none(), "nothing more");
    assert_eq!(
        values(&h.cache).await,
        vec![
            (k("a"), s("a12")),
            (k("m"), s("m13")),
            (k("x"), s("x14")),
            (k("y"), s("y14"))
        ]
    );
    // Reads at older revisions inside the window see the older state.
    assert_eq!(keys_at(&h.cache, 12).await, [k("a"), k("b"), k("n")]);
    assert_eq!(keys_at(&h.cache, 13).await, [k("a"), k("m"), k("n")]);
}

/// An event as [`events`] lists it: type, key, value, previous value.
type Ev = (EventType, String, String, Option<String>);

/// What `one_response_per_revision_with_synthesized_prev_kv` writes at revisions 11 to
/// 14, as a watch with prev_kv sees it.
fn revisions_11_to_14() -> [(i64, Vec<Ev>); 4] {
    use EventType::{Delete as D, Put as P};
    let s = |v: &str| v.to_string();
    [
        (
            11,
            vec![
                (P, k("a"), s("a11"), Some(s("a0"))),
                (P, k("n"), s("n11"), None),
            ],
        ),
        (12, vec![(P, k("a"), s("a12"), Some(s("a11")))]),
        (
            13,
            vec![
                (D, k("b"), s(""), Some(s("b0"))),
                (P, k("m"), s("m13"), None),
            ],
        ),
        (
            14,
            vec![
                (P, k("x"), s("x14"), None),
                (P, k("y"), s("y14"), None),
                (D, k("n"), s(""), Some(s("n11"))),
            ],
        ),
    ]
}

/// The keys a serializable prefix read at `rev` sees.
async fn keys_at(cache: &Cache, rev: i64) -> Vec<String> {
    cache
        .get(
            PREFIX,
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_serializable()
                    .with_revision(rev),
            ),
        )
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_owned())
        .collect()
}

/// A replay from the middle of the window gives the same responses, then goes live.
#[tokio::test(start_paused = true)]
async fn replay_from_window_then_live() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    for rev in 11..=15 {
        h.watch
            .events(vec![put("/app/a", &format!("v{rev}"), 11, rev, rev - 10)]);
    }
    within(h.cache.wait_for_revision(15)).await.unwrap();
    let mut s = h
        .cache
        .watch(
            PREFIX,
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(13)
                    .with_prev_key(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(created(&mut s).await, 15, "created at the cache's revision");
    let r = next(&mut s).await.unwrap().unwrap();
    assert_eq!(r.events()[0].revision(), 13);
    assert_eq!(
        r.revision(),
        15,
        "a replay reports the stream's revision, as etcd"
    );
    assert_eq!(r.events()[0].prev_kv().unwrap().value(), b"v12");
    assert_eq!(next_rev(&mut s).await, 14);
    assert_eq!(next_rev(&mut s).await, 15);
    h.watch.events(vec![put("/app/a", "v16", 11, 16, 6)]);
    assert_eq!(next_rev(&mut s).await, 16);
    // Below the window: created, canceled as compacted, then the end.
    let mut old = watch_prefix(&h.cache, WatchOptions::new().with_start_revision(10)).await;
    created(&mut old).await;
    assert_eq!(is_compacted(&next(&mut old).await), Some(11));
    assert!(next(&mut old).await.unwrap().is_none());
}

/// 3. Events at or below the applied revision (a resume, or etcd#20221) are dropped.
#[tokio::test(start_paused = true)]
async fn old_and_duplicate_events_are_dropped() {
    let h = ready(config(), &["3.5.13"], &[("/app/a", "a0")], 10).await;
    let mut s = watch_prefix(&h.cache, WatchOptions::new().with_prev_key()).await;
    created(&mut s).await;
    // etcd#20221: a watch from 11 returning events from before the list.
    h.watch.events(vec![
        put("/app/a", "old", 2, 5, 2),
        put("/app/old", "x", 9, 9, 1),
    ]);
    settle().await;
    assert_eq!(h.cache.revision(), 10);
    assert!(now(&mut s).is_none(), "old events must not be delivered");

    h.watch.events(vec![put("/app/a", "a11", 2, 11, 2)]);
    // A repeat of 11 (with a different value, to be sure it is not applied), then 12.
    h.watch.events(vec![
        put("/app/a", "dup", 2, 11, 2),
        put("/app/b", "dup", 11, 11, 1),
        put("/app/a", "a12", 2, 12, 3),
    ]);
    let r = next(&mut s).await.unwrap().unwrap();
    assert_eq!((r.revision(), r.events().len()), (11, 1));
    let r = next(&mut s).await.unwrap().unwrap();
    assert_eq!(r.revision(), 12);
    assert_eq!(
        r.events()[0].prev_kv().unwrap().value(),
        b"a11",
        "the repeat was not applied"
    );
    settle().await;
    assert!(now(&mut s).is_none());
    assert_eq!(values(&h.cache).await, vec![(k("a"), "a12".to_string())]);
    let stats = h.cache.stats();
    assert_eq!((stats.revision, stats.history_len), (12, 2));
}

/// Messages that arrive together are applied, then flushed together (one lock of each
/// mailbox for the burst): every revision is delivered once, in order, a progress
/// notification in the middle flushes what came before it, and the history holds
/// every revision of the burst for a replay.
#[tokio::test(start_paused = true)]
async fn a_burst_of_messages_is_delivered_whole_and_in_order() {
    let h = ready(config(), &["3.5.13"], &[("/app/a", "a0")], 10).await;
    let mut s = watch_prefix(&h.cache, WatchOptions::new()).await;
    created(&mut s).await;
    let mut a = within(h.cache.watch("/app/a", None)).await.expect("watch");
    assert!(next(&mut a).await.unwrap().unwrap().created());
    // All sent before the follower runs: one burst.
    h.watch.events(vec![put("/app/a", "a11", 2, 11, 2)]);
    h.watch.events(vec![
        put("/app/b", "b12", 12, 12, 1),
        put("/app/c", "c12", 12, 12, 1),
    ]);
    h.watch.progress(15, false);
    h.watch.events(vec![put("/app/a", "a16", 2, 16, 3)]);
    h.watch.events(vec![put("/app/b", "b17", 12, 17, 2)]);
    assert_eq!(next_rev(&mut s).await, 11);
    let r = next(&mut s).await.unwrap().unwrap();
    assert_eq!((r.revision(), r.events().len()), (12, 2));
    assert_eq!(next_rev(&mut s).await, 16);
    assert_eq!(next_rev(&mut s).await, 17);
    assert_eq!(next_rev(&mut a).await, 11);
    assert_eq!(next_rev(&mut a).await, 16);
    settle().await;
    assert!(now(&mut s).is_none() && now(&mut a).is_none(), "each once");
    assert_eq!(h.cache.revision(), 17);
    let mut replay = watch_prefix(&h.cache, WatchOptions::new().with_start_revision(11)).await;
    created(&mut replay).await;
    for rev in [11, 12, 16, 17] {
        assert_eq!(next_rev(&mut replay).await, rev);
    }
}

/// 4. A broken stream: not ready, backoff on virtual time, resume from applied + 1, no
/// gap and no duplicate for subscribers.
#[tokio::test(start_paused = true)]
async fn reconnect_resumes_after_backoff_without_gap_or_duplicate() {
    let cfg = Config {
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_secs(1),
        ..config()
    };
    let mut h = ready(cfg, &["3.5.13"], &[], 10).await;
    let mut s = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    created(&mut s).await;
    h.watch.events(vec![put("/app/a", "1", 11, 11, 1)]);
    h.watch.events(vec![put("/app/a", "2", 11, 12, 2)]);
    assert_eq!(next_rev(&mut s).await, 11);
    assert_eq!(next_rev(&mut s).await, 12);

    h.watch.fail();
    settle().await;
    assert!(!h.cache.is_ready(), "not ready while disconnected");
    assert!(h.watch.is_closed(), "the broken watch is dropped");
    // The first delay is drawn from [initial/2, initial]: nothing before 50ms.
    tokio::time::advance(Duration::from_millis(49)).await;
    settle().await;
    assert!(
        h.watches.try_recv().is_err(),
        "reconnected before the backoff"
    );
    tokio::time::advance(Duration::from_millis(51)).await;
    settle().await;
    let w = h.watches.try_recv().expect("reconnected after the backoff");
    assert_eq!(w.start, 13, "resume from the last applied revision + 1");
    assert!(
        !h.cache.is_ready(),
        "not ready before the watch is confirmed"
    );
    w.created();
    // The resumed watch repeats 12 (a member that is behind), then goes on.
    w.events(vec![
        put("/app/a", "2", 11, 12, 2),
        put("/app/a", "3", 11, 13, 3),
    ]);
    w.events(vec![put("/app/a", "4", 11, 14, 4)]);
    within(h.cache.wait_ready()).await.unwrap();
    assert_eq!(next_rev(&mut s).await, 13);
    assert_eq!(next_rev(&mut s).await, 14);
    settle().await;
    assert!(now(&mut s).is_none());
    assert_eq!(h.up.lists().len(), 1, "a resume does not re-list");
    assert_eq!(h.cache.stats().connects, 2);

    // A stream that simply ends is resumed the same way.
    drop(w);
    settle().await;
    assert!(!h.cache.is_ready());
    let w = next_watch(&mut h.watches).await; // auto-advances through the backoff
    assert_eq!(w.start, 15);
    w.created();
    w.events(vec![put("/app/a", "5", 11, 15, 5)]);
    assert_eq!(next_rev(&mut s).await, 15);
    assert!(h.cache.is_ready());
}

/// Consecutive failures back off exponentially; a confirmed watch resets the backoff.
#[tokio::test(start_paused = true)]
async fn backoff_grows_while_failing() {
    let cfg = Config {
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_secs(10),
        ..config()
    };
    let mut h = ready(cfg, &["3.5.13"], &[], 10).await;
    h.watch.fail();
    let mut waited = Vec::new();
    for _ in 0..4 {
        let t0 = tokio::time::Instant::now();
        let w = next_watch(&mut h.watches).await;
        waited.push(t0.elapsed());
        assert_eq!(w.start, 11);
        w.fail(); // fails before it is created
    }
    for (i, d) in waited.iter().enumerate() {
        let cap = Duration::from_millis(100 << i);
        assert!(
            *d >= cap / 2 && *d <= cap,
            "attempt {i}: waited {d:?}, cap {cap:?}"
        );
    }
}

/// 5. The resume revision was compacted: re-list; subscribers behind the new revision
/// get `Compacted` then the end; one waiting on a future revision continues.
#[tokio::test(start_paused = true)]
async fn compacted_resume_relists_and_compacts_only_the_behind() {
    let mut h = ready(
        config(),
        &["3.5.13"],
        &[("/app/a", "a0"), ("/app/b", "b0")],
        10,
    )
    .await;
    let mut current = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    let mut future = watch_prefix(&h.cache, WatchOptions::new().with_start_revision(30)).await;
    let mut exactly_at = h
        .cache
        .watch(k("a"), Some(WatchOptions::new().with_start_revision(26)))
        .await
        .unwrap();
    created(&mut current).await;
    created(&mut future).await;
    created(&mut exactly_at).await;
    h.watch.events(vec![put("/app/a", "a11", 2, 11, 2)]);
    assert_eq!(next_rev(&mut current).await, 11);

    h.watch.fail();
    // While disconnected, etcd moved on to 25 and compacted.
    h.up.set_data(&[("/app/a", "a20"), ("/app/c", "c21")], 25);
    let w = next_watch(&mut h.watches).await;
    assert_eq!(w.start, 12);
    // As etcd does it: the watch is created, then cancelled as compacted.
    w.created();
    w.compacted(20);
    let w = next_watch(&mut h.watches).await;
    assert_eq!(w.start, 26, "watch again from the new list revision + 1");
    let lists = h.up.lists();
    assert_eq!(lists.len(), 2);
    assert_eq!(
        lists[1].revision, 0,
        "the re-list starts at the latest revision"
    );
    assert_eq!(h.cache.revision(), 25);
    assert_eq!(
        values(&h.cache).await,
        vec![(k("a"), "a20".to_string()), (k("c"), "c21".to_string())]
    );
    assert_eq!(h.cache.history_span(), (26, 25));

    // The subscriber at 11 missed (11, 25]: Compacted, then the end.
    assert_eq!(is_compacted(&next(&mut current).await), Some(26));
    assert!(next(&mut current).await.unwrap().is_none());
    // A new watch inside the lost span is compacted too.
    let mut lost = watch_prefix(&h.cache, WatchOptions::new().with_start_revision(20)).await;
    created(&mut lost).await;
    assert_eq!(is_compacted(&next(&mut lost).await), Some(26));

    w.created();
    for rev in 26..=31 {
        w.events(vec![put("/app/a", &format!("a{rev}"), 2, rev, rev)]);
    }
    assert_eq!(next_rev(&mut future).await, 30);
    assert_eq!(next_rev(&mut future).await, 31);
    assert_eq!(next_rev(&mut exactly_at).await, 26);
    assert_eq!(h.cache.stats().lists, 2);
    assert_eq!(
        h.cache.watcher_count(),
        2,
        "a watch frees its slot when it ends, not when its stream is dropped"
    );
    drop((current, lost));
    assert_eq!(h.cache.watcher_count(), 2);
}

/// A compaction reported in the middle of a confirmed watch: the cache cannot vouch for
/// its data until the re-list is done.
#[tokio::test(start_paused = true)]
async fn not_ready_while_relisting() {
    let mut h = ready(config(), &["3.5.13"], &[("/app/a", "a0")], 10).await;
    h.up.pause_lists(true);
    h.up.set_data(&[("/app/a", "a30")], 30);
    h.watch.compacted(20);
    settle().await;
    assert!(
        !h.cache.is_ready(),
        "ready while the re-list is still running"
    );
    h.up.pause_lists(false);
    let w = next_watch(&mut h.watches).await;
    assert_eq!(w.start, 31);
    w.created();
    within(h.cache.wait_ready()).await.unwrap();
    assert_eq!(h.cache.revision(), 30);
}

/// A re-list keeps a single-key subscriber whose key provably did not change in the gap
/// (same mod_revision before and after); a changed key, an absent key (it may have been
/// created and deleted in the gap) and a prefix are compacted.
#[tokio::test(start_paused = true)]
async fn relist_keeps_single_keys_that_provably_did_not_change() {
    use crate::upstream::fake::kv;
    let mut h = ready(
        config(),
        &["3.5.13"],
        &[("/app/a", "a0"), ("/app/b", "b0")],
        10,
    )
    .await;
    let mut on_a = h.cache.watch(k("a"), None).await.unwrap();
    let mut on_b = h
        .cache
        .watch(k("b"), Some(WatchOptions::new().with_prev_key()))
        .await
        .unwrap();
    let mut on_c = h.cache.watch(k("c"), None).await.unwrap();
    let mut all = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    for s in [&mut on_a, &mut on_b, &mut on_c, &mut all] {
        created(s).await;
    }
    let held = |key: &str| {
        let cache = h.cache.clone();
        let key = k(key);
        async move {
            let opts = GetOptions::new().with_serializable();
            cache.get(key, Some(opts)).await.unwrap().kvs()[0].clone()
        }
    };
    let (a_before, b_before) = (held("a").await, held("b").await);
    h.watch.fail();
    // In the gap: a changed, c was created and deleted, b untouched (created at 3).
    h.up.set_kvs(
        vec![kv("/app/a", "a20", 2, 20, 2), kv("/app/b", "b0", 3, 3, 1)],
        25,
    );
    let w = next_watch(&mut h.watches).await;
    w.compacted(22);
    let w = next_watch(&mut h.watches).await;
    assert_eq!(w.start, 26);
    w.created();
    w.events(vec![put("/app/b", "b26", 3, 26, 2)]);
    let r = next(&mut on_b).await.unwrap().unwrap();
    assert_eq!(r.revision(), 26);
    assert_eq!(r.events()[0].prev_kv().unwrap().value(), b"b0");
    for s in [&mut on_a, &mut on_c, &mut all] {
        assert_eq!(is_compacted(&next(s).await), Some(26));
        assert!(next(s).await.unwrap().is_none());
    }
    // The store kept the key-value of the key that did not change (and its memo: a
    // typed view's decoded object), and took the new one of the key that did.
    let b_prev = r.events()[0].prev_kv().unwrap();
    assert!(std::sync::Arc::ptr_eq(&b_prev.0, &b_before.0));
    assert!(!std::sync::Arc::ptr_eq(&held("a").await.0, &a_before.0));
}

/// A list that fails half-way is retried from its first page after a backoff, and the
/// partial pages are never served.
#[tokio::test(start_paused = true)]
async fn failed_list_page_restarts_the_list() {
    let data = keys(5);
    let (up, mut watches) = FakeUpstream::new(&["3.5.13"], &refs(&data), 40);
    up.failing_lists.lock().push(1);
    let cfg = Config {
        page_size: 2,
        backoff_initial: Duration::from_millis(100),
        ..config()
    };
    let cache = Cache::start(cfg, up.clone()).unwrap();
    settle().await;
    assert_eq!(up.lists().len(), 2, "failed on the second page");
    assert_eq!(cache.revision(), 0, "nothing installed from a partial list");
    // A serializable read waits for the first snapshot (here: the retried list).
    let mut get = task::spawn(cache.get(
        PREFIX,
        Some(GetOptions::new().with_prefix().with_serializable()),
    ));
    assert_pending!(get.poll());
    let w = next_watch(&mut watches).await; // through the backoff
    let lists = up.lists();
    assert_eq!(lists.len(), 5);
    assert_eq!(
        lists[2..]
            .iter()
            .map(|l| (l.start.clone(), l.revision))
            .collect::<Vec<_>>(),
        [
            ("/app/".into(), 0),
            ("/app/k1\0".into(), 40),
            ("/app/k3\0".into(), 40)
        ]
    );
    assert_eq!(w.start, 41);
    w.created();
    within(cache.wait_ready()).await.unwrap();
    assert_eq!(values(&cache).await, data);
    assert!(get.is_woken());
    assert_eq!(assert_ready!(get.poll()).unwrap().kvs().len(), 5);
}

/// A watch opened before the first snapshot is refused at once with `NotReady` (the
/// cache never waits for its first load on a caller's behalf; `wait_ready` does), and
/// frees its slot; after the load it starts at the snapshot's revision.
#[tokio::test(start_paused = true)]
async fn watch_before_load_is_refused_at_once() {
    let (up, mut watches) = FakeUpstream::new(&["3.5.13"], &[], 40);
    up.pause_lists(true);
    let cfg = Config {
        consistent_read_timeout: Duration::from_secs(1),
        ..config()
    };
    let cache = Cache::start(cfg, up.clone()).unwrap();
    let t0 = tokio::time::Instant::now();
    let e = cache.watch(PREFIX, prefix_opts()).await.unwrap_err();
    assert!(matches!(e, crate::Error::NotReady), "{e:?}");
    assert_eq!(t0.elapsed(), Duration::ZERO);
    assert_eq!(cache.watcher_count(), 0, "the refused watch freed its slot");

    let mut pending = task::spawn(cache.wait_ready());
    assert_pending!(pending.poll());
    up.pause_lists(false);
    let w = next_watch(&mut watches).await;
    w.created();
    within(pending).await.unwrap();
    let mut s = cache.watch(PREFIX, prefix_opts()).await.unwrap();
    assert_eq!(created(&mut s).await, 40);
    w.events(vec![put("/app/a", "1", 41, 41, 1)]);
    assert_eq!(next_rev(&mut s).await, 41);
}

/// A lagging subscriber overtaken by a re-list gets its queued items, then
/// `Compacted`; the lagging count goes back to zero.
#[tokio::test(start_paused = true)]
async fn relist_compacts_lagging_subscribers() {
    let cfg = Config {
        subscriber_buffer: 1,
        ..config()
    };
    let mut h = ready(cfg, &["3.5.13"], &[], 10).await;
    let mut slow = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    created(&mut slow).await;
    for rev in 11..=13 {
        h.watch.events(vec![put("/app/a", "x", 11, rev, rev - 10)]);
    }
    settle().await;
    assert_eq!(h.cache.lagging_count(), 1);
    h.up.set_data(&[], 30);
    h.watch.compacted(20);
    let w = next_watch(&mut h.watches).await;
    assert_eq!(w.start, 31);
    assert_eq!(h.cache.lagging_count(), 0);
    assert_eq!(next_rev(&mut slow).await, 11);
    assert_eq!(is_compacted(&next(&mut slow).await), Some(31));
    assert!(next(&mut slow).await.unwrap().is_none());
}

/// A silent upstream gets a liveness check after `upstream_idle_timeout`; a check that never answers
/// (a dead connection without a reset) makes the cache reconnect, and not before.
#[tokio::test(start_paused = true)]
async fn silent_dead_upstream_is_detected_by_the_liveness_check() {
    let cfg = Config {
        upstream_idle_timeout: Duration::from_secs(30),
        ..config()
    };
    let mut h = ready(cfg, &["3.4.23"], &[], 10).await;
    // A quiet but healthy upstream: checks answer, nothing is reconnected.
    tokio::time::advance(Duration::from_secs(95)).await;
    settle().await;
    assert!(h.cache.is_ready());
    assert!(
        h.watches.try_recv().is_err(),
        "no reconnect while checks answer"
    );
    // The connection dies silently: the next check times out and the cache reconnects.
    h.up.set_stalled(true);
    tokio::time::advance(Duration::from_secs(31)).await;
    settle().await;
    tokio::time::advance(Duration::from_secs(6)).await;
    settle().await;
    assert!(
        !h.cache.is_ready(),
        "not ready once the upstream is known dead"
    );
    h.up.set_stalled(false);
    let w = next_watch(&mut h.watches).await;
    assert_eq!(w.start, 11, "resumes from the last applied revision + 1");
    w.created();
    within(h.cache.wait_ready()).await.unwrap();
}

/// A watch "from now" starts after the cluster's revision, as etcd starts it: a write
/// that completed before `watch()` but that the cache has not applied yet is not
/// delivered. With `linearizable_watch_start` off it starts after the cache's revision.
#[tokio::test(start_paused = true)]
async fn watch_from_now_starts_after_the_cluster_revision() {
    for linearizable in [true, false] {
        let cfg = Config {
            linearizable_watch_start: linearizable,
            ..config()
        };
        let h = ready(cfg, &["3.4.23"], &[], 10).await;
        // Revisions 11 and 12 are committed, but not yet sent to the cache.
        h.up.set_current_revision(12);
        let mut s = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
        assert_eq!(created(&mut s).await, if linearizable { 12 } else { 10 });
        h.watch.events(vec![put(&k("a"), "1", 11, 11, 1)]);
        h.watch.events(vec![put(&k("a"), "2", 11, 12, 2)]);
        h.watch.events(vec![put(&k("a"), "3", 11, 13, 3)]);
        let want: &[i64] = if linearizable { &[13] } else { &[11, 12, 13] };
        for &rev in want {
            assert_eq!(next_rev(&mut s).await, rev);
        }
        h.cache.close().await;
    }
}
