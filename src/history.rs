//! The revision-ordered ring of event batches that the cache replays from.
//!
//! ## Ordering
//! One [`Batch`] holds every event of one revision (a transaction's events stay
//! together). Batches are appended in strictly increasing revision order.
//!
//! ## Coverage
//! The ring *covers* the revisions `[floor, head]`: every event with a revision in that
//! interval (inside the cache's prefix) is in the ring. `head` also moves on upstream
//! progress notifications, which prove that no event happened in between. A watch can
//! start at any revision `>= floor`; below it the answer is `Compacted { floor }`.

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

use crate::events::SharedEvents;
use crate::kv::Event;

/// Every event of one revision, stored once and shared by every subscriber.
#[derive(Debug)]
pub(crate) struct Batch {
    pub(crate) revision: i64,
    /// The events, each with its previous key-value.
    with_prev: SharedEvents,
    /// The same events without the previous key-value, made on first use.
    bare: OnceLock<SharedEvents>,
    /// Key + value bytes of the events and their previous values.
    pub(crate) bytes: usize,
}

impl Batch {
    /// Builds a batch. `events` must be non-empty and all of revision `revision`.
    pub(crate) fn new(revision: i64, events: Vec<Event>) -> Arc<Batch> {
        debug_assert!(!events.is_empty());
        debug_assert!(events.iter().all(|e| e.revision() == revision));
        let bytes = events
            .iter()
            .map(|e| e.kv.payload_len() + e.prev_kv.as_ref().map_or(0, |p| p.payload_len()))
            .sum();
        Arc::new(Batch {
            revision,
            with_prev: events.into(),
            bare: OnceLock::new(),
            bytes,
        })
    }

    /// Every event of the batch, with or without previous key-values. Shared, not copied.
    #[inline]
    pub(crate) fn events(&self, with_prev: bool) -> &SharedEvents {
        if with_prev {
            &self.with_prev
        } else {
            self.bare
                .get_or_init(|| self.with_prev.iter().map(Event::without_prev).collect())
        }
    }

    /// The events as stored (with previous key-values).
    #[inline]
    pub(crate) fn all(&self) -> &[Event] {
        &self.with_prev
    }
}

/// The history as the cache's parts share it: anyone holding it reads it; only its
/// one [`HistoryWriter`], which the cache gives its follower, writes it.
#[derive(Debug)]
pub(crate) struct SharedHistory(RwLock<History>);

impl SharedHistory {
    /// `history`, shared, and its one writer.
    pub(crate) fn new(history: History) -> (Arc<Self>, HistoryWriter) {
        let shared = Arc::new(SharedHistory(RwLock::new(history)));
        (shared.clone(), HistoryWriter(shared))
    }

    /// Reads it (the writer waits meanwhile: hold it briefly).
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, History> {
        self.0.read()
    }
}

#[cfg(test)]
impl SharedHistory {
    /// A shared history the test writes itself (the crate's code writes only through
    /// the follower's [`HistoryWriter`]).
    pub(crate) fn for_test(history: History) -> Self {
        SharedHistory(RwLock::new(history))
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, History> {
        self.0.write()
    }
}

/// The one writer of a [`SharedHistory`] (see [`SharedHistory::new`]).
#[derive(Debug)]
pub(crate) struct HistoryWriter(Arc<SharedHistory>);

impl HistoryWriter {
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, History> {
        self.0 .0.write()
    }
}

/// The ring itself, shared as a [`SharedHistory`]; the follower task is its only
/// writer.
#[derive(Debug)]
pub(crate) struct History {
    batches: VecDeque<Arc<Batch>>,
    capacity: usize,
    /// Bytes held at most (the newest batch stays whatever its size).
    max_bytes: usize,
    floor: i64,
    head: i64,
    bytes: usize,
    /// While a subscriber lags, `capacity` does not evict (only `max_bytes` does).
    keep_while_lagging: bool,
}

impl History {
    /// An empty ring that keeps at most `capacity` batches and `max_bytes` bytes of keys
    /// and values (but always the newest batch), and covers nothing yet.
    pub(crate) fn new(capacity: usize, max_bytes: usize) -> Self {
        History {
            batches: VecDeque::with_capacity(capacity.min(4096)),
            capacity,
            max_bytes,
            floor: 1,
            head: 0,
            bytes: 0,
            keep_while_lagging: false,
        }
    }

    /// Keeps batches beyond `capacity` (within `max_bytes`) while a subscriber lags
    /// (`CacheBuilder::keep_history_while_lagging`).
    pub(crate) fn keeping_while_lagging(mut self, keep: bool) -> Self {
        self.keep_while_lagging = keep;
        self
    }

    /// Oldest start revision that can be replayed.
    #[inline]
    pub(crate) fn floor(&self) -> i64 {
        self.floor
    }

    /// Newest revision covered.
    #[inline]
    pub(crate) fn head(&self) -> i64 {
        self.head
    }

    /// Number of batches held.
    pub(crate) fn len(&self) -> usize {
        self.batches.len()
    }

    /// Key and value bytes referenced by the batches held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Forgets everything and covers nothing but `revision` (a fresh snapshot at it).
    pub(crate) fn reset(&mut self, revision: i64) {
        self.batches.clear();
        self.bytes = 0;
        self.floor = revision + 1;
        self.head = revision;
    }

    /// Appends a batch; evicts the oldest when full (beyond the byte budget, or beyond
    /// `capacity` unless it keeps batches for `lagging` subscribers). Returns the number
    /// evicted.
    pub(crate) fn push(&mut self, batch: Arc<Batch>, lagging: bool) -> usize {
        debug_assert!(
            batch.revision > self.head,
            "history must grow in revision order"
        );
        self.head = batch.revision;
        self.bytes += batch.bytes;
        self.batches.push_back(batch);
        self.evict(lagging)
    }

    /// Evicts the oldest batches beyond `max_bytes` (but never the newest), and beyond
    /// `capacity` unless it keeps batches for `lagging` subscribers. Returns the number
    /// evicted.
    pub(crate) fn evict(&mut self, lagging: bool) -> usize {
        let mut evicted = 0;
        let capacity_evicts = !(lagging && self.keep_while_lagging);
        while (capacity_evicts && self.batches.len() > self.capacity)
            || (self.bytes > self.max_bytes && self.batches.len() > 1)
        {
            let old = self.batches.pop_front().expect("non-empty");
            self.bytes -= old.bytes;
            self.floor = old.revision + 1;
            evicted += 1;
        }
        evicted
    }

    /// Records that no event happened up to `revision` (a progress notification).
    pub(crate) fn advance(&mut self, revision: i64) {
        if revision > self.head {
            self.head = revision;
        }
    }

    /// The batches with a revision in `(after, ..]`, oldest first.
    pub(crate) fn after(&self, after: i64) -> impl Iterator<Item = &Arc<Batch>> + '_ {
        let start = self.batches.partition_point(|b| b.revision <= after);
        self.batches.range(start..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{EventType, KeyValue};
    use proptest::prelude::*;

    fn batch(rev: i64) -> Arc<Batch> {
        Batch::new(
            rev,
            vec![Event::new(
                EventType::Put,
                KeyValue::new("k", "v", rev, rev, 1, 0),
                None,
            )],
        )
    }

    #[test]
    fn window_evicts_and_moves_floor() {
        let mut h = History::new(2, usize::MAX);
        h.reset(10);
        assert_eq!((h.floor(), h.head()), (11, 10));
        h.push(batch(12), false);
        h.push(batch(15), false);
        assert_eq!(h.floor(), 11);
        assert_eq!(h.push(batch(17), false), 1);
        assert_eq!((h.floor(), h.head()), (13, 17));
        assert_eq!(
            h.after(12).map(|b| b.revision).collect::<Vec<_>>(),
            [15, 17]
        );
        h.advance(20);
        assert_eq!(h.head(), 20);
        h.advance(18);
        assert_eq!(h.head(), 20, "head never moves backwards");
    }

    #[test]
    fn lagging_subscribers_keep_batches_beyond_the_window_within_the_byte_budget() {
        // Each batch holds 2 bytes ("k", "v"); the budget is 10.
        let mut h = History::new(2, 10).keeping_while_lagging(true);
        h.reset(0);
        for r in 1..=5 {
            assert_eq!(h.push(batch(r), true), 0);
        }
        assert_eq!((h.floor(), h.len()), (1, 5), "kept beyond the window");
        assert_eq!(h.push(batch(6), true), 1, "the byte budget still holds");
        assert_eq!((h.floor(), h.len()), (2, 5));
        // No subscriber lags any more: back to the window at the next push.
        assert_eq!(h.push(batch(7), false), 4);
        assert_eq!((h.floor(), h.len()), (6, 2));
        // Without the option the window is the window, lagging or not.
        let mut plain = History::new(2, 10);
        plain.reset(0);
        for r in 1..=5 {
            plain.push(batch(r), true);
        }
        assert_eq!((plain.floor(), plain.len()), (4, 2));
    }

    #[test]
    fn the_byte_budget_evicts_the_oldest_but_keeps_the_newest() {
        let big = |rev: i64, n: usize| {
            Batch::new(
                rev,
                vec![Event::new(
                    EventType::Put,
                    KeyValue::new("k", vec![b'x'; n], rev, rev, 1, 0),
                    None,
                )],
            )
        };
        let mut h = History::new(100, 250);
        h.reset(0);
        h.push(big(1, 100), false);
        h.push(big(2, 100), false);
        assert_eq!(h.len(), 2);
        // A third 100-byte value is over 250 bytes: the oldest goes, the floor moves.
        assert_eq!(h.push(big(3, 100), false), 1);
        assert_eq!((h.floor(), h.len()), (2, 2));
        assert!(h.bytes() <= 250);
        // One batch above the budget on its own stays (the newest always does).
        h.push(big(4, 1000), false);
        assert_eq!((h.floor(), h.len(), h.head()), (4, 1, 4));
    }

    #[test]
    fn bare_events_drop_prev_kv_once() {
        let b = Batch::new(
            3,
            vec![Event::new(
                EventType::Put,
                KeyValue::new("k", "v2", 2, 3, 2, 0),
                Some(KeyValue::new("k", "v1", 2, 2, 1, 0)),
            )],
        );
        assert!(b.events(true)[0].prev_kv().is_some());
        assert!(b.events(false)[0].prev_kv().is_none());
        assert!(b.events(false).ptr_eq(b.events(false)));
    }

    proptest! {
        #[test]
        fn ring_keeps_newest_window(cap in 1usize..16, gaps in proptest::collection::vec(1i64..5, 0..64)) {
            let mut h = History::new(cap, usize::MAX);
            h.reset(0);
            let mut rev = 0;
            let mut all = Vec::new();
            for g in gaps {
                rev += g;
                h.push(batch(rev), false);
                all.push(rev);
            }
            let held: Vec<i64> = h.after(i64::MIN).map(|b| b.revision).collect();
            let want: Vec<i64> = all.iter().rev().take(cap).rev().copied().collect();
            prop_assert_eq!(&held, &want);
            prop_assert!(held.windows(2).all(|w| w[0] < w[1]));
            // Coverage: everything >= floor that was pushed is held.
            let covered: Vec<i64> = all.iter().copied().filter(|r| *r >= h.floor()).collect();
            prop_assert_eq!(held, covered);
        }
    }
}
