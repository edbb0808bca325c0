//! Cached watches' way to etcd and back. A cached watch that falls behind the cache's
//! window (its client did not read, or the cache caught up after an outage longer than
//! the window) is not canceled while etcd may still hold its revisions: the session
//! moves it to etcd under its id, from its next revision (`session/moves.rs: catch_up`), and
//! etcd, not the cache, decides whether that revision is compacted. Once etcd has
//! brought it into the newer half of the cache's window, it returns to the cache from
//! its next revision (`session/moves.rs: rejoin`), so that a burst does not leave etcd with
//! one watch per client for good. [`CatchUp`] keeps, per watch, the create that moves
//! it and the revision it needs next.

use super::id_map::IdMap;

use crate::pb::etcdserverpb::WatchCreateRequest;

/// A cached watch's create (etcd's keyspace, its id) and the revision it needs next:
/// every revision below it has been sent to the client, as events or as progress.
struct Resumable {
    create: WatchCreateRequest,
    next: i64,
}

/// The stream's cached watches, by id, each with what it takes to catch it up; and the
/// ones caught up (served by etcd for now), with what it takes to bring them back.
#[derive(Default)]
pub(super) struct CatchUp {
    watches: IdMap<Resumable>,
    away: IdMap<Resumable>,
}

impl CatchUp {
    /// A cached watch was created (its `created` was at `created_revision`): it needs
    /// its start revision next, or, from now, the revision after its creation.
    pub(super) fn created(&mut self, create: WatchCreateRequest, created_revision: i64) {
        let next = match create.start_revision {
            0 => created_revision + 1,
            start => start,
        };
        self.away.remove(&create.watch_id);
        self.watches
            .insert(create.watch_id, Resumable { create, next });
    }

    /// Records what a cache response sends its watch (see [`sent_through`]).
    pub(super) fn sent(&mut self, r: &etcd_cache::WatchResponse) {
        if let Some(through) = sent_through(r) {
            self.sent_up_to(r.watch_id(), through);
        }
    }

    /// Every revision up to `through` has been sent to watch `watch_id`'s client.
    pub(super) fn sent_up_to(&mut self, watch_id: i64, through: i64) {
        if let Some(w) = self.watches.get_mut(&watch_id) {
            w.next = w.next.max(through + 1);
        }
    }

    /// The watch ended (canceled by the client or the proxy, or by etcd while away).
    pub(super) fn forget(&mut self, watch_id: i64) {
        self.watches.remove(&watch_id);
        self.away.remove(&watch_id);
    }

    /// The watch's create from its next revision, for etcd; it is no longer the
    /// cache's but etcd's, until [`returning`](Self::returning) brings it back.
    pub(super) fn take(&mut self, watch_id: i64) -> Option<WatchCreateRequest> {
        let w = self.watches.remove(&watch_id)?;
        let create = WatchCreateRequest {
            start_revision: w.next,
            ..w.create
        };
        self.away.insert(
            watch_id,
            Resumable {
                create: create.clone(),
                next: w.next,
            },
        );
        Some(create)
    }

    /// A watch that was to return to the cache stays with etcd (the cache did not take
    /// it back), from `create`'s start revision.
    pub(super) fn stay_away(&mut self, create: WatchCreateRequest) {
        let next = create.start_revision;
        self.away
            .insert(create.watch_id, Resumable { create, next });
    }

    /// etcd sent a caught-up watch everything up to `through` (its events, or its
    /// progress). Its create from the next revision, if that revision is in the newer
    /// half of the cache's window `[floor, head]`: it goes back to the cache (and is the
    /// cache's again, see [`created`](Self::created)).
    pub(super) fn returning(
        &mut self,
        watch_id: i64,
        through: i64,
        (floor, head): (i64, i64),
    ) -> Option<WatchCreateRequest> {
        let w = self.away.get_mut(&watch_id)?;
        w.next = w.next.max(through + 1);
        // The cache reads id 0 as "any id" (as etcd does): a watch the client knows as 0
        // cannot be given back under its id, so it stays with etcd.
        if watch_id == 0 {
            return None;
        }
        let newer_half = floor + (head - floor) / 2;
        if w.next < newer_half.max(floor + 1) || w.next > head + 1 {
            return None;
        }
        let w = self.away.remove(&watch_id)?;
        Some(WatchCreateRequest {
            start_revision: w.next,
            ..w.create
        })
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

    #[test]
    fn a_watch_resumes_after_the_last_revision_it_was_sent() {
        let mut c = CatchUp::default();
        let create = |watch_id, start_revision| WatchCreateRequest {
            key: b"/a/".to_vec().into(),
            watch_id,
            start_revision,
            ..Default::default()
        };
        c.created(create(1, 0), 10);
        c.created(create(2, 5), 10);
        c.created(create(3, 0), 10);
        c.sent_up_to(1, 11);
        c.sent_up_to(1, 12);
        c.sent_up_to(3, 20);
        c.sent_up_to(3, 15);
        assert_eq!(
            c.take(1).map(|w| w.start_revision),
            Some(13),
            "after its events"
        );
        assert_eq!(
            c.take(2).map(|w| w.start_revision),
            Some(5),
            "its start revision"
        );
        assert_eq!(
            c.take(3).map(|w| w.start_revision),
            Some(21),
            "after its progress"
        );
        assert!(c.take(1).is_none(), "taken once");
        c.created(create(4, 0), 30);
        c.forget(4);
        assert!(c.take(4).is_none());
    }

    #[test]
    fn a_caught_up_watch_returns_in_the_newer_half_of_the_window() {
        let mut c = CatchUp::default();
        let create = WatchCreateRequest {
            key: b"/a/".to_vec().into(),
            watch_id: 7,
            prev_kv: true,
            ..Default::default()
        };
        c.created(create, 100);
        assert_eq!(c.take(7).map(|w| w.start_revision), Some(101));
        assert!(c.returning(8, 5_000, (1_000, 3_000)).is_none(), "not away");
        // Window [1000, 3000]: the newer half starts at 2000.
        assert!(
            c.returning(7, 1_500, (1_000, 3_000)).is_none(),
            "older half"
        );
        let back = c.returning(7, 2_400, (1_000, 3_000)).expect("newer half");
        assert_eq!(
            (back.start_revision, back.watch_id, back.prev_kv),
            (2_401, 7, true)
        );
        assert!(c.returning(7, 2_500, (1_000, 3_000)).is_none(), "back once");
        // Away again, then ended by etcd or the client.
        c.created(back, 2_400);
        assert!(c.take(7).is_some());
        c.forget(7);
        assert!(c.returning(7, 2_900, (1_000, 3_000)).is_none());
        // Id 0 stays with etcd (the cache would read it as "any id").
        c.created(
            WatchCreateRequest {
                watch_id: 0,
                ..Default::default()
            },
            100,
        );
        assert!(c.take(0).is_some());
        assert!(c.returning(0, 2_400, (1_000, 3_000)).is_none());
    }
}
