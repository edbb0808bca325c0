//! The stream's cache watches, one entry each, in one map: where each is in its life
//! ([`Phase`]), the create that moves it between the cache and etcd, and the revision
//! it needs next. A cached watch that falls behind the cache's window (its client did
//! not read, or the cache caught up after an outage longer than the window) is not
//! canceled while etcd may still hold its revisions: the session moves it to etcd under
//! its id, from its next revision (`session/moves.rs: catch_up`), and etcd, not the
//! cache, decides whether that revision is compacted. Once etcd has brought it into the
//! newer half of the cache's window (or just ahead of it), it returns to the cache from
//! its next revision (`session/moves.rs: rejoin`), so that a burst does not leave etcd
//! with one watch per client for good.
//!
//! The phases, and what moves a watch between them (each a method below):
//!
//! ```text
//! creating ──created──▶ cached ──fell_behind──▶ away ──returning──▶ rejoining
//!    │                 ▲  │                       ▲                     │
//!    │                 │  └──revoke──▶ revoked    └─────rejoin refused──┤
//!    └──revoke──▶ revoked (its created still to come)                   │
//!                      └──────────────────created───────────────────────┘
//! ```
//!
//! An entry ends when the client cancels its watch, when the cache's `canceled` for it
//! comes (unless it fell behind: then it goes away), or when etcd ends it while away.
//! A watch id has at most one entry: the session gives ids from one id space.

use bytes::Bytes;
use std::collections::HashMap;
use tonic::Status;

use super::id_map::IdMap;

use crate::pb::etcdserverpb::{watch_create_request::FilterType, WatchCreateRequest};

/// Where a watch is in its life.
#[derive(Debug)]
pub(super) enum Phase {
    /// Sent to the cache; its `created` has not come.
    Creating,
    /// Served by the cache.
    Cached,
    /// Canceled by the proxy because etcd no longer allows it (`authz/`); the cache's
    /// `canceled` for it, which carries etcd's refusal, has not come. `created`: its
    /// `created` has come (it counts as open until its `canceled`).
    Revoked { refusal: Box<Status>, created: bool },
    /// Served by etcd for now, under its id (it fell behind the cache's window, or
    /// started below it).
    Away,
    /// Coming back from etcd: sent to the cache again, its `created` (not the client's)
    /// has not come.
    Rejoining,
}

impl Phase {
    /// Whether a client's cancel goes to the cache: the watch is cached, or its create is
    /// waiting for its `created` (revoked or not); not a watch the proxy canceled once
    /// created (its `canceled` is on its way), nor one away (etcd's).
    pub(super) fn client_may_cancel(&self) -> bool {
        matches!(
            self,
            Phase::Creating
                | Phase::Cached
                | Phase::Rejoining
                | Phase::Revoked { created: false, .. }
        )
    }
}

/// One watch: its create as etcd would take it (etcd's keyspace; its id is the map's
/// key), the revision it needs next (every revision below it has been sent to the
/// client, as events or as progress; 0 until a watch from now is created), and its
/// phase.
#[derive(Debug)]
pub(super) struct Entry {
    create: Kept,
    next: i64,
    phase: Phase,
}

/// A create as an entry keeps it: what a create from another revision needs, its key
/// and range end in one allocation (the whole `WatchCreateRequest`, about 110 bytes
/// inline and a share of the stream's receive buffer, is kept by no open watch).
#[derive(Debug)]
struct Kept {
    /// The key, then the range end.
    range: Box<[u8]>,
    key_len: u32,
    flags: u8,
}

const PROGRESS_NOTIFY: u8 = 1;
const PREV_KV: u8 = 1 << 1;
const NO_PUT: u8 = 1 << 2;
const NO_DELETE: u8 = 1 << 3;
const FRAGMENT: u8 = 1 << 4;

impl Kept {
    fn new(create: &WatchCreateRequest) -> Self {
        let mut range = Vec::with_capacity(create.key.len() + create.range_end.len());
        range.extend_from_slice(&create.key);
        range.extend_from_slice(&create.range_end);
        let flag = |on: bool, bit: u8| if on { bit } else { 0 };
        let filter = |f: FilterType| create.filters.contains(&(f as i32));
        Kept {
            range: range.into_boxed_slice(),
            // A key is part of one gRPC message, whose length prefix is 32 bits.
            key_len: u32::try_from(create.key.len()).expect("a key under 4 GiB"),
            flags: flag(create.progress_notify, PROGRESS_NOTIFY)
                | flag(create.prev_kv, PREV_KV)
                | flag(filter(FilterType::Noput), NO_PUT)
                | flag(filter(FilterType::Nodelete), NO_DELETE)
                | flag(create.fragment, FRAGMENT),
        }
    }

    fn key(&self) -> &[u8] {
        &self.range[..self.key_len as usize]
    }

    fn range_end(&self) -> &[u8] {
        &self.range[self.key_len as usize..]
    }

    /// The create of watch `watch_id` from `start_revision`. Filters other than etcd's
    /// two were never kept: etcd ignores them.
    fn create(&self, watch_id: i64, start_revision: i64) -> WatchCreateRequest {
        let on = |bit: u8| self.flags & bit != 0;
        let mut filters = Vec::new();
        if on(NO_PUT) {
            filters.push(FilterType::Noput as i32);
        }
        if on(NO_DELETE) {
            filters.push(FilterType::Nodelete as i32);
        }
        WatchCreateRequest {
            key: Bytes::copy_from_slice(self.key()),
            range_end: Bytes::copy_from_slice(self.range_end()),
            start_revision,
            progress_notify: on(PROGRESS_NOTIFY),
            filters,
            prev_kv: on(PREV_KV),
            watch_id,
            fragment: on(FRAGMENT),
        }
    }
}

impl Entry {
    /// Whether the cache has it open, as `etcd_cache_proxy_watches{served="cache"}`
    /// counts: created and not canceled yet.
    pub(super) fn counted(&self) -> bool {
        matches!(
            self.phase,
            Phase::Cached | Phase::Revoked { created: true, .. }
        )
    }

    /// etcd's refusal, for a revoked watch's `canceled`.
    pub(super) fn refusal(self) -> Option<Box<Status>> {
        match self.phase {
            Phase::Revoked { refusal, .. } => Some(refusal),
            _ => None,
        }
    }

    /// Its create (as watch `watch_id`) from its next revision.
    fn resume_create(&self, watch_id: i64) -> WatchCreateRequest {
        self.create.create(watch_id, self.next)
    }
}

/// The stream's cache watches, by id.
#[derive(Default)]
pub(super) struct Entries {
    by_id: IdMap<Entry>,
    /// How many are away (served by etcd for now).
    away: usize,
}

impl Entries {
    /// A create sent to the cache.
    pub(super) fn creating(&mut self, create: WatchCreateRequest) {
        self.insert(create, Phase::Creating);
    }

    /// A watch served by etcd that comes to the cache once etcd has brought it into
    /// the window, from `create`'s start revision (a create below the window, or one the
    /// cache did not take back).
    pub(super) fn away(&mut self, create: WatchCreateRequest) {
        self.insert(create, Phase::Away);
    }

    /// A watch coming back from etcd, sent to the cache from `create`'s start revision.
    pub(super) fn rejoining(&mut self, create: WatchCreateRequest) {
        self.insert(create, Phase::Rejoining);
    }

    fn insert(&mut self, create: WatchCreateRequest, phase: Phase) {
        self.away += usize::from(matches!(phase, Phase::Away));
        let entry = Entry {
            create: Kept::new(&create),
            next: create.start_revision,
            phase,
        };
        if let Some(old) = self.by_id.insert(create.watch_id, entry) {
            self.away -= usize::from(matches!(old.phase, Phase::Away));
        }
    }

    /// Whether a watch is away (served by etcd for now).
    pub(super) fn has_away(&self) -> bool {
        self.away > 0
    }

    /// How many watches are away.
    pub(super) fn away_count(&self) -> usize {
        self.away
    }

    pub(super) fn phase(&self, watch_id: i64) -> Option<&Phase> {
        self.by_id.get(&watch_id).map(|e| &e.phase)
    }

    pub(super) fn contains(&self, watch_id: i64) -> bool {
        self.by_id.contains_key(&watch_id)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The entry ends (the client canceled it, the cache's `canceled` came, or etcd
    /// ended it while away).
    pub(super) fn remove(&mut self, watch_id: i64) -> Option<Entry> {
        let e = self.by_id.remove(&watch_id)?;
        self.away -= usize::from(matches!(e.phase, Phase::Away));
        Some(e)
    }

    /// The cache's `created` came (at `created_revision`): a watch being created or
    /// rejoining is cached (it needs its start revision next, or, from now, the revision
    /// after its creation); a revoked one is open until its `canceled`. Whether it
    /// counts as open now and did not before.
    pub(super) fn created(&mut self, watch_id: i64, created_revision: i64) -> bool {
        let Some(e) = self.by_id.get_mut(&watch_id) else {
            return false;
        };
        match &mut e.phase {
            Phase::Creating | Phase::Rejoining => {
                if e.next == 0 {
                    e.next = created_revision + 1;
                }
                e.phase = Phase::Cached;
                true
            }
            Phase::Revoked { created, .. } if !*created => {
                *created = true;
                true
            }
            _ => false,
        }
    }

    /// etcd no longer allows a watch being created or cached: it is canceled, and its
    /// `canceled` carries `refusal`. Whether it was one of those.
    pub(super) fn revoke(&mut self, watch_id: i64, refusal: Status) -> bool {
        let Some(e) = self.by_id.get_mut(&watch_id) else {
            return false;
        };
        let created = match e.phase {
            Phase::Creating => false,
            Phase::Cached => true,
            _ => return false,
        };
        e.phase = Phase::Revoked {
            refusal: Box::new(refusal),
            created,
        };
        true
    }

    /// The key ranges a revocation re-check asks about, each with the watch ids it
    /// decides: the cached watches and the creates whose `created` has not come (so that
    /// a create in flight at the revocation is not let through by its late reply); not
    /// the ones away or rejoining (etcd checked them), nor the revoked.
    pub(super) fn to_recheck(&self) -> HashMap<(Bytes, Bytes), Vec<i64>> {
        let mut by_range: HashMap<(Bytes, Bytes), Vec<i64>> = HashMap::new();
        for (id, e) in &self.by_id {
            if matches!(e.phase, Phase::Cached | Phase::Creating) {
                by_range
                    .entry((
                        Bytes::copy_from_slice(e.create.key()),
                        Bytes::copy_from_slice(e.create.range_end()),
                    ))
                    .or_default()
                    .push(*id);
            }
        }
        by_range
    }

    /// Records what a cache response sends its watch (see [`sent_through`]).
    pub(super) fn sent(&mut self, r: &etcd_cache::WatchResponse) {
        if let Some(through) = sent_through(r) {
            self.sent_up_to(r.watch_id(), through);
        }
    }

    /// Every revision up to `through` has been sent to cached watch `watch_id`'s client.
    pub(super) fn sent_up_to(&mut self, watch_id: i64, through: i64) {
        if let Some(e) = self.by_id.get_mut(&watch_id) {
            if matches!(e.phase, Phase::Cached) {
                e.next = e.next.max(through + 1);
            }
        }
    }

    /// A cached watch the cache ended because it fell behind its window: it goes to
    /// etcd, with its create from its next revision.
    pub(super) fn fell_behind(&mut self, watch_id: i64) -> Option<WatchCreateRequest> {
        self.goes_away(watch_id, |p| matches!(p, Phase::Cached))
    }

    /// A rejoining watch the cache did not take back: it stays with etcd, from where it
    /// was, with its create from there.
    pub(super) fn stays_away(&mut self, watch_id: i64) -> Option<WatchCreateRequest> {
        self.goes_away(watch_id, |p| matches!(p, Phase::Rejoining))
    }

    /// A watch in a phase `from` accepts goes to etcd; its create from its next revision.
    fn goes_away(&mut self, watch_id: i64, from: fn(&Phase) -> bool) -> Option<WatchCreateRequest> {
        let e = self.by_id.get_mut(&watch_id).filter(|e| from(&e.phase))?;
        e.phase = Phase::Away;
        self.away += 1;
        Some(e.resume_create(watch_id))
    }

    /// etcd sent a watch away everything up to `through` (its events, or its progress).
    /// Its create from the next revision, if that revision is in the newer half of the
    /// cache's window `[floor, head]`, or ahead of the head by less than half the window:
    /// it goes back to the cache (rejoining; see [`created`](Self::created)). etcd's
    /// answer to a watch usually comes before the cache has applied the same revision
    /// (both come from etcd; the cache's goes through its follower), so a watch whose
    /// writes have stopped would otherwise stay with etcd for good; a cache that has
    /// stopped following (its head still) is not given watches etcd is far ahead of.
    /// `zero_free`: a create with id 0 gets id 0 on the cache's side (see
    /// `cached.rs: Watches::gives_zero`).
    pub(super) fn returning(
        &mut self,
        watch_id: i64,
        through: i64,
        (floor, head): (i64, i64),
        zero_free: bool,
    ) -> Option<WatchCreateRequest> {
        let e = self.by_id.get_mut(&watch_id)?;
        if !matches!(e.phase, Phase::Away) {
            return None;
        }
        e.next = e.next.max(through + 1);
        // The cache reads id 0 as "its next free id" (as etcd does): a watch the client
        // knows as 0 is given back under its id only while that is 0 (the first watch of
        // most clients' streams: clientv3 opens one per watch context), else it stays
        // with etcd.
        if watch_id == 0 && !zero_free {
            return None;
        }
        let half = (head - floor) / 2;
        if e.next < (floor + half).max(floor + 1) || e.next > head + 1 + half {
            return None;
        }
        e.phase = Phase::Rejoining;
        self.away -= 1;
        Some(e.resume_create(watch_id))
    }
}

/// The revision up to which a cache response proves its watch's client has everything:
/// its last event's, or a progress notification's; none for created and canceled.
fn sent_through(r: &etcd_cache::WatchResponse) -> Option<i64> {
    if r.created() || r.canceled() {
        return None;
    }
    match r.events().last().and_then(|e| e.kv()) {
        Some(kv) => Some(kv.mod_revision()),
        None if r.is_progress_notify() => Some(r.revision()),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(watch_id: i64, start_revision: i64) -> WatchCreateRequest {
        WatchCreateRequest {
            key: b"/a/".to_vec().into(),
            watch_id,
            start_revision,
            ..Default::default()
        }
    }

    /// What an entry keeps of a create gives back the same create from another
    /// revision: key, range end, flags and etcd's filters (an unknown filter, which
    /// etcd ignores, is not kept).
    #[test]
    fn a_kept_create_is_the_create_from_another_revision() {
        let create = WatchCreateRequest {
            key: b"/a/k".to_vec().into(),
            range_end: b"/a/l".to_vec().into(),
            start_revision: 4,
            progress_notify: true,
            filters: vec![FilterType::Nodelete as i32, 7],
            prev_kv: true,
            watch_id: 9,
            fragment: true,
        };
        let again = Kept::new(&create).create(9, 12);
        assert_eq!(
            again,
            WatchCreateRequest {
                start_revision: 12,
                filters: vec![FilterType::Nodelete as i32],
                ..create.clone()
            }
        );
        let plain = WatchCreateRequest {
            key: b"k".to_vec().into(),
            watch_id: 3,
            ..Default::default()
        };
        assert_eq!(Kept::new(&plain).create(3, 0), plain);
    }

    /// One entry per open watch, in a map keyed by its id: its size is per-watch memory
    /// (the key and range end are one allocation beside it).
    #[test]
    fn an_entry_takes_48_bytes() {
        assert_eq!(std::mem::size_of::<Entry>(), 48);
    }

    /// A cached watch that falls behind resumes after the last revision it was sent.
    #[test]
    fn a_watch_resumes_after_the_last_revision_it_was_sent() {
        let mut c = Entries::default();
        for (id, start) in [(1, 0), (2, 5), (3, 0)] {
            c.creating(create(id, start));
            assert!(c.created(id, 10), "counted once created");
        }
        c.sent_up_to(1, 11);
        c.sent_up_to(1, 12);
        c.sent_up_to(3, 20);
        c.sent_up_to(3, 15);
        let next = |c: &mut Entries, id| c.fell_behind(id).map(|w| w.start_revision);
        assert_eq!(next(&mut c, 1), Some(13), "after its events");
        assert_eq!(next(&mut c, 2), Some(5), "its start revision");
        assert_eq!(next(&mut c, 3), Some(21), "after its progress");
        assert!(c.fell_behind(1).is_none(), "moved once");
        assert!(matches!(c.phase(1), Some(Phase::Away)));
        c.creating(create(4, 0));
        assert!(
            c.remove(4).is_some_and(|e| !e.counted()),
            "not counted before created"
        );
        assert!(c.fell_behind(4).is_none());
    }

    #[test]
    fn a_caught_up_watch_returns_in_the_newer_half_of_the_window() {
        let mut c = Entries::default();
        c.creating(WatchCreateRequest {
            prev_kv: true,
            ..create(7, 0)
        });
        c.created(7, 100);
        assert_eq!(c.fell_behind(7).map(|w| w.start_revision), Some(101));
        assert!(
            c.returning(8, 5_000, (1_000, 3_000), true).is_none(),
            "not away"
        );
        // Window [1000, 3000]: the newer half starts at 2000.
        assert!(
            c.returning(7, 1_500, (1_000, 3_000), true).is_none(),
            "older half"
        );
        let back = c
            .returning(7, 2_400, (1_000, 3_000), true)
            .expect("newer half");
        assert_eq!(
            (back.start_revision, back.watch_id, back.prev_kv),
            (2_401, 7, true)
        );
        assert!(
            c.returning(7, 2_500, (1_000, 3_000), true).is_none(),
            "back once"
        );
        // Not taken back: away again, from where it was.
        assert_eq!(c.stays_away(7).map(|w| w.start_revision), Some(2_401));
        let back = c
            .returning(7, 2_450, (1_000, 3_000), true)
            .expect("newer half");
        assert_eq!(back.start_revision, 2_451);
        // Taken back: cached, from its next revision.
        assert!(c.created(7, 2_900), "counted again");
        assert_eq!(c.fell_behind(7).map(|w| w.start_revision), Some(2_451));
        assert!(c.remove(7).is_some());
        assert!(c.returning(7, 2_900, (1_000, 3_000), true).is_none());
        // Id 0 stays with etcd once the cache's stream gave 0 (it reads 0 as its next
        // free id), and returns while that is still 0.
        c.creating(create(0, 0));
        c.created(0, 100);
        assert!(c.fell_behind(0).is_some());
        assert!(c.returning(0, 2_400, (1_000, 3_000), false).is_none());
        let back = c
            .returning(0, 2_401, (1_000, 3_000), true)
            .expect("0 is free");
        assert_eq!((back.watch_id, back.start_revision), (0, 2_402));
    }

    /// etcd's answer to a watch away usually comes before the cache has applied the same
    /// revision: a watch just ahead of the cache's head (by less than half the window)
    /// goes back too, so that one whose writes stop does not stay with etcd; one far
    /// ahead (a cache that stopped following) stays with etcd.
    #[test]
    fn a_watch_just_ahead_of_the_cache_returns_and_one_far_ahead_stays() {
        let mut c = Entries::default();
        c.away(create(5, 101));
        c.away(create(6, 101));
        // Window [1000, 3000]: up to 1000 ahead of the head.
        assert!(
            c.returning(6, 4_001, (1_000, 3_000), true).is_none(),
            "far ahead"
        );
        assert!(matches!(c.phase(6), Some(Phase::Away)));
        let back = c
            .returning(5, 3_999, (1_000, 3_000), true)
            .expect("just ahead");
        assert_eq!(back.start_revision, 4_000, "from after what etcd sent");
        assert!(matches!(c.phase(5), Some(Phase::Rejoining)));
        assert!(c.has_away(), "6 is");
        assert!(c.remove(6).is_some());
        assert!(!c.has_away());
        // Back to etcd (the cache did not take it), then ended.
        c.away(back);
        assert!(c.has_away());
        assert!(c.remove(5).is_some());
        assert!(!c.has_away());
    }

    /// A revocation cancels a watch being created or cached, once; one revoked before
    /// its `created` counts as open from its `created` to its `canceled`.
    #[test]
    fn a_revoked_watch_keeps_its_refusal_until_its_canceled() {
        let mut c = Entries::default();
        c.creating(create(1, 0));
        c.creating(create(2, 0));
        c.created(2, 10);
        c.away(create(3, 5));
        assert!(c.revoke(1, Status::permission_denied("no")));
        assert!(c.revoke(2, Status::permission_denied("no")));
        assert!(!c.revoke(2, Status::permission_denied("again")), "once");
        assert!(
            !c.revoke(3, Status::permission_denied("no")),
            "etcd checks it"
        );
        assert!(
            !c.revoke(9, Status::permission_denied("no")),
            "no such watch"
        );
        assert!(
            c.by_id[&2].counted(),
            "counted from its created to its canceled"
        );
        assert!(!c.by_id[&1].counted());
        let may_cancel = |c: &Entries, id| c.phase(id).is_some_and(Phase::client_may_cancel);
        assert!(
            may_cancel(&c, 1),
            "revoked before its created: the client's cancel goes"
        );
        assert!(
            !may_cancel(&c, 2),
            "revoked once created: the proxy's cancel is on its way"
        );
        assert!(!may_cancel(&c, 3), "away: etcd's");
        assert!(c.created(1, 11), "counted from its created");
        assert!(!may_cancel(&c, 1));
        assert!(!c.created(1, 11), "once");
        assert!(c.fell_behind(2).is_none(), "a revoked watch does not move");
        assert!(c.to_recheck().is_empty(), "nothing left to check");
        match c.remove(1).map(|e| e.phase) {
            Some(Phase::Revoked { refusal, created }) => {
                assert_eq!((refusal.message(), created), ("no", true));
            }
            other => panic!("{other:?}"),
        }
    }

    /// A revocation re-checks the cached watches and the creates still waiting for
    /// their `created` (issue 40: a create in flight at the revocation was let through),
    /// not those away or rejoining.
    #[test]
    fn a_recheck_covers_creates_not_answered_yet() {
        let mut c = Entries::default();
        let on = |id, key: &'static str| WatchCreateRequest {
            key: Bytes::from_static(key.as_bytes()),
            ..create(id, 0)
        };
        c.creating(on(1, "/a"));
        c.created(1, 10);
        c.creating(on(2, "/a"));
        c.creating(on(3, "/b"));
        c.away(on(4, "/c"));
        c.rejoining(on(5, "/d"));
        let mut got: Vec<(Bytes, Vec<i64>)> = c
            .to_recheck()
            .into_iter()
            .map(|((k, _), mut ids)| {
                ids.sort();
                (k, ids)
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                (Bytes::from_static(b"/a"), vec![1, 2]),
                (Bytes::from_static(b"/b"), vec![3]),
            ]
        );
        assert!(Entries::default().to_recheck().is_empty());
    }
}
