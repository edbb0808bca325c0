//! Cached watches' way back to etcd. A cached watch that falls behind the cache's
//! window (its client did not read, or the cache caught up after an outage longer than
//! the window) is not canceled while etcd may still hold its revisions: the session
//! moves it to etcd under its id, from its next revision (`session.rs: catch_up`), and
//! etcd, not the cache, decides whether that revision is compacted. [`CatchUp`] keeps,
//! per cached watch, the create that does that and the revision it needs next.

use std::collections::HashMap;

use crate::pb::etcdserverpb::WatchCreateRequest;

/// A cached watch's create (etcd's keyspace, its id) and the revision it needs next:
/// every revision below it has been sent to the client, as events or as progress.
struct Resumable {
    create: WatchCreateRequest,
    next: i64,
}

/// The stream's cached watches, by id, each with what it takes to catch it up.
#[derive(Default)]
pub(super) struct CatchUp {
    watches: HashMap<i64, Resumable>,
}

impl CatchUp {
    /// A cached watch was created (its `created` was at `created_revision`): it needs
    /// its start revision next, or, from now, the revision after its creation.
    pub(super) fn created(&mut self, create: WatchCreateRequest, created_revision: i64) {
        let next = match create.start_revision {
            0 => created_revision + 1,
            start => start,
        };
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
    fn sent_up_to(&mut self, watch_id: i64, through: i64) {
        if let Some(w) = self.watches.get_mut(&watch_id) {
            w.next = w.next.max(through + 1);
        }
    }

    /// The watch ended (canceled by the client or the proxy).
    pub(super) fn forget(&mut self, watch_id: i64) {
        self.watches.remove(&watch_id);
    }

    /// The watch's create from its next revision, for etcd; it is no longer the
    /// cache's.
    pub(super) fn take(&mut self, watch_id: i64) -> Option<WatchCreateRequest> {
        let w = self.watches.remove(&watch_id)?;
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
}
