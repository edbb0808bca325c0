//! Fan-out: the subscriber index, per-subscriber mailboxes, lagging and catch-up.
//!
//! Subscribers that want the same payload (same key range, same `prev_kv`, same
//! filters) form one *group*; a batch's payload is computed once per group and the same
//! `Arc<[Event]>` is pushed to every member, so a delivery costs a reference count.
//!
//! Groups are found through an index, so dispatch cost grows with the number of
//! *matching* groups and members, not with all subscribers:
//! - single keys: a hash map from key to groups;
//! - prefixes: a hash map from prefix to groups, probed once per distinct prefix length;
//! - other ranges (from-key, explicit ranges that are not prefixes, all keys): a list
//!   of the distinct ranges, scanned per event (there are few distinct ranges in practice).
//!
//! ## Lagging
//! A mailbox holds at most `subscriber_buffer` deliveries. When the upstream task finds
//! it full, the subscriber becomes *lagging*: the task skips it from then on, and the
//! subscriber's own task later catches up from the history, in order, and rejoins the
//! live stream without a gap or a duplicate (see [`catch_up`]). If its position has left
//! the window by then, it ends with `Compacted`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Waker;

use bytes::Bytes;
use indexmap::IndexMap;
use parking_lot::Mutex;
use slab::Slab;

use crate::history::{Batch, History};
use crate::key_range::KeyRange;
use crate::kv::{Event, EventType};

/// Identifies one subscriber.
pub(crate) type SubId = u64;
type GroupId = usize;

/// What one subscriber receives: which keys, and in which form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Shape {
    pub(crate) range: KeyRange,
    pub(crate) prev_kv: bool,
    pub(crate) no_put: bool,
    pub(crate) no_delete: bool,
}

impl Shape {
    #[inline]
    fn wants(&self, ev: &Event) -> bool {
        match ev.event_type {
            EventType::Put if self.no_put => false,
            EventType::Delete if self.no_delete => false,
            _ => self.range.contains(ev.key()),
        }
    }

    /// The events of `batch` this shape receives: the batch's own shared slice when all
    /// of them match, a new slice (of reference-counted events) when only some do.
    pub(crate) fn select(&self, batch: &Batch) -> Option<Arc<[Event]>> {
        let all = batch.all();
        let matching = all.iter().filter(|e| self.wants(e)).count();
        if matching == 0 {
            None
        } else if matching == all.len() {
            Some(batch.events(self.prev_kv).clone())
        } else {
            let pick = all.iter().filter(|e| self.wants(e));
            Some(if self.prev_kv {
                pick.cloned().collect()
            } else {
                pick.map(Event::without_prev).collect()
            })
        }
    }
}

/// One response's worth of events for one subscriber.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub(crate) revision: i64,
    pub(crate) events: Arc<[Event]>,
}

/// Why a subscription ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The cache was closed: deliver what is queued, then end.
    Closed,
    /// The watch was cancelled (its scope was dropped): end after what is queued.
    Cancelled,
    /// The position left the window: deliver what is queued, then `Compacted`.
    Compacted(i64),
}

/// The state shared by the upstream task (producer) and one `WatchStream` (consumer).
#[derive(Debug)]
pub(crate) struct MailboxState {
    pub(crate) queue: VecDeque<Delivery>,
    cap: usize,
    pub(crate) waker: Option<Waker>,
    /// Events after `last_rev` must come from the history, not from the producer.
    pub(crate) lagging: bool,
    /// Every matching event with a revision <= `last_rev` is queued or was delivered.
    pub(crate) last_rev: i64,
    pub(crate) end: Option<End>,
}

/// A subscriber's bounded queue.
#[derive(Debug)]
pub(crate) struct Mailbox {
    pub(crate) state: Mutex<MailboxState>,
}

/// What happened to one push.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    Queued,
    Skipped,
    BecameLagging,
}

impl Mailbox {
    pub(crate) fn new(cap: usize, last_rev: i64, lagging: bool) -> Arc<Self> {
        Arc::new(Mailbox {
            state: Mutex::new(MailboxState {
                queue: VecDeque::new(),
                cap,
                waker: None,
                lagging,
                last_rev,
                end: None,
            }),
        })
    }

    /// Producer side: never blocks on the consumer. A parked consumer's waker is moved
    /// to `wakers`: the producer wakes everyone once per upstream message, so a consumer
    /// gets one wake-up for all the revisions of that message.
    #[inline]
    pub(crate) fn push(
        &self,
        revision: i64,
        events: &Arc<[Event]>,
        lagging: &AtomicUsize,
        wakers: &mut Vec<Waker>,
    ) -> Pushed {
        let mut s = self.state.lock();
        if s.lagging || s.end.is_some() || revision <= s.last_rev {
            return Pushed::Skipped;
        }
        if s.queue.len() >= s.cap {
            s.lagging = true;
            // Counted under the lock, before the consumer can clear it.
            lagging.fetch_add(1, Ordering::Relaxed);
            return Pushed::BecameLagging;
        }
        s.queue.push_back(Delivery {
            revision,
            events: events.clone(),
        });
        s.last_rev = revision;
        if let Some(w) = s.waker.take() {
            wakers.push(w);
        }
        Pushed::Queued
    }

    /// Ends the subscription (idempotent; the first reason wins) and wakes the consumer.
    pub(crate) fn end(&self, why: End) -> bool {
        let mut s = self.state.lock();
        let was_lagging = s.lagging;
        if s.end.is_none() {
            s.end = Some(why);
        }
        if matches!(why, End::Compacted(_) | End::Cancelled) {
            s.lagging = false;
        }
        let waker = s.waker.take();
        drop(s);
        if let Some(w) = waker {
            w.wake();
        }
        was_lagging && matches!(why, End::Compacted(_) | End::Cancelled)
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
}

/// Batches a catch-up scans per call at most (while it holds the history read lock).
const CATCH_UP_SCAN: usize = 512;

/// Consumer side: refills a lagging subscriber's queue from the history.
///
/// Lock order: history (read) before mailbox, and the producer never holds the
/// history lock while it pushes. So when the history has no batch after the position,
/// clearing `lagging` here cannot miss a batch: any later batch is appended after this
/// read lock is released and is then pushed by the producer; a batch that is already
/// appended but not yet pushed is read here and skipped by the producer (`revision <=
/// last_rev`).
///
/// Returns `true` if the subscriber stopped lagging.
pub(crate) fn catch_up(history: &History, mailbox: &Mailbox, shape: &Shape) -> bool {
    let mut s = mailbox.state.lock();
    if !s.lagging {
        return false;
    }
    if s.last_rev + 1 < history.floor() {
        s.lagging = false;
        if s.end.is_none() || s.end == Some(End::Closed) {
            s.end = Some(End::Compacted(history.floor()));
        }
        return true;
    }
    let mut pos = s.last_rev;
    for (scanned, batch) in history.after(s.last_rev).enumerate() {
        // Bounded work per call, so the writer waits for at most this many batches; the
        // consumer calls again.
        if s.queue.len() >= s.cap || scanned >= CATCH_UP_SCAN {
            s.last_rev = pos;
            return false;
        }
        if let Some(events) = shape.select(batch) {
            s.queue.push_back(Delivery {
                revision: batch.revision,
                events,
            });
        }
        pos = batch.revision;
    }
    s.last_rev = pos.max(history.head());
    s.lagging = false;
    true
}

/// The members of a group. Most exact-key groups have one member, which is kept inline;
/// larger groups use an `IndexMap` for O(1) removal and a dense iteration.
#[derive(Default)]
enum Members {
    #[default]
    Empty,
    One(SubId, Arc<Mailbox>),
    Many(IndexMap<SubId, Arc<Mailbox>>),
}

impl Members {
    fn insert(&mut self, id: SubId, mailbox: Arc<Mailbox>) {
        match std::mem::take(self) {
            Members::Empty => *self = Members::One(id, mailbox),
            Members::One(first, first_mailbox) => {
                let mut map = IndexMap::with_capacity(2);
                map.insert(first, first_mailbox);
                map.insert(id, mailbox);
                *self = Members::Many(map);
            }
            Members::Many(mut map) => {
                map.insert(id, mailbox);
                *self = Members::Many(map);
            }
        }
    }

    fn remove(&mut self, id: SubId) -> Option<Arc<Mailbox>> {
        match self {
            Members::One(first, _) if *first == id => match std::mem::take(self) {
                Members::One(_, mailbox) => Some(mailbox),
                _ => unreachable!("matched One above"),
            },
            Members::Many(map) => {
                let mailbox = map.swap_remove(&id);
                if map.is_empty() {
                    *self = Members::Empty;
                }
                mailbox
            }
            _ => None,
        }
    }

    fn is_empty(&self) -> bool {
        matches!(self, Members::Empty)
    }

    fn mailboxes(&self) -> impl Iterator<Item = &Arc<Mailbox>> + '_ {
        self.iter().map(|(_, m)| m)
    }

    fn iter(&self) -> impl Iterator<Item = (SubId, &Arc<Mailbox>)> + '_ {
        let (one, many) = match self {
            Members::Empty => (None, None),
            Members::One(id, m) => (Some((*id, m)), None),
            Members::Many(map) => (None, Some(map.iter().map(|(id, m)| (*id, m)))),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

struct Group {
    shape: Shape,
    members: Members,
}

/// The subscriber index. Guarded by a mutex in `Shared`; the upstream task holds it for
/// one dispatch at a time, `watch()` and `Drop for WatchStream` hold it to add/remove.
#[derive(Default)]
pub(crate) struct Index {
    groups: Slab<Group>,
    by_shape: HashMap<Shape, GroupId>,
    exact: HashMap<Bytes, Vec<GroupId>>,
    prefix: HashMap<Bytes, Vec<GroupId>>,
    /// Distinct prefix lengths with a count of prefix groups of that length.
    prefix_lens: Vec<(usize, usize)>,
    ranges: Vec<GroupId>,
    subs: HashMap<SubId, GroupId>,
    /// Scratch space for multi-event batches.
    scratch: Vec<GroupId>,
    /// Set (under the lock) when the cache closed: no subscriber may be added after.
    pub(crate) closed: bool,
    /// Wakers of consumers that got deliveries and were parked; see [`Index::take_wakers`].
    wakers: Vec<Waker>,
}

impl Index {
    /// Adds a subscriber.
    pub(crate) fn insert(&mut self, id: SubId, shape: Shape, mailbox: Arc<Mailbox>) {
        let gid = match self.by_shape.get(&shape) {
            Some(&g) => g,
            None => {
                let g = self.groups.insert(Group {
                    shape: shape.clone(),
                    members: Members::default(),
                });
                let range = &shape.range;
                if range.is_single() {
                    self.exact.entry(range.start.clone()).or_default().push(g);
                } else if let Some(p) = range.as_prefix() {
                    self.prefix.entry(p.clone()).or_default().push(g);
                    let len = p.len();
                    match self.prefix_lens.iter_mut().find(|(l, _)| *l == len) {
                        Some((_, n)) => *n += 1,
                        None => {
                            self.prefix_lens.push((len, 1));
                            self.prefix_lens.sort_unstable();
                        }
                    }
                } else {
                    self.ranges.push(g);
                }
                self.by_shape.insert(shape, g);
                g
            }
        };
        self.groups[gid].members.insert(id, mailbox);
        self.subs.insert(id, gid);
    }

    /// Removes a subscriber; returns its mailbox.
    pub(crate) fn remove(&mut self, id: SubId) -> Option<Arc<Mailbox>> {
        let gid = self.subs.remove(&id)?;
        let group = &mut self.groups[gid];
        let mailbox = group.members.remove(id);
        if group.members.is_empty() {
            let group = self.groups.remove(gid);
            self.by_shape.remove(&group.shape);
            let range = &group.shape.range;
            let drop_from = |map: &mut HashMap<Bytes, Vec<GroupId>>, key: &Bytes| {
                if let Some(v) = map.get_mut(key) {
                    v.retain(|&g| g != gid);
                    if v.is_empty() {
                        map.remove(key);
                    }
                }
            };
            if range.is_single() {
                drop_from(&mut self.exact, &range.start);
            } else if let Some(p) = range.as_prefix() {
                drop_from(&mut self.prefix, p);
                let len = p.len();
                if let Some(i) = self.prefix_lens.iter().position(|(l, _)| *l == len) {
                    self.prefix_lens[i].1 -= 1;
                    if self.prefix_lens[i].1 == 0 {
                        self.prefix_lens.remove(i);
                    }
                }
            } else {
                self.ranges.retain(|&g| g != gid);
            }
        }
        mailbox
    }

    /// Calls `f` with every group whose range holds `key`.
    #[inline]
    fn for_groups(&self, key: &[u8], mut f: impl FnMut(GroupId)) {
        if let Some(gs) = self.exact.get(key) {
            gs.iter().for_each(|&g| f(g));
        }
        for &(len, _) in &self.prefix_lens {
            if len > key.len() {
                break;
            }
            if let Some(gs) = self.prefix.get(&key[..len]) {
                gs.iter().for_each(|&g| f(g));
            }
        }
        for &g in &self.ranges {
            if self.groups[g].shape.range.contains(key) {
                f(g);
            }
        }
    }

    /// Pushes `batch` to every matching subscriber. Returns how many became lagging.
    pub(crate) fn dispatch(&mut self, batch: &Batch, lagging: &AtomicUsize) -> DispatchStats {
        let mut stats = DispatchStats::default();
        let events = batch.all();
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        if events.len() == 1 {
            self.for_groups(events[0].key(), |g| scratch.push(g));
        } else {
            for ev in events {
                self.for_groups(ev.key(), |g| scratch.push(g));
            }
            scratch.sort_unstable();
            scratch.dedup();
        }
        for &g in &scratch {
            let group = &self.groups[g];
            let Some(payload) = group.shape.select(batch) else {
                continue;
            };
            for mailbox in group.members.mailboxes() {
                match mailbox.push(batch.revision, &payload, lagging, &mut self.wakers) {
                    Pushed::Queued => stats.delivered += 1,
                    Pushed::Skipped => {}
                    Pushed::BecameLagging => stats.lagged += 1,
                }
            }
        }
        self.scratch = scratch;
        stats
    }

    /// Moves out the wakers collected by [`dispatch`](Self::dispatch) since the last
    /// call. Wake them after releasing the index lock.
    pub(crate) fn take_wakers(&mut self, into: &mut Vec<Waker>) {
        into.append(&mut self.wakers);
    }

    /// Every subscriber's mailbox (for close and re-list; not on the dispatch path).
    pub(crate) fn all(&self) -> impl Iterator<Item = (SubId, &Shape, &Arc<Mailbox>)> + '_ {
        self.groups
            .iter()
            .flat_map(|(_, g)| g.members.iter().map(move |(id, m)| (id, &g.shape, m)))
    }
}

/// Counters from one dispatch.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct DispatchStats {
    pub(crate) delivered: usize,
    pub(crate) lagged: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key_range::RangeSpec;
    use crate::kv::KeyValue;
    use proptest::prelude::*;

    fn shape(key: &[u8], spec: RangeSpec) -> Shape {
        Shape {
            range: KeyRange::new(key, &spec).unwrap(),
            prev_kv: false,
            no_put: false,
            no_delete: false,
        }
    }

    fn put(key: &[u8], rev: i64) -> Event {
        Event::new(
            EventType::Put,
            KeyValue::new(key.to_vec(), "v", rev, rev, 1, 0),
            None,
        )
    }

    #[test]
    fn capacity_one_lags_and_catches_up_in_order() {
        let mut history = History::new(100);
        history.reset(1);
        let mut index = Index::default();
        let s = shape(b"k", RangeSpec::Prefix);
        let mb = Mailbox::new(1, 1, false);
        index.insert(1, s.clone(), mb.clone());
        let lag = AtomicUsize::new(0);
        for rev in 2..10 {
            let b = Batch::new(rev, vec![put(b"k1", rev)]);
            history.push(b.clone());
            index.dispatch(&b, &lag);
        }
        assert_eq!(lag.load(Ordering::Relaxed), 1);
        let mut got = Vec::new();
        loop {
            let d = mb.state.lock().queue.pop_front();
            match d {
                Some(d) => got.push(d.revision),
                None => {
                    if !catch_up(&history, &mb, &s) && !mb.state.lock().lagging {
                        break;
                    }
                    if mb.state.lock().queue.is_empty() && !mb.state.lock().lagging {
                        break;
                    }
                }
            }
        }
        assert_eq!(got, (2..10).collect::<Vec<_>>());
        // Live again: the next batch is pushed, not skipped.
        let b = Batch::new(10, vec![put(b"k1", 10)]);
        history.push(b.clone());
        index.dispatch(&b, &lag);
        assert_eq!(mb.state.lock().queue.pop_front().unwrap().revision, 10);
    }

    #[test]
    fn lagging_past_the_window_is_compacted() {
        let mut history = History::new(2);
        history.reset(1);
        let s = shape(b"k", RangeSpec::Single);
        let mb = Mailbox::new(1, 1, true);
        for rev in 2..6 {
            history.push(Batch::new(rev, vec![put(b"k", rev)]));
        }
        assert!(catch_up(&history, &mb, &s));
        assert_eq!(mb.state.lock().end, Some(End::Compacted(4)));
    }

    #[test]
    fn partial_batches_share_group_payload() {
        let mut index = Index::default();
        let s = shape(b"a", RangeSpec::Single);
        let m1 = Mailbox::new(8, 0, false);
        let m2 = Mailbox::new(8, 0, false);
        index.insert(1, s.clone(), m1.clone());
        index.insert(2, s, m2.clone());
        let b = Batch::new(5, vec![put(b"a", 5), put(b"b", 5)]);
        let stats = index.dispatch(&b, &AtomicUsize::new(0));
        assert_eq!(stats.delivered, 2);
        let d1 = m1.state.lock().queue.pop_front().unwrap();
        let d2 = m2.state.lock().queue.pop_front().unwrap();
        assert_eq!(d1.events.len(), 1);
        assert!(Arc::ptr_eq(&d1.events, &d2.events), "one payload per group");
        assert!(index.remove(1).is_some());
        assert!(index.remove(2).is_some());
        assert!(index.exact.is_empty() && index.groups.is_empty());
    }

    fn arb_shape() -> impl Strategy<Value = Shape> {
        let key = proptest::collection::vec(b'a'..b'd', 1..4);
        (key.clone(), 0u8..5, key).prop_filter_map("valid", |(k, spec, end)| {
            let spec = match spec {
                0 => RangeSpec::Single,
                1 => RangeSpec::Prefix,
                2 => RangeSpec::FromKey,
                3 => RangeSpec::AllKeys,
                _ => RangeSpec::Range(end),
            };
            KeyRange::new(&k, &spec).ok().map(|range| Shape {
                range,
                prev_kv: false,
                no_put: false,
                no_delete: false,
            })
        })
    }

    proptest! {
        /// The index finds exactly the subscribers that a brute-force scan finds,
        /// also after removals.
        #[test]
        fn index_matches_brute_force(shapes in proptest::collection::vec(arb_shape(), 1..40),
                                     keys in proptest::collection::vec(proptest::collection::vec(b'a'..b'e', 1..5), 1..20),
                                     remove_every in 2usize..5) {
            let mut index = Index::default();
            let mut live = Vec::new();
            for (i, s) in shapes.iter().enumerate() {
                index.insert(i as u64, s.clone(), Mailbox::new(1000, 0, false));
                live.push((i as u64, s.clone()));
            }
            for i in (0..shapes.len()).step_by(remove_every) {
                index.remove(i as u64);
                live.retain(|(id, _)| *id != i as u64);
            }
            for key in keys {
                let mut found = Vec::new();
                index.for_groups(&key, |g| found.extend(index.groups[g].members.iter().map(|(id, _)| id)));
                found.sort_unstable();
                let mut want: Vec<u64> = live.iter().filter(|(_, s)| s.range.contains(&key)).map(|(id, _)| *id).collect();
                want.sort_unstable();
                prop_assert_eq!(found, want);
            }
        }
    }
}
