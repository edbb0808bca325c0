//! The subscriber index: which subscribers a batch goes to, found without scanning
//! every subscriber.
//!
//! Subscribers with the same [`Filter`] (key range, `prev_kv`, event filters) form one
//! *group*; a batch's payload is selected once per group and the same `Arc<[Event]>` is
//! pushed to every member, so a delivery costs a reference count. Dispatch cost grows
//! with the number of *matching* groups and members, not with all subscribers:
//! - single keys: a hash map from key to groups;
//! - prefixes: a hash map from prefix to groups, probed once per distinct prefix length;
//! - other ranges (from-key, explicit ranges that are not prefixes, all keys): a list
//!   of the distinct ranges, scanned per event (there are few distinct ranges in practice).
//!
//! The hash tables hold only group ids (8 bytes an entry): the key, prefix or filter an
//! entry stands for is read from its group, so an exact-key subscriber's key is not
//! stored again for each table. A key or prefix has at most eight groups (a filter is its
//! range and three flags), so the entries that share a hash stay few. A group is in one
//! table only, found there by its filter when a member joins or leaves; there is no map
//! from subscriber to group (a subscriber is removed by its id and its mailbox's filter,
//! which every caller holds).

use std::borrow::Borrow;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::task::Waker;

use hashbrown::HashTable;
use indexmap::IndexMap;
use parking_lot::MutexGuard;
use slab::Slab;

use super::filter::Filter;
use super::mailbox::{End, LagCount, Mailbox};
use crate::events::SharedEvents;
use crate::history::Batch;

/// Identifies one subscriber, unique within a cache.
pub(crate) type SubId = u64;

type GroupId = usize;

/// The members of a group. Most exact-key groups have one member, which is kept inline
/// and whose mailbox holds the group's filter; larger groups box an `IndexMap` (O(1)
/// removal, dense iteration) with a copy of the filter, so that a one-member group
/// carries neither.
enum Members {
    One(SubId, Arc<Mailbox>),
    Many(Box<Many>),
}

/// The members of a group of more than one.
struct Many {
    filter: Filter,
    map: IndexMap<SubId, Arc<Mailbox>>,
}

impl Members {
    /// Adds a member (its filter is the group's).
    fn insert(&mut self, id: SubId, mailbox: Arc<Mailbox>) {
        match self {
            Members::One(first, first_mailbox) => {
                let mut map = IndexMap::with_capacity(2);
                map.insert(*first, first_mailbox.clone());
                map.insert(id, mailbox);
                *self = Members::Many(Box::new(Many {
                    filter: first_mailbox.filter().clone(),
                    map,
                }));
            }
            Members::Many(many) => {
                many.map.insert(id, mailbox);
            }
        }
    }

    /// Removes a member: `Err` if it was the last one (the group must go), with its
    /// mailbox.
    fn remove(&mut self, id: SubId) -> Result<Option<Arc<Mailbox>>, Arc<Mailbox>> {
        match self {
            Members::One(first, mailbox) if *first == id => Err(mailbox.clone()),
            Members::One(..) => Ok(None),
            Members::Many(many) => match many.map.swap_remove(&id) {
                Some(mailbox) if many.map.is_empty() => Err(mailbox),
                found => Ok(found),
            },
        }
    }

    fn mailboxes(&self) -> impl Iterator<Item = &Arc<Mailbox>> + '_ {
        self.iter().map(|(_, m)| m)
    }

    fn iter(&self) -> impl Iterator<Item = (SubId, &Arc<Mailbox>)> + '_ {
        let (one, many) = match self {
            Members::One(id, m) => (Some((*id, m)), None),
            Members::Many(many) => (None, Some(many.map.iter().map(|(id, m)| (*id, m)))),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

struct Group {
    members: Members,
}

/// Which of the index's tables holds a group.
#[derive(Clone, Copy)]
enum Table {
    Exact,
    /// With the prefix's length.
    Prefix(usize),
    Other,
}

impl Table {
    /// The one of the three (the index's `exact`, `prefix`, `by_filter`) this names.
    fn pick<T>(self, exact: T, prefix: T, other: T) -> T {
        match self {
            Table::Exact => exact,
            Table::Prefix(_) => prefix,
            Table::Other => other,
        }
    }

    /// The hash a group with `filter` is found by in this table: its key, its prefix (a
    /// prefix group's range starts at its prefix), or its whole filter.
    fn hash(self, hasher: &RandomState, filter: &Filter) -> u64 {
        match self {
            Table::Exact | Table::Prefix(_) => hasher.hash_one(&filter.range.start[..]),
            Table::Other => hasher.hash_one(filter),
        }
    }
}

impl Group {
    /// The filter every member shares.
    #[inline]
    fn filter(&self) -> &Filter {
        match &self.members {
            Members::One(_, mailbox) => mailbox.filter(),
            Members::Many(many) => &many.filter,
        }
    }
}

/// The subscriber index. Guarded by the registry's mutex; the follower holds it for one
/// burst of upstream messages at a time, registration and unsubscription hold it to
/// add/remove.
#[derive(Default)]
pub(crate) struct Index {
    groups: Slab<Group>,
    hasher: RandomState,
    /// The groups of other ranges, by their filter.
    by_filter: HashTable<GroupId>,
    /// The groups of single keys, by the key (several filters may share a key; a group
    /// is found among them by its filter).
    exact: HashTable<GroupId>,
    /// The groups of prefixes, by the prefix (likewise).
    prefix: HashTable<GroupId>,
    /// Distinct prefix lengths with a count of prefix groups of that length.
    prefix_lens: Vec<(usize, usize)>,
    ranges: Vec<GroupId>,
    /// Scratch space for multi-event batches.
    scratch: Vec<GroupId>,
    /// Scratch space for [`dispatch_all`](Self::dispatch_all): each group's share of a
    /// burst (empty between dispatches).
    owed: Vec<(GroupId, i64, SharedEvents)>,
    /// Set (under the lock) when the cache closed: no subscriber may be added after.
    pub(crate) closed: bool,
    /// Wakers of consumers that got deliveries and were parked; see [`Index::take_wakers`].
    wakers: Vec<Waker>,
}

impl Index {
    /// The table that holds the group of `filter`, and the hash it is found by there:
    /// a single key's or a prefix's group by its key or prefix (the filter is not
    /// hashed into a second table for them: most groups are one of these), any other
    /// range's by its filter.
    fn place(&self, filter: &Filter) -> (Table, u64) {
        let range = &filter.range;
        let table = if range.is_single() {
            Table::Exact
        } else if let Some(p) = range.as_prefix() {
            Table::Prefix(p.len())
        } else {
            Table::Other
        };
        (table, table.hash(&self.hasher, filter))
    }

    /// Adds a subscriber, to the group of its mailbox's filter.
    pub(crate) fn insert(&mut self, id: SubId, mailbox: Arc<Mailbox>) {
        let filter = mailbox.filter();
        let (table, hash) = self.place(filter);
        let groups = &self.groups;
        let found = table
            .pick(&self.exact, &self.prefix, &self.by_filter)
            .find(hash, |&g| groups[g].filter() == filter)
            .copied();
        match found {
            Some(g) => self.groups[g].members.insert(id, mailbox),
            None => {
                let g = self.groups.insert(Group {
                    members: Members::One(id, mailbox),
                });
                let (groups, hasher) = (&self.groups, &self.hasher);
                table
                    .pick(&mut self.exact, &mut self.prefix, &mut self.by_filter)
                    .insert_unique(hash, g, |&x| table.hash(hasher, groups[x].filter()));
                match table {
                    Table::Exact => {}
                    Table::Prefix(len) => {
                        match self.prefix_lens.iter_mut().find(|(l, _)| *l == len) {
                            Some((_, n)) => *n += 1,
                            None => {
                                self.prefix_lens.push((len, 1));
                                self.prefix_lens.sort_unstable();
                            }
                        }
                    }
                    Table::Other => self.ranges.push(g),
                }
            }
        }
    }

    /// Removes the subscriber `id` whose mailbox holds `filter` (its group is found by
    /// the filter: the index keeps no map from subscriber to group); returns its
    /// mailbox, or `None` if it is not in the index.
    pub(crate) fn remove(&mut self, id: SubId, filter: &Filter) -> Option<Arc<Mailbox>> {
        let (table, hash) = self.place(filter);
        let groups = &self.groups;
        let gid = *table
            .pick(&self.exact, &self.prefix, &self.by_filter)
            .find(hash, |&g| groups[g].filter() == filter)?;
        let last = match self.groups[gid].members.remove(id) {
            Ok(mailbox) => return mailbox,
            Err(last) => last,
        };
        // The group's last member: the group goes.
        self.groups.remove(gid);
        if let Ok(entry) = table
            .pick(&mut self.exact, &mut self.prefix, &mut self.by_filter)
            .find_entry(hash, |&g| g == gid)
        {
            entry.remove();
        }
        match table {
            Table::Exact => {}
            Table::Prefix(len) => {
                if let Some(i) = self.prefix_lens.iter().position(|(l, _)| *l == len) {
                    self.prefix_lens[i].1 -= 1;
                    if self.prefix_lens[i].1 == 0 {
                        self.prefix_lens.remove(i);
                    }
                }
            }
            Table::Other => self.ranges.retain(|&g| g != gid),
        }
        Some(last)
    }

    /// Calls `f` with every group whose range holds `key`.
    #[inline]
    fn for_groups(&self, key: &[u8], mut f: impl FnMut(GroupId)) {
        if !self.exact.is_empty() {
            for &g in self.exact.iter_hash(self.hasher.hash_one(key)) {
                if self.groups[g].filter().range.start[..] == *key {
                    f(g);
                }
            }
        }
        for &(len, _) in &self.prefix_lens {
            if len > key.len() {
                break;
            }
            let p = &key[..len];
            for &g in self.prefix.iter_hash(self.hasher.hash_one(p)) {
                // A prefix group's range starts at its prefix.
                if self.groups[g].filter().range.start[..] == *p {
                    f(g);
                }
            }
        }
        for &g in &self.ranges {
            if self.groups[g].filter().range.contains(key) {
                f(g);
            }
        }
    }

    /// Pushes `batch` to every matching subscriber (a burst of one, without gathering:
    /// `micro --bench dispatch/exact_one_match` takes 125 ns this way and 200 ns
    /// through the gathering of [`dispatch_all`](Self::dispatch_all)).
    pub(crate) fn dispatch(&mut self, batch: &Batch, lag: &LagCount) -> DispatchStats {
        let mut stats = DispatchStats::default();
        let mut scratch = std::mem::take(&mut self.scratch);
        self.matching_groups(batch, &mut scratch);
        for &g in &scratch {
            let group = &self.groups[g];
            let Some(payload) = group.filter().select(batch) else {
                continue;
            };
            for mailbox in group.members.mailboxes() {
                let delivery = std::iter::once((batch.revision, &payload));
                let (queued, lagged) = mailbox.push_all(delivery, lag, &mut self.wakers);
                stats.delivered += queued;
                stats.lagged += lagged;
            }
        }
        self.scratch = scratch;
        stats
    }

    /// Pushes `batches` (in increasing revision order: one burst of upstream messages)
    /// to every matching subscriber, each subscriber's share under one lock of its
    /// mailbox ([`Mailbox::push_all`]): what each group is owed is gathered first,
    /// revision by revision (one payload per group and revision, shared by its
    /// members), then handed to its members a group at a time.
    pub(crate) fn dispatch_all<B: Borrow<Batch>>(
        &mut self,
        batches: &[B],
        lag: &LagCount,
    ) -> DispatchStats {
        if let [batch] = batches {
            return self.dispatch(batch.borrow(), lag);
        }
        let mut stats = DispatchStats::default();
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut owed = std::mem::take(&mut self.owed);
        for batch in batches {
            let batch = batch.borrow();
            self.matching_groups(batch, &mut scratch);
            for &g in &scratch {
                if let Some(payload) = self.groups[g].filter().select(batch) {
                    owed.push((g, batch.revision, payload));
                }
            }
        }
        // Stable: each group's revisions stay in order.
        owed.sort_by_key(|&(g, ..)| g);
        for run in owed.chunk_by(|a, b| a.0 == b.0) {
            for mailbox in self.groups[run[0].0].members.mailboxes() {
                let deliveries = run.iter().map(|(_, revision, events)| (*revision, events));
                let (queued, lagged) = mailbox.push_all(deliveries, lag, &mut self.wakers);
                stats.delivered += queued;
                stats.lagged += lagged;
            }
        }
        owed.clear();
        self.owed = owed;
        self.scratch = scratch;
        stats
    }

    /// The groups with an event of `batch` in their range, each once, into `scratch`.
    #[inline]
    fn matching_groups(&self, batch: &Batch, scratch: &mut Vec<GroupId>) {
        scratch.clear();
        let events = batch.all();
        if events.len() == 1 {
            self.for_groups(events[0].key(), |g| scratch.push(g));
        } else {
            for ev in events {
                self.for_groups(ev.key(), |g| scratch.push(g));
            }
            scratch.sort_unstable();
            scratch.dedup();
        }
    }

    /// Moves out the wakers collected by [`dispatch`](Self::dispatch) since the last
    /// call. Wake them after releasing the index lock.
    pub(crate) fn take_wakers(&mut self, into: &mut Vec<Waker>) {
        into.append(&mut self.wakers);
    }

    /// Every subscriber's mailbox (for close and re-list; not on the dispatch path).
    pub(crate) fn all(&self) -> impl Iterator<Item = (SubId, &Filter, &Arc<Mailbox>)> + '_ {
        self.groups
            .iter()
            .flat_map(|(_, g)| g.members.iter().map(|(id, m)| (id, m.filter(), m)))
    }
}

/// The index locked by the follower: dispatch, wakers, culling after a gap.
pub(crate) struct LockedIndex<'a> {
    index: MutexGuard<'a, Index>,
    lag: &'a LagCount,
}

impl<'a> LockedIndex<'a> {
    pub(super) fn new(index: MutexGuard<'a, Index>, lag: &'a LagCount) -> Self {
        LockedIndex { index, lag }
    }
}

impl LockedIndex<'_> {
    /// Pushes `batch` to every matching subscriber (tests: the follower dispatches a
    /// burst at a time, with [`dispatch_all`](Self::dispatch_all)).
    #[cfg(test)]
    pub(crate) fn dispatch(&mut self, batch: &Batch) -> DispatchStats {
        self.index.dispatch(batch, self.lag)
    }

    /// Pushes `batches` (one burst, in revision order) to every matching subscriber,
    /// each subscriber's share under one lock of its mailbox.
    pub(crate) fn dispatch_all(&mut self, batches: &[Arc<Batch>]) -> DispatchStats {
        self.index.dispatch_all(batches, self.lag)
    }

    /// Moves out the wakers of consumers that got deliveries. Wake them after the lock
    /// is released.
    pub(crate) fn take_wakers(&mut self, into: &mut Vec<Waker>) {
        self.index.take_wakers(into);
    }

    /// After a re-list at `revision`: ends, as compacted, every subscriber positioned
    /// before `revision` unless `unchanged` proves it missed nothing (its position then
    /// moves to `revision`). Returns `(ended, kept)`.
    pub(crate) fn cull_after_gap(
        &mut self,
        revision: i64,
        unchanged: impl Fn(&Filter) -> bool,
    ) -> (usize, usize) {
        let mut gone = Vec::new();
        let mut kept = 0usize;
        for (id, filter, mailbox) in self.index.all() {
            if mailbox.last_rev() >= revision {
                continue;
            }
            if unchanged(filter) && mailbox.skip_to(revision) {
                kept += 1;
            } else {
                gone.push((id, mailbox.clone()));
            }
        }
        for (id, mailbox) in &gone {
            if let Some(mailbox) = self.index.remove(*id, mailbox.filter()) {
                mailbox.end(End::Compacted(revision + 1), self.lag);
            }
        }
        (gone.len(), kept)
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

    use crate::key_range::KeyRange;
    use crate::kv::{Event, EventType};

    fn shape(key: &[u8], spec: RangeSpec) -> Filter {
        Filter::range(KeyRange::new(key, &spec).unwrap())
    }

    fn put(key: &[u8], rev: i64) -> Event {
        Event::new(
            EventType::Put,
            KeyValue::new(key.to_vec(), "v", rev, rev, 1, 0),
            None,
        )
    }

    #[test]
    fn partial_batches_share_group_payload() {
        let mut index = Index::default();
        let s = shape(b"a", RangeSpec::Single);
        let lag = LagCount::default();
        let m1 = Mailbox::new(s.clone(), 8, 0, false, &lag);
        let m2 = Mailbox::new(s, 8, 0, false, &lag);
        index.insert(1, m1.clone());
        index.insert(2, m2.clone());
        let b = Batch::new(5, vec![put(b"a", 5), put(b"b", 5)]);
        let stats = index.dispatch(&b, &lag);
        assert_eq!(stats.delivered, 2);
        let d1 = m1.take_queued().pop().unwrap();
        let d2 = m2.take_queued().pop().unwrap();
        assert_eq!(d1.events.len(), 1);
        assert!(d1.events.ptr_eq(&d2.events), "one payload per group");
        assert!(index.remove(1, m1.filter()).is_some());
        assert!(index.remove(1, m1.filter()).is_none(), "removed once");
        assert!(index.remove(2, m2.filter()).is_some());
        assert!(index.exact.is_empty() && index.groups.is_empty());
    }

    /// A group of one exact-key subscriber is its one member (whose mailbox holds the
    /// filter): the map and filter copy of a larger group are boxed, not carried by
    /// every group (docs/PERFORMANCE.md, idle subscriber memory).
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_one_member_group_is_its_one_member() {
        assert_eq!(std::mem::size_of::<Group>(), 16);
    }

    /// The tables hold group ids only: several filters on one key or prefix are all
    /// found, and removing one keeps the others.
    #[test]
    fn filters_sharing_a_key_or_prefix_are_found_and_removed_one_by_one() {
        let lag = LagCount::default();
        let mut index = Index::default();
        let single = shape(b"a", RangeSpec::Single);
        let prefix = shape(b"a", RangeSpec::Prefix);
        let with_prev = |mut f: Filter| {
            f.prev_kv = true;
            f
        };
        let filters = [
            single.clone(),
            with_prev(single),
            prefix.clone(),
            with_prev(prefix),
        ];
        for (i, f) in filters.iter().enumerate() {
            index.insert(i as u64, Mailbox::new(f.clone(), 8, 0, false, &lag));
        }
        assert_eq!(index.groups.len(), 4);
        let found = |index: &Index, key: &[u8]| {
            let mut ids = Vec::new();
            index.for_groups(key, |g| {
                ids.extend(index.groups[g].members.iter().map(|(id, _)| id))
            });
            ids.sort_unstable();
            ids
        };
        assert_eq!(found(&index, b"a"), vec![0, 1, 2, 3]);
        assert_eq!(found(&index, b"ab"), vec![2, 3]);
        // A subscriber is found by its own filter only.
        assert!(index.remove(1, &filters[0]).is_none());
        assert!(index.remove(1, &filters[1]).is_some());
        assert!(index.remove(2, &filters[2]).is_some());
        assert_eq!(found(&index, b"a"), vec![0, 3]);
        assert_eq!(found(&index, b"ab"), vec![3]);
        assert!(index.remove(0, &filters[0]).is_some() && index.remove(3, &filters[3]).is_some());
        assert!(index.groups.is_empty() && index.by_filter.is_empty());
        assert!(index.exact.is_empty() && index.prefix.is_empty() && index.prefix_lens.is_empty());
    }

    proptest! {
        /// A burst dispatched at once gives every subscriber what the burst's revisions
        /// dispatched one at a time give it: the same deliveries in the same order, the
        /// same position, the same lagging state (with queues of 1 to 4 deliveries, so
        /// that some fill up in the middle of a burst), and the same counts.
        #[test]
        fn a_burst_dispatched_at_once_is_the_same_as_one_revision_at_a_time(
            subscribers in proptest::collection::vec((0usize..5, 1usize..5), 2..10),
            burst in proptest::collection::vec(proptest::collection::vec(0usize..4, 1..3), 1..9),
        ) {
            let keys: [&[u8]; 4] = [b"a", b"ab", b"b", b"abc"];
            let filters = [
                shape(b"a", RangeSpec::Single),
                shape(b"a", RangeSpec::Prefix),
                shape(b"ab", RangeSpec::Prefix),
                shape(b"b", RangeSpec::Single),
                shape(b"a", RangeSpec::FromKey),
            ];
            let lag = (LagCount::default(), LagCount::default());
            let (mut one, mut all) = (Index::default(), Index::default());
            let mut pairs = Vec::new();
            for (id, &(f, cap)) in subscribers.iter().enumerate() {
                let a = Mailbox::new(filters[f].clone(), cap, 0, false, &lag.0);
                let b = Mailbox::new(filters[f].clone(), cap, 0, false, &lag.1);
                one.insert(id as u64, a.clone());
                all.insert(id as u64, b.clone());
                pairs.push((a, b));
            }
            let burst: Vec<Arc<Batch>> = burst
                .iter()
                .zip(1..)
                .map(|(events, rev)| Batch::new(rev, events.iter().map(|&k| put(keys[k], rev)).collect()))
                .collect();
            let mut stats = DispatchStats::default();
            for batch in &burst {
                let s = one.dispatch(batch, &lag.0);
                stats.delivered += s.delivered;
                stats.lagged += s.lagged;
            }
            let at_once = all.dispatch_all(&burst, &lag.1);
            prop_assert_eq!((stats.delivered, stats.lagged), (at_once.delivered, at_once.lagged));
            prop_assert_eq!(lag.0.get(), lag.1.get());
            let revisions = |m: &Mailbox| -> Vec<(i64, usize)> {
                m.take_queued().iter().map(|d| (d.revision, d.events.len())).collect()
            };
            for (a, b) in &pairs {
                prop_assert_eq!(a.last_rev(), b.last_rev());
                prop_assert_eq!(revisions(a), revisions(b));
            }
            prop_assert!(all.owed.is_empty(), "the scratch holds no events after");
        }
    }

    fn arb_shape() -> impl Strategy<Value = Filter> {
        let key = proptest::collection::vec(b'a'..b'd', 1..4);
        (key.clone(), 0u8..5, key).prop_filter_map("valid", |(k, spec, end)| {
            let spec = match spec {
                0 => RangeSpec::Single,
                1 => RangeSpec::Prefix,
                2 => RangeSpec::FromKey,
                3 => RangeSpec::AllKeys,
                _ => RangeSpec::Range(end),
            };
            KeyRange::new(&k, &spec).ok().map(Filter::range)
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
                index.insert(i as u64, Mailbox::new(s.clone(), 1000, 0, false, &LagCount::default()));
                live.push((i as u64, s.clone()));
            }
            for i in (0..shapes.len()).step_by(remove_every) {
                prop_assert!(index.remove(i as u64, &shapes[i]).is_some());
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
