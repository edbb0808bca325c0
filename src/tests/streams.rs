//! Several watches on one stream, as etcd-client's `WatchStream`: a `created` response
//! per watch with its id, events tagged with their watch's id, `cancel(id)`, stream-wide
//! progress, `split()`, chosen ids, headers, revisions that never go backwards, and the
//! compaction signal as etcd sends it.

use std::time::Duration;

use tokio::time::advance;
use tokio_test::{assert_pending, assert_ready, task};

use super::*;
use crate::upstream::fake::{put, FAKE_HEADER};

/// The next response, which must exist.
async fn resp(s: &mut WatchStream) -> WatchResponse {
    next(s).await.expect("no error").expect("not ended")
}

#[tokio::test(start_paused = true)]
async fn several_watches_share_one_stream_and_cancel_by_id() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut s = h.cache.watch(k("a"), None).await.unwrap();
    s.watch(k("b"), None).await.unwrap();
    let (c0, c1) = (resp(&mut s).await, resp(&mut s).await);
    assert!(c0.created() && c1.created());
    assert_eq!(
        (c0.watch_id(), c1.watch_id()),
        (0, 1),
        "ids from 0, as etcd"
    );
    assert_eq!(s.watch_id(), 0);
    h.watch.events(vec![put(&k("b"), "1", 11, 11, 1)]);
    h.watch.events(vec![put(&k("a"), "1", 12, 12, 1)]);
    // Each watch's responses are in order; the two watches' may interleave either way.
    let (r0, r1) = (resp(&mut s).await, resp(&mut s).await);
    let mut got = [
        (r0.watch_id(), r0.events()[0].revision()),
        (r1.watch_id(), r1.events()[0].revision()),
    ];
    got.sort_unstable();
    assert_eq!(got, [(0, 12), (1, 11)]);
    assert_eq!(h.cache.watcher_count(), 2);

    s.cancel(1).await.unwrap();
    let r = resp(&mut s).await;
    assert!(
        r.canceled() && r.watch_id() == 1 && r.compact_revision() == 0,
        "{r:?}"
    );
    assert_eq!(
        h.cache.watcher_count(),
        1,
        "a canceled watch frees its slot"
    );
    s.cancel(42).await.unwrap(); // unknown ids are ignored, as etcd ignores them
    h.watch.events(vec![put(&k("b"), "2", 11, 13, 2)]);
    h.watch.events(vec![put(&k("a"), "2", 12, 14, 2)]);
    let r = resp(&mut s).await;
    assert_eq!((r.watch_id(), r.events()[0].revision()), (0, 14));
    // As etcd: ids are never given twice on a stream.
    s.watch(k("c"), None).await.unwrap();
    assert_eq!(resp(&mut s).await.watch_id(), 2);
    s.cancel(0).await.unwrap();
    s.cancel(2).await.unwrap();
    assert!(resp(&mut s).await.canceled());
    assert!(resp(&mut s).await.canceled());
    assert!(
        next(&mut s).await.unwrap().is_none(),
        "no watch left: the end"
    );
    assert_eq!(h.cache.watcher_count(), 0);
}

/// A stream's one watch is served by a fast path while deliveries are queued; a cancel
/// handed over meanwhile still goes first: its `canceled` is the next response, and
/// nothing that was queued for the watch follows it (as etcd).
#[tokio::test(start_paused = true)]
async fn a_cancel_goes_before_what_is_queued_for_the_watch() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut s = h.cache.watch(k("a"), None).await.unwrap();
    assert!(resp(&mut s).await.created());
    for rev in 11..=13 {
        h.watch.events(vec![put(&k("a"), "v", 11, rev, rev - 10)]);
    }
    settle().await;
    assert_eq!(resp(&mut s).await.events()[0].revision(), 11);
    s.cancel(0).await.unwrap();
    let r = resp(&mut s).await;
    assert!(r.canceled() && r.watch_id() == 0, "{r:?}");
    assert!(next(&mut s).await.unwrap().is_none(), "nothing after it");
}

/// A batch receive takes what is queued for a single watch at once (its fast path), at
/// most `max`, in order, each response with its own header; a reply still goes first,
/// and a cancel goes before what is queued after it.
#[tokio::test(start_paused = true)]
async fn a_batch_receive_takes_what_is_queued_in_order_and_a_cancel_first() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut s = h.cache.watch(k("a"), None).await.unwrap();
    for rev in 11..=15 {
        h.watch.events(vec![put(&k("a"), "v", 11, rev, rev - 10)]);
    }
    settle().await;
    let mut out = Vec::new();
    assert_eq!(s.messages(&mut out, 1).await.unwrap(), 1);
    assert!(out[0].created(), "the reply first: {:?}", out[0]);
    out.clear();
    assert_eq!(s.messages(&mut out, 3).await.unwrap(), 3, "at most max");
    assert_eq!(s.messages(&mut out, 64).await.unwrap(), 2, "the rest");
    let got: Vec<_> = out
        .iter()
        .map(|r| (r.watch_id(), r.revision(), r.events()[0].revision()))
        .collect();
    let want: Vec<_> = (11..=15).map(|rev| (0, rev, rev)).collect();
    assert_eq!(got, want);
    for rev in 16..=17 {
        h.watch.events(vec![put(&k("a"), "v", 11, rev, rev - 10)]);
    }
    settle().await;
    s.cancel(0).await.unwrap();
    out.clear();
    assert_eq!(s.messages(&mut out, 64).await.unwrap(), 1, "{out:?}");
    assert!(out[0].canceled() && out[0].watch_id() == 0, "{out:?}");
    assert!(next(&mut s).await.unwrap().is_none(), "nothing after it");
}

#[tokio::test(start_paused = true)]
async fn chosen_watch_ids_are_honoured_and_duplicates_refused() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut s = h
        .cache
        .watch(k("a"), Some(WatchOptions::new().with_watch_id(7)))
        .await
        .unwrap();
    assert_eq!(resp(&mut s).await.watch_id(), 7);
    let e = s
        .watch(k("b"), Some(WatchOptions::new().with_watch_id(7)))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::WatchIdInUse { watch_id: 7 }), "{e:?}");
    assert_eq!(h.cache.watcher_count(), 1, "the refused watch took no slot");
    let e = s
        .watch(k("b"), Some(WatchOptions::new().with_watch_id(-3)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("negative watch id"), "{e}");
    s.watch(k("b"), None).await.unwrap();
    assert_eq!(resp(&mut s).await.watch_id(), 0);
}

/// As etcd: a cancel frees its id at once (a watch added next may take it, and the
/// next automatic id may be it), nothing of the canceled watch is sent after the
/// cancel, and the replies (`created`, `canceled`) keep the order of the requests,
/// also when nothing was read in between.
#[tokio::test(start_paused = true)]
async fn a_cancel_frees_its_id_at_once_and_replies_keep_the_requests_order() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut s = h.cache.watch_stream();
    let id = |n| Some(WatchOptions::new().with_watch_id(n));
    s.watch(k("a"), id(1)).await.unwrap();
    s.watch(k("b"), id(2)).await.unwrap();
    h.watch.events(vec![put(&k("a"), "1", 11, 11, 1)]);
    settle().await;
    s.cancel(2).await.unwrap();
    s.cancel(1).await.unwrap();
    s.watch(k("c"), id(1)).await.unwrap();
    s.watch(k("d"), None).await.unwrap();
    let mut replies = Vec::new();
    for _ in 0..6 {
        let r = resp(&mut s).await;
        replies.push((r.watch_id(), r.created(), r.canceled(), r.events().len()));
    }
    assert_eq!(
        replies,
        [
            (1, true, false, 0),
            (2, true, false, 0),
            (2, false, true, 0),
            (1, false, true, 0),
            (1, true, false, 0),
            (0, true, false, 0),
        ],
        "the event of watch 1, not read before its cancel, is not sent"
    );
    assert!(now(&mut s).is_none());
    assert_eq!(h.cache.watcher_count(), 2);
    h.watch.events(vec![put(&k("c"), "1", 12, 12, 1)]);
    let r = resp(&mut s).await;
    assert_eq!((r.watch_id(), r.events().len()), (1, 1), "the new watch 1");
}

#[tokio::test(start_paused = true)]
async fn responses_carry_the_upstream_identity_in_their_header() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut s = watch_prefix(&h.cache, WatchOptions::new()).await;
    let c = resp(&mut s).await;
    let header = c.header().expect("a header");
    assert_eq!(
        (header.cluster_id(), header.member_id(), header.raft_term()),
        (
            FAKE_HEADER.cluster_id,
            FAKE_HEADER.member_id,
            FAKE_HEADER.raft_term
        )
    );
    assert_eq!(header.revision(), 10);
    assert!(!c.fragment());
}

#[tokio::test(start_paused = true)]
async fn a_watch_below_the_window_is_created_then_canceled_as_compacted() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut s = watch_prefix(&h.cache, WatchOptions::new().with_start_revision(3)).await;
    assert!(resp(&mut s).await.created());
    let r = resp(&mut s).await;
    assert!(r.canceled(), "{r:?}");
    assert_eq!(
        r.compact_revision(),
        11,
        "the oldest revision a watch can start from"
    );
    assert!(
        r.cancel_reason().contains("compacted"),
        "{}",
        r.cancel_reason()
    );
    assert!(next(&mut s).await.unwrap().is_none());
    assert_eq!(h.cache.watcher_count(), 0);
    // Reads name the same revision.
    let e = h
        .cache
        .get(
            k("a"),
            Some(crate::read::GetOptions::new().with_revision(3)),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Compacted {
                compact_revision: 11
            }
        ),
        "{e:?}"
    );
}

/// A stream-wide progress request is answered once, with watch id -1, at a revision up
/// to which every watch on the stream has been delivered.
#[tokio::test(start_paused = true)]
async fn stream_progress_covers_every_watch_on_the_stream() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut s = h.cache.watch(k("a"), None).await.unwrap();
    s.watch(k("b"), None).await.unwrap();
    resp(&mut s).await;
    resp(&mut s).await;
    h.watch.events(vec![put(&k("b"), "1", 11, 11, 1)]);
    settle().await;
    s.request_progress().await.unwrap();
    // The event for watch 1 comes first: progress waits until it is delivered.
    let r = resp(&mut s).await;
    assert_eq!(r.events().len(), 1);
    let p = resp(&mut s).await;
    assert!(p.is_progress_notify());
    assert_eq!((p.watch_id(), p.revision()), (-1, 11));
    assert!(now(&mut s).is_none(), "one request, one answer");
}

/// A stream-wide progress request that the cache cannot answer yet (a watch from now
/// starts at the cluster's revision, ahead of the cache) waits until the cache gets
/// there, asking etcd for progress meanwhile, and never reports a revision below one
/// already reported.
#[tokio::test(start_paused = true)]
async fn stream_progress_waits_for_the_cache_without_going_backwards() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut s = h.cache.watch(k("a"), None).await.unwrap();
    assert_eq!(resp(&mut s).await.revision(), 10);
    h.up.set_current_revision(15);
    s.watch(k("b"), None).await.unwrap();
    assert_eq!(
        resp(&mut s).await.revision(),
        15,
        "created at the cluster's revision"
    );
    let mut s = task::spawn(s);
    within(s.request_progress()).await.unwrap();
    assert_pending!(s.poll_next());
    settle().await;
    assert!(h.up.requests() >= 1, "the cache asks etcd for progress");
    h.watch.progress(15, true);
    settle().await;
    let p = assert_ready!(s.poll_next()).unwrap().unwrap();
    assert!(p.is_progress_notify());
    assert_eq!((p.watch_id(), p.revision()), (-1, 15));
}

/// A stream-wide progress request on a stream with a watch from a start the cache has
/// not reached is answered once the cache reaches it, not at the request's deadline
/// below it (fixed etcd defers it: `rev < w.startRev`, etcd#20221); meanwhile nothing
/// polls on a clock, and after the deadline the cache stops asking etcd for progress.
#[tokio::test(start_paused = true)]
async fn stream_progress_waits_for_a_start_ahead_of_the_cache() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut s = h.cache.watch(k("a"), None).await.unwrap();
    assert!(resp(&mut s).await.created());
    let ahead = WatchOptions::new().with_start_revision(14);
    s.watch(k("b"), Some(ahead)).await.unwrap();
    let c = resp(&mut s).await;
    assert!(c.created());
    assert_eq!(c.revision(), 10, "created at the cache's revision, as etcd");
    let mut s = task::spawn(s);
    within(s.request_progress()).await.unwrap();
    assert_pending!(s.poll_next(), "not at 10, below the start 14");
    h.watch.progress(13, true);
    settle().await;
    assert!(s.is_woken(), "a new revision wakes the stream");
    assert_pending!(s.poll_next(), "nor at 13");
    advance(config().consistent_read_timeout).await;
    assert!(s.is_woken(), "its deadline wakes it once");
    assert_pending!(s.poll_next(), "nor at its deadline");
    settle().await;
    let asked = h.up.requests();
    advance(Duration::from_secs(600)).await;
    assert!(!s.is_woken(), "nothing polls on a clock after the deadline");
    assert_eq!(h.up.requests(), asked, "nor asks etcd for progress");
    h.watch.progress(14, false);
    settle().await;
    let p = assert_ready!(s.poll_next()).unwrap().unwrap();
    assert!(p.is_progress_notify());
    assert_eq!(
        (p.watch_id(), p.revision()),
        (-1, 14),
        "once the cache is at 14"
    );
    assert!(now(&mut s).is_none(), "one request, one answer");
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

/// `split()`: one task adds watches while another reads; the response half ends once
/// no watch is left and the sender is gone.
#[tokio::test(start_paused = true)]
async fn split_streams_add_watches_from_another_task() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let (mut tx, mut rx) = h.cache.watch_stream().split();
    let mut reader = task::spawn(async move {
        let mut seen = Vec::new();
        while let Some(r) = rx.message().await.unwrap() {
            seen.push((r.watch_id(), r.created(), r.canceled(), r.events().len()));
        }
        seen
    });
    assert_pending!(reader.poll(), "an empty split stream stays open");
    tx.watch(k("a"), None).await.unwrap();
    settle().await;
    h.watch.events(vec![put(&k("a"), "1", 11, 11, 1)]);
    settle().await;
    assert_pending!(reader.poll(), "the event is read");
    tx.cancel(0).await.unwrap();
    settle().await;
    assert_pending!(reader.poll(), "still open while the sender lives");
    drop(tx);
    let seen = within(reader).await;
    assert_eq!(
        seen,
        [
            (0, true, false, 0),
            (0, false, false, 1),
            (0, false, true, 0)
        ]
    );
}

/// Closing the cache ends every stream after what it was delivered, split or not.
#[tokio::test(start_paused = true)]
async fn close_ends_split_streams_too() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let (_tx, mut rx) = h.cache.watch_stream().split();
    let mut reader = task::spawn(async move { rx.message().await });
    assert_pending!(reader.poll());
    h.cache.close().await;
    advance(Duration::from_millis(1)).await;
    assert!(within(reader).await.unwrap().is_none());
}

/// The builders that are `const fn` in etcd-client are `const fn` here too.
#[test]
fn option_builders_are_const_as_in_etcd_client() {
    const W: WatchOptions = WatchOptions::new()
        .with_start_revision(5)
        .with_prev_key()
        .with_progress_notify()
        .with_watch_id(3)
        .with_fragment();
    const G: crate::read::GetOptions = crate::read::GetOptions::new()
        .with_limit(2)
        .with_revision(4)
        .with_serializable()
        .with_keys_only()
        .with_count_only()
        .with_min_mod_revision(1)
        .with_max_mod_revision(9)
        .with_min_create_revision(1)
        .with_max_create_revision(9);
    assert_eq!(W.watch_id(), 3);
    assert!(G.serializable());
}

/// `messages` takes everything ready in one call (up to its bound), in order, waiting
/// only for the first; then it waits again.
#[tokio::test(start_paused = true)]
async fn messages_takes_every_ready_response_at_once() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut s = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    let mut other = h.cache.watch(PREFIX, prefix_opts()).await.unwrap();
    let mut out = Vec::new();
    assert_eq!(s.messages(&mut out, 16).await.unwrap(), 1, "created alone");
    assert!(out[0].created());
    assert!(resp(&mut other).await.created());
    for rev in 11..=15 {
        h.watch
            .events(vec![put("/app/a", &rev.to_string(), 11, rev, rev - 10)]);
    }
    // `other` reads them one by one: all five are delivered by then.
    for rev in 11..=15 {
        assert_eq!(resp(&mut other).await.revision(), rev);
    }
    out.clear();
    assert_eq!(s.messages(&mut out, 3).await.unwrap(), 3, "bounded by max");
    assert_eq!(s.messages(&mut out, 16).await.unwrap(), 2, "the rest");
    let revs: Vec<i64> = out.iter().map(|r| r.revision()).collect();
    assert_eq!(revs, [11, 12, 13, 14, 15]);
    // Nothing ready: it waits for the next one.
    let mut next = task::spawn(async {
        let mut more = Vec::new();
        s.messages(&mut more, 16).await.map(|n| (n, more))
    });
    assert_pending!(next.poll());
    h.watch.events(vec![put("/app/a", "16", 11, 16, 6)]);
    advance(Duration::from_millis(1)).await;
    let (n, more) = assert_ready!(next.poll()).unwrap();
    assert_eq!((n, more[0].revision()), (1, 16));
}

/// Watches from now added one after another on a stream do not wait for etcd each:
/// `watch()` returns at once, the watches share barrier reads, their `created`
/// responses come in the order of the requests, and each starts after a revision etcd
/// had when it was added (a write the cache had not applied yet is not delivered).
#[tokio::test(start_paused = true)]
async fn watches_added_one_after_another_share_one_barrier_read() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let calls = || h.up.current_calls.load(std::sync::atomic::Ordering::SeqCst);
    let mut s = h.cache.watch_stream();
    // etcd has written revision 11 (on /app/a); the cache has not applied it yet.
    h.up.set_current_revision(11);
    let before = calls();
    const N: i64 = 1_000;
    for _ in 0..N {
        let mut added = task::spawn(s.watch(k("a"), None));
        // Returns without waiting for etcd.
        assert_ready!(added.poll()).unwrap();
    }
    for id in 0..N {
        let r = resp(&mut s).await;
        assert!(r.created() && r.watch_id() == id, "created in order: {r:?}");
        assert_eq!(r.revision(), 11, "created at etcd's revision when added");
    }
    assert!(
        calls() - before <= 2,
        "{N} opens, {} barrier reads",
        calls() - before
    );
    h.watch.events(vec![put(&k("a"), "1", 11, 11, 1)]);
    h.watch.events(vec![put(&k("a"), "2", 11, 12, 2)]);
    let mut seen = vec![0; N as usize];
    for _ in 0..N {
        let r = resp(&mut s).await;
        assert_eq!(r.events()[0].revision(), 12, "11 was written before: {r:?}");
        seen[r.watch_id() as usize] += 1;
    }
    assert!(seen.iter().all(|&n| n == 1), "each watch once");
}

/// A watch added from now starts after etcd's revision when it was added, even if the
/// stream is read only much later: what was written after it is delivered, although
/// the cache applied it before the stream was polled.
#[tokio::test(start_paused = true)]
async fn a_watch_added_to_a_stream_read_late_starts_when_added() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let (mut tx, mut rx) = h.cache.watch_stream().split();
    tx.watch(k("a"), None).await.unwrap();
    settle().await; // the barrier read answers 10; nobody reads the stream
    h.watch.events(vec![put(&k("a"), "1", 11, 11, 1)]);
    h.watch.events(vec![put(&k("a"), "2", 11, 12, 2)]);
    settle().await;
    let r = within(rx.message()).await.unwrap().unwrap();
    assert!(r.created() && r.revision() == 10, "{r:?}");
    for want in [11, 12] {
        let r = within(rx.message()).await.unwrap().unwrap();
        assert_eq!(r.events()[0].revision(), want);
    }
}

/// A watch canceled while it is still learning its start: its `created`, then its
/// `canceled`, nothing else; its slot is freed; a watch added after it keeps its turn.
#[tokio::test(start_paused = true)]
async fn a_watch_canceled_while_opening_gets_created_then_canceled() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut s = h.cache.watch_stream();
    h.up.set_stalled(true); // the barrier read does not answer yet
    s.watch(k("a"), None).await.unwrap();
    s.cancel(0).await.unwrap();
    s.watch(k("a"), Some(WatchOptions::new().with_start_revision(11)))
        .await
        .unwrap();
    let mut next = task::spawn(next(&mut s));
    settle().await;
    assert_pending!(next.poll(), "nothing before the first watch's created");
    drop(next);
    h.up.set_stalled(false);
    let kinds: Vec<_> = [resp(&mut s).await, resp(&mut s).await, resp(&mut s).await]
        .iter()
        .map(|r| (r.watch_id(), r.created(), r.canceled()))
        .collect();
    assert_eq!(
        kinds,
        [(0, true, false), (0, false, true), (1, true, false)]
    );
    h.watch.events(vec![put(&k("a"), "1", 11, 11, 1)]);
    let r = resp(&mut s).await;
    assert_eq!((r.watch_id(), r.events()[0].revision()), (1, 11));
    assert_eq!(
        h.cache.watcher_count(),
        1,
        "the canceled watch's slot is free"
    );
}

/// A cancel of an open watch sent after the create of a watch still opening: the
/// replies keep the order of the requests (the new watch's `created`, then the
/// `canceled`), although the canceled watch ends at once: it gets nothing written after
/// the cancel, and its slot is free at the stream's next poll.
#[tokio::test(start_paused = true)]
async fn a_cancel_after_a_create_still_opening_is_answered_after_its_created() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut s = h.cache.watch_stream();
    s.watch(k("b"), None).await.unwrap();
    let r = resp(&mut s).await;
    assert!(r.created() && r.watch_id() == 0, "{r:?}");
    h.up.set_stalled(true); // watch 1's barrier read does not answer yet
    s.watch(k("a"), None).await.unwrap();
    s.cancel(0).await.unwrap();
    let mut first = task::spawn(next(&mut s));
    settle().await;
    assert_pending!(first.poll(), "nothing before watch 1's created");
    drop(first);
    assert_eq!(
        h.cache.watcher_count(),
        1,
        "the canceled watch's slot is free once the stream has taken the cancel"
    );
    h.watch.events(vec![put(&k("b"), "1", 11, 11, 1)]);
    settle().await;
    h.up.set_stalled(false);
    let created = resp(&mut s).await;
    let canceled = resp(&mut s).await;
    assert_eq!(
        [created, canceled].map(|r| (r.watch_id(), r.created(), r.canceled())),
        [(1, true, false), (0, false, true)]
    );
    h.watch.events(vec![put(&k("a"), "1", 12, 12, 1)]);
    let r = resp(&mut s).await;
    assert_eq!(
        (r.watch_id(), r.events()[0].revision()),
        (1, 12),
        "nothing of the canceled watch: {r:?}"
    );
}

/// A stream dropped while a watch is opening leaves nothing behind.
#[tokio::test(start_paused = true)]
async fn a_stream_dropped_while_a_watch_opens_leaves_nothing() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut s = h.cache.watch_stream();
    s.watch(k("a"), None).await.unwrap();
    drop(s);
    settle().await;
    assert_eq!(h.cache.watcher_count(), 0);
    assert_eq!(h.cache.lagging_count(), 0);
}

/// `Cache::watch` returns an open watch, as `etcd_client::Client::watch` returns once
/// etcd created it: a write after it returns is delivered.
#[tokio::test(start_paused = true)]
async fn cache_watch_returns_an_open_watch() {
    let h = ready(config(), &["3.5.13"], &[], 10).await;
    let mut opened = task::spawn(h.cache.watch(k("a"), None));
    assert_pending!(opened.poll(), "waits for etcd's revision");
    settle().await;
    let mut s = assert_ready!(opened.poll()).unwrap();
    assert_eq!(h.cache.watcher_count(), 1);
    h.watch.events(vec![put(&k("a"), "1", 11, 11, 1)]);
    let r = resp(&mut s).await;
    assert!(r.created() && r.revision() == 10);
    assert_eq!(resp(&mut s).await.events()[0].revision(), 11);
}
