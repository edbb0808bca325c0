//! A subscriber's mailbox: the bounded queue between the follower (the producer, which
//! never blocks on it) and the subscriber's stream (the consumer), with the lagging
//! state and the catch-up from the history.
//!
//! ## Lagging
//! A mailbox holds at most `subscriber_buffer` deliveries. When the producer finds it
//! full, the subscriber becomes *lagging*: the producer skips it from then on, and the
//! consumer, once it has read what is queued, refills the queue from the history
//! itself, in order ([`Mailbox::poll`]), and rejoins the live stream without a gap or a
//! duplicate. If its position has left the history window by then, the subscription
//! ends as compacted. Lagging subscribers are counted in one [`LagCount`], changed only
//! by the transitions in this file, under the mailbox lock.
//!
//! A lagging subscriber's position is just below the next revision it is owed and has
//! not queued (the one that did not fit, whether the producer or a catch-up found the
//! queue full), never at its last queued revision: the window may move past revisions
//! that do not match it without compacting it, as etcd does not compact a watch for
//! revisions it was not owed. A replay from a start revision catches up when it is
//! registered, not at its consumer's first poll, for the same reason. The one
//! exception: a catch-up longer than one bounded scan (`CATCH_UP_SCAN` batches, a
//! window larger than that) leaves the position at the last batch scanned between two
//! scans, so a writer that appends more than a whole scan's worth of revisions in that
//! gap evicts batches no scan read, and the subscriber is compacted although it may have
//! been owed none of them.
//!
//! ## Ordering
//! The position `last_rev` says: every matching event with a revision `<= last_rev` is
//! queued or was delivered. The producer pushes revisions in increasing order and never
//! one at or below the position, and the catch-up moves the position forward only, so a
//! consumer sees strictly increasing revisions, each once.
//!
//! Lock order: the index, then the history, then a mailbox. The producer never holds
//! the history lock while it pushes; see [`Mailbox::poll`] for why the hand-over from
//! catch-up to live delivery loses nothing.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Waker;

use parking_lot::Mutex;

use super::filter::Filter;
use crate::error::Error;
use crate::events::SharedEvents;
use crate::history::{History, SharedHistory};

/// One response's worth of events for one subscriber.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub(crate) revision: i64,
    pub(crate) events: SharedEvents,
}

/// Why a subscription ended.
#[derive(Debug, Clone)]
pub(crate) enum End {
    /// The cache was closed: deliver what is queued (and caught up), then end.
    Closed,
    /// The cache stopped on this failure (a permanent upstream error, or its follower
    /// panicked): deliver what is queued (and caught up), then the error.
    Failed(Arc<Error>),
    /// The watch was cancelled: end after what is queued.
    Cancelled,
    /// The position left the window: deliver what is queued, then the compaction
    /// signal with this compact revision.
    Compacted(i64),
}

/// The number of lagging subscribers, and the deliveries their catch-ups queued not yet
/// taken for the metrics. Owned by the subscriber registry; changed only by the mailbox
/// transitions below.
#[derive(Debug, Default)]
pub(crate) struct LagCount {
    lagging: AtomicUsize,
    replayed: AtomicUsize,
}

impl LagCount {
    /// Subscribers lagging now.
    pub(crate) fn get(&self) -> usize {
        self.lagging.load(Ordering::Relaxed)
    }

    fn enter(&self) {
        self.lagging.fetch_add(1, Ordering::Relaxed);
    }

    fn leave(&self) {
        self.lagging.fetch_sub(1, Ordering::Relaxed);
    }

    /// Deliveries queued by catch-ups since the last call. A load of a line that only
    /// catch-ups write when there is nothing to take, so that every consumer's poll can
    /// call it.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn take_replayed(&self) -> usize {
        if self.replayed.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.replayed.swap(0, Ordering::Relaxed)
    }
}

/// What the consumer found.
#[derive(Debug)]
pub(crate) enum Polled {
    /// The next delivery.
    Delivery(Delivery),
    /// Nothing queued, not lagging, not ended: every matching event up to `revision`
    /// (the cache's revision, read under the mailbox lock) has been delivered. The
    /// consumer's waker is registered.
    Idle { revision: i64 },
    /// The subscription ended, after everything it was owed.
    Ended(End),
}

#[derive(Debug)]
struct State {
    queue: VecDeque<Delivery>,
    waker: Option<Waker>,
    /// At most this many deliveries queued (`u32`, packed beside `lagging`: a bound
    /// above 4 billion responses is taken as 4 billion).
    cap: u32,
    /// Events after `last_rev` must come from the history, not from the producer.
    lagging: bool,
    /// Every matching event with a revision <= `last_rev` is queued or was delivered.
    last_rev: i64,
    end: Option<End>,
}

/// A subscriber's bounded queue, with its filter (which its catch-up reads, and by
/// which the index finds a group of one member: the filter is stored once per
/// subscriber, here).
#[derive(Debug)]
pub(crate) struct Mailbox {
    filter: Filter,
    state: Mutex<State>,
}

/// Batches one scan of a catch-up reads at most (while it holds the history read lock).
pub(crate) const CATCH_UP_SCAN: usize = 512;

impl Mailbox {
    /// A mailbox for `filter` positioned at `last_rev`; `lagging` if it must first
    /// catch up from the history (a replay), which `lag` counts.
    pub(crate) fn new(
        filter: Filter,
        cap: usize,
        last_rev: i64,
        lagging: bool,
        lag: &LagCount,
    ) -> Arc<Self> {
        if lagging {
            lag.enter();
        }
        Arc::new(Mailbox {
            filter,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                cap: u32::try_from(cap).unwrap_or(u32::MAX),
                waker: None,
                lagging,
                last_rev,
                end: None,
            }),
        })
    }

    /// What the subscriber receives.
    pub(crate) fn filter(&self) -> &Filter {
        &self.filter
    }

    /// Producer side: pushes revisions (in increasing order, one burst of upstream
    /// messages) under one lock, never blocking on the consumer, so that the line of a
    /// mailbox its consumer on the other core touched last moves once per burst, not
    /// once per revision. A parked consumer's waker is moved to `wakers` if anything
    /// was queued: the producer wakes everyone once per burst. Returns how many it
    /// queued and how many times it became lagging (0 or 1: a lagging subscriber takes
    /// nothing more from the producer).
    #[inline]
    pub(crate) fn push_all<'a>(
        &self,
        deliveries: impl Iterator<Item = (i64, &'a SharedEvents)>,
        lag: &LagCount,
        wakers: &mut Vec<Waker>,
    ) -> (usize, usize) {
        let mut s = self.state.lock();
        let (mut queued, mut lagged) = (0, 0);
        for (revision, events) in deliveries {
            if s.lagging || s.end.is_some() {
                break;
            }
            if revision <= s.last_rev {
                continue;
            }
            if s.queue.len() >= s.cap as usize {
                s.lagging = true;
                // Pushes come in revision order to every matching subscriber that is
                // not lagging, so every matching revision below this one is queued
                // already: the catch-up starts here, not at the last queued revision
                // (which may be far behind when the revisions in between did not
                // match).
                s.last_rev = revision - 1;
                // Counted under the lock, before the consumer can clear it.
                lag.enter();
                lagged += 1;
                break;
            }
            s.queue.push_back(Delivery {
                revision,
                events: events.clone(),
            });
            s.last_rev = revision;
            queued += 1;
        }
        if queued > 0 {
            if let Some(w) = s.waker.take() {
                wakers.push(w);
            }
        }
        (queued, lagged)
    }

    /// Ends the subscription (idempotent; the first reason wins) and wakes the consumer.
    /// A cancelled or compacted subscription stops lagging: it is owed nothing more.
    pub(crate) fn end(&self, why: End, lag: &LagCount) {
        let mut s = self.state.lock();
        let owed_nothing = matches!(why, End::Compacted(_) | End::Cancelled);
        if s.end.is_none() {
            s.end = Some(why);
        }
        if s.lagging && owed_nothing {
            s.lagging = false;
            lag.leave();
        }
        let waker = s.waker.take();
        drop(s);
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// The position: every matching event up to it is queued or delivered.
    pub(crate) fn last_rev(&self) -> i64 {
        self.state.lock().last_rev
    }

    /// Moves a live (not lagging, not ended) subscriber's position to `revision`
    /// without a delivery, when it is known that nothing it matches happened in
    /// between. Returns false if the subscriber is lagging or ended.
    pub(crate) fn skip_to(&self, revision: i64) -> bool {
        let mut s = self.state.lock();
        if s.lagging || s.end.is_some() {
            return false;
        }
        s.last_rev = s.last_rev.max(revision);
        true
    }

    /// `revision()` (read under the lock) if nothing is queued, the subscriber is not
    /// catching up and not ended: every matching event up to it has been delivered.
    pub(crate) fn idle_revision(&self, revision: impl Fn() -> i64) -> Option<i64> {
        let s = self.state.lock();
        (s.queue.is_empty() && !s.lagging && s.end.is_none()).then(revision)
    }

    /// Consumer side: the next delivery, catching up from `history` while lagging.
    ///
    /// When the history has no batch after the position, clearing `lagging` cannot miss
    /// a batch: a later batch is appended after the history read lock is released and
    /// is then pushed by the producer; a batch that is appended but not yet pushed is
    /// read here and skipped by the producer (`revision <= last_rev`).
    pub(crate) fn poll(
        &self,
        waker: &Waker,
        history: &SharedHistory,
        lag: &LagCount,
        revision: impl Fn() -> i64,
    ) -> Polled {
        loop {
            match self.poll_queue(waker, &revision) {
                Some(polled) => return polled,
                None => self.replay(history, lag),
            }
        }
    }

    /// Consumer side, the fast path: the next queued delivery, if there is one (no
    /// waker registered, no catch-up: when it finds none, the consumer
    /// [`poll`](Self::poll)s). Takes what `poll` would take first.
    #[inline]
    pub(crate) fn pop(&self) -> Option<Delivery> {
        self.state.lock().queue.pop_front()
    }

    /// Consumer side, the fast path of a batch receive: up to `max` queued deliveries,
    /// in order, under one hold of the lock (what as many [`pop`](Self::pop)s would
    /// take, without locking a line the producer also locks once per delivery).
    /// Returns how many `take` was given.
    #[inline]
    pub(crate) fn pop_up_to(&self, max: usize, take: impl FnMut(Delivery)) -> usize {
        let mut s = self.state.lock();
        let n = max.min(s.queue.len());
        s.queue.drain(..n).for_each(take);
        n
    }

    /// One look at the queue (under the mailbox lock): the next delivery, the end, or
    /// idle; `None` while lagging with nothing queued, when the caller must catch up.
    fn poll_queue(&self, waker: &Waker, revision: &impl Fn() -> i64) -> Option<Polled> {
        let mut s = self.state.lock();
        if let Some(d) = s.queue.pop_front() {
            return Some(Polled::Delivery(d));
        }
        if s.lagging {
            return None;
        }
        if let Some(end) = &s.end {
            return Some(Polled::Ended(end.clone()));
        }
        match &s.waker {
            Some(w) if w.will_wake(waker) => {}
            _ => s.waker = Some(waker.clone()),
        }
        // Read under the lock: the producer publishes a revision after its pushes,
        // so every push up to it is in the (empty) queue already.
        Some(Polled::Idle {
            revision: revision(),
        })
    }

    /// Catches a lagging subscriber up from the history until its queue is full (its
    /// position then just below the next matching revision that is not queued), it is
    /// live again, or it is compacted: one bounded scan after another, the history
    /// lock released in between, so the writer waits for one scan at most. Also called
    /// right after a replaying subscriber is registered, so that its position does not
    /// wait for its consumer's first poll.
    pub(crate) fn replay(&self, history: &SharedHistory, lag: &LagCount) {
        while self.catch_up(&history.read(), lag, CATCH_UP_SCAN) {}
    }

    /// One bounded scan of the catch-up (at most `scan` batches, while the caller holds
    /// the history read lock). Returns true if it stopped at the bound: scan again.
    pub(crate) fn catch_up(&self, history: &History, lag: &LagCount, scan: usize) -> bool {
        let mut s = self.state.lock();
        if !s.lagging {
            return false;
        }
        if s.last_rev + 1 < history.floor() {
            s.lagging = false;
            lag.leave();
            if matches!(s.end, None | Some(End::Closed) | Some(End::Failed(_))) {
                s.end = Some(End::Compacted(history.floor()));
            }
            return false;
        }
        let queued_before = s.queue.len();
        let result = Self::scan(&mut s, history, &self.filter, lag, scan);
        let queued = s.queue.len().saturating_sub(queued_before);
        if queued > 0 {
            lag.replayed.fetch_add(queued, Ordering::Relaxed);
        }
        result
    }

    /// The scan of [`catch_up`](Self::catch_up), under the mailbox lock.
    fn scan(
        s: &mut State,
        history: &History,
        filter: &Filter,
        lag: &LagCount,
        scan: usize,
    ) -> bool {
        let mut pos = s.last_rev;
        for (scanned, batch) in history.after(s.last_rev).enumerate() {
            if scanned >= scan {
                s.last_rev = pos;
                return true;
            }
            if let Some(events) = filter.select(batch) {
                if s.queue.len() >= s.cap as usize {
                    // As in `push`: every matching revision below this one is queued,
                    // so the position is just below it, not at the last queued one
                    // (which may be far behind when the revisions in between did not
                    // match, and the window may move past those).
                    s.last_rev = batch.revision - 1;
                    return false;
                }
                s.queue.push_back(Delivery {
                    revision: batch.revision,
                    events,
                });
            }
            pos = batch.revision;
        }
        s.last_rev = pos.max(history.head());
        s.lagging = false;
        lag.leave();
        false
    }

    /// Whether the subscriber is lagging now (benchmarks).
    #[cfg(feature = "unstable-bench-internals")]
    pub(crate) fn is_lagging(&self) -> bool {
        self.state.lock().lagging
    }

    /// Takes every queued delivery out (benchmarks and tests).
    #[cfg(any(test, feature = "unstable-bench-internals"))]
    pub(crate) fn take_queued(&self) -> Vec<Delivery> {
        self.state.lock().queue.drain(..).collect()
    }

    /// Drops every queued delivery in place; returns how many (benchmarks: a drain
    /// that costs what a consumer's pops cost, without an allocation).
    #[cfg(feature = "unstable-bench-internals")]
    pub(crate) fn clear_queued(&self) -> usize {
        let mut s = self.state.lock();
        let n = s.queue.len();
        s.queue.clear();
        n
    }
}

#[cfg(test)]
mod tests {
    //! The mailbox's unit tests; [`interleaving`] explores every interleaving of the
    //! hand-over between the producer and a lagging consumer.

    mod interleaving;

    use super::*;
    use crate::history::Batch;
    use crate::key_range::{KeyRange, RangeSpec};
    use crate::kv::{EventType, KeyValue};

    fn put(key: &[u8], rev: i64) -> crate::kv::Event {
        crate::kv::Event::new(
            EventType::Put,
            KeyValue::new(key.to_vec(), "v", rev, rev, 1, 0),
            None,
        )
    }

    fn filter(key: &[u8]) -> Filter {
        Filter::range(KeyRange::new(key, &RangeSpec::Prefix).unwrap())
    }

    /// Drains a mailbox as a stream would; returns the revisions and how it ended.
    fn drain(mb: &Mailbox, history: &SharedHistory, lag: &LagCount) -> (Vec<i64>, Option<End>) {
        let mut got = Vec::new();
        loop {
            match mb.poll(futures_util::task::noop_waker_ref(), history, lag, || 0) {
                Polled::Delivery(d) => got.push(d.revision),
                Polled::Idle { .. } => return (got, None),
                Polled::Ended(e) => return (got, Some(e)),
            }
        }
    }

    #[test]
    fn capacity_one_lags_and_catches_up_in_order() {
        let history = SharedHistory::for_test(History::new(100, usize::MAX));
        history.write().reset(1);
        let lag = LagCount::default();
        let f = filter(b"k");
        let mb = Mailbox::new(f.clone(), 1, 1, false, &lag);
        let mut wakers = Vec::new();
        for rev in 2..10 {
            let b = Batch::new(rev, vec![put(b"k1", rev)]);
            history.write().push(b.clone(), false);
            if let Some(events) = f.select(&b) {
                mb.push_all([(rev, &events)].into_iter(), &lag, &mut wakers);
            }
        }
        assert_eq!(lag.get(), 1);
        let (got, end) = drain(&mb, &history, &lag);
        assert_eq!(got, (2..10).collect::<Vec<_>>());
        assert!(end.is_none());
        assert_eq!(lag.get(), 0);
        // Live again: the next batch is pushed, not skipped.
        let b = Batch::new(10, vec![put(b"k1", 10)]);
        history.write().push(b.clone(), false);
        let events = f.select(&b).unwrap();
        let pushed = mb.push_all([(10, &events)].into_iter(), &lag, &mut wakers);
        assert_eq!(pushed, (1, 0), "queued");
        assert_eq!(drain(&mb, &history, &lag).0, [10]);
    }

    /// A burst pushed under one lock: revisions at or below the position are skipped,
    /// the first that does not fit makes the subscriber lag with its position just
    /// below it (nothing after it is queued), and a parked consumer is woken once.
    #[test]
    fn a_burst_fills_the_queue_then_lags_below_the_first_that_did_not_fit() {
        let lag = LagCount::default();
        let f = filter(b"k");
        let mb = Mailbox::new(f.clone(), 2, 3, false, &lag);
        let history = SharedHistory::for_test(History::new(100, usize::MAX));
        let waker = futures_util::task::noop_waker();
        assert!(matches!(
            mb.poll(&waker, &history, &lag, || 3),
            Polled::Idle { revision: 3 }
        ));
        let events: Vec<SharedEvents> = (0..8)
            .map(|rev| f.select(&Batch::new(rev, vec![put(b"k1", rev)])).unwrap())
            .collect();
        let mut wakers = Vec::new();
        let burst = [2, 3, 4, 6, 7].map(|rev| (rev, &events[rev as usize]));
        let (queued, lagged) = mb.push_all(burst.into_iter(), &lag, &mut wakers);
        assert_eq!((queued, lagged), (2, 1));
        assert_eq!(wakers.len(), 1, "one wake for the burst");
        assert_eq!(lag.get(), 1);
        assert_eq!(
            mb.last_rev(),
            7 - 1,
            "just below the first that did not fit, 7"
        );
        let queued: Vec<i64> = mb.take_queued().iter().map(|d| d.revision).collect();
        assert_eq!(queued, [4, 6]);
        // Lagging: a later burst is the catch-up's, not the producer's.
        let later = [(8, &events[7])];
        assert_eq!(mb.push_all(later.into_iter(), &lag, &mut wakers), (0, 0));
        assert_eq!(wakers.len(), 1, "nothing queued, nobody woken");
    }

    fn push_batch(history: &SharedHistory, rev: i64, key: &[u8]) -> Arc<Batch> {
        let b = Batch::new(rev, vec![put(key, rev)]);
        history.write().push(b.clone(), false);
        b
    }

    /// A catch-up that fills the queue keeps scanning past revisions that do not match,
    /// and stops just below the first matching one that does not fit: the window may
    /// then move past the revisions that did not match without compacting the
    /// subscriber.
    #[test]
    fn a_full_catch_up_stops_below_the_next_matching_revision() {
        let history = SharedHistory::for_test(History::new(4, usize::MAX));
        history.write().reset(10);
        let lag = LagCount::default();
        let f = filter(b"a");
        push_batch(&history, 11, b"a");
        push_batch(&history, 12, b"b");
        push_batch(&history, 13, b"b");
        push_batch(&history, 14, b"a");
        let mb = Mailbox::new(f.clone(), 1, 10, true, &lag);
        let noop = futures_util::task::noop_waker_ref();
        let first = mb.poll(noop, &history, &lag, || 0);
        assert!(
            matches!(first, Polled::Delivery(ref d) if d.revision == 11),
            "{first:?}"
        );
        assert_eq!(mb.last_rev(), 13, "12 and 13 do not match");
        push_batch(&history, 15, b"b");
        push_batch(&history, 16, b"b");
        assert_eq!(
            history.read().floor(),
            13,
            "11 and 12 left the window, 14 did not"
        );
        let (got, end) = drain(&mb, &history, &lag);
        assert_eq!(got, [14]);
        assert!(end.is_none(), "not compacted: {end:?}");
        assert_eq!(lag.get(), 0);
    }

    /// A poll does not return between two bounded scans of a catch-up: when it returns,
    /// the position is just below the next matching revision that is not queued (or the
    /// subscriber is live), however far the scan went, so a window larger than one scan
    /// does not compact a sparse subscriber that is read slowly.
    #[test]
    fn a_catch_up_longer_than_one_scan_is_finished_before_the_poll_returns() {
        let history = SharedHistory::for_test(History::new(700, usize::MAX));
        history.write().reset(10);
        let lag = LagCount::default();
        let f = filter(b"a");
        push_batch(&history, 11, b"a");
        for rev in 12..=611 {
            push_batch(&history, rev, b"b");
        }
        push_batch(&history, 612, b"a");
        let mb = Mailbox::new(f.clone(), 1, 10, true, &lag);
        let noop = futures_util::task::noop_waker_ref();
        let first = mb.poll(noop, &history, &lag, || 0);
        assert!(
            matches!(first, Polled::Delivery(ref d) if d.revision == 11),
            "{first:?}"
        );
        assert_eq!(mb.last_rev(), 611);
        for rev in 613..=1230 {
            push_batch(&history, rev, b"b");
        }
        assert_eq!(
            history.read().floor(),
            531,
            "more than one scan past 11, not 612"
        );
        let (got, end) = drain(&mb, &history, &lag);
        assert_eq!(got, [612]);
        assert!(end.is_none(), "not compacted: {end:?}");
    }

    /// A replay from a start revision catches up when it is registered, not at its
    /// consumer's first poll: a consumer that reads late does not find its start
    /// evicted (and itself compacted) while everything it is owed is in the window.
    #[test]
    fn a_replay_catches_up_at_registration_not_at_the_first_poll() {
        use crate::subscribers::{Registered, Subscribers};
        let history = SharedHistory::for_test(History::new(4, usize::MAX));
        history.write().reset(10);
        let subs = Subscribers::new(16, 1);
        let f = filter(b"a");
        let b11 = push_batch(&history, 11, b"b");
        subs.lock().dispatch(&b11);
        let slot = subs.acquire(None).unwrap();
        let Registered::Live { mailbox, .. } = subs
            .register_as(subs.reserve_id(), f.clone(), 11, 0, &history, || 11, &slot)
            .unwrap()
        else {
            panic!("11 is inside the window");
        };
        assert_eq!(subs.lagging(), 0, "caught up at once: 11 does not match");
        for rev in 12..=16 {
            let b = push_batch(&history, rev, b"b");
            subs.lock().dispatch(&b);
        }
        let b = push_batch(&history, 17, b"a");
        subs.lock().dispatch(&b);
        assert_eq!(history.read().floor(), 14, "its start left the window");
        let (got, end) = drain(&mailbox, &history, subs.lag());
        assert_eq!(got, [17]);
        assert!(end.is_none(), "not compacted: {end:?}");
    }

    #[test]
    fn behind_the_window_ends_compacted_and_uncounts() {
        let history = SharedHistory::for_test(History::new(2, usize::MAX));
        history.write().reset(1);
        let lag = LagCount::default();
        let f = filter(b"k");
        let mb = Mailbox::new(f.clone(), 4, 1, true, &lag);
        for rev in 2..10 {
            history
                .write()
                .push(Batch::new(rev, vec![put(b"k1", rev)]), false);
        }
        let (got, end) = drain(&mb, &history, &lag);
        assert!(got.is_empty());
        assert!(matches!(end, Some(End::Compacted(f)) if f == history.read().floor()));
        assert_eq!(lag.get(), 0);
    }
}
