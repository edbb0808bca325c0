//! The single writer: applies what the upstream sends to the store, then the history,
//! then the subscribers, then publishes the new snapshot — always in that order and
//! under the index lock, so a subscriber registered at revision R has every revision
//! after R pushed to it and none before.

use std::sync::Arc;
use std::task::Waker;

use tracing::{debug, warn};

use crate::error::{Error, Result};
use crate::history::Batch;
use crate::kv::{EventType, KeyValue};
use crate::shared::Shared;
use crate::status::CacheStatus;
use crate::store::{KvMap, Store};
use crate::subscribers::mailbox::End;
use crate::subscribers::LockedIndex;
use crate::view::Publisher;

/// The follower's writing half: the only owner of the store and of the view's
/// publisher. Dropped when the follower ends (also by a panic), it ends every stream
/// and closes the view, so that no waiter and no stream is left hanging; after a
/// panic the streams end with [`Error::Internal`], so that a consumer can tell the
/// cache died.
pub(super) struct Writer {
    shared: Arc<Shared>,
    publisher: Publisher,
    store: Store,
    /// Newest revision applied (as published).
    applied: i64,
    /// Consumers to wake (collected while the index lock is held, woken after).
    wakers: Vec<Waker>,
}

impl Writer {
    pub(super) fn new(shared: Arc<Shared>, publisher: Publisher) -> Self {
        Writer {
            shared,
            publisher,
            store: Store::default(),
            applied: 0,
            wakers: Vec::new(),
        }
    }

    /// Moves the cache to `state` (see [`Publisher::set_state`]).
    pub(super) fn set_state(&self, state: CacheStatus) {
        self.publisher.set_state(state);
    }

    /// Newest revision applied.
    pub(super) fn applied(&self) -> i64 {
        self.applied
    }

    /// Replaces the store with a fresh list at `revision`. After a gap (any list but
    /// the first), subscribers positioned before `revision` may have missed events, so
    /// they end as compacted — unless they watch one key that exists before and after
    /// with the same `mod_revision`: any put or delete in between would have changed it.
    /// (An absent key proves nothing: it may have been created and deleted in the gap.)
    pub(super) fn install(&mut self, map: KvMap, revision: i64) {
        let first = !self.shared.view.status().loaded;
        let revision = revision.max(self.applied);
        let shared = self.shared.clone();
        let mut index = shared.subscribers.lock();
        if !first {
            let store = &self.store;
            let (ended, kept) = index.cull_after_gap(revision, |filter| {
                let key = &filter.range.start;
                filter.range.is_single()
                    && match (store.get(key), map.get(&key[..])) {
                        (Some(old), Some(new)) => old.mod_revision() == new.0.mod_revision(),
                        _ => false,
                    }
            });
            warn!(
                revision,
                compacted_watchers = ended,
                kept_watchers = kept,
                "re-listed after a compaction gap"
            );
            self.store.relisted(map);
        } else {
            self.store.replace(map);
        }
        shared.history.write().reset(revision);
        self.publish(&mut index, revision);
        drop(index);
        self.publisher.set_loaded();
    }

    /// Replaces the store with a list made at the applied revision itself (a repair
    /// after a failed consistency check): the history and every subscriber stay as they
    /// are, since nothing happened between the two.
    pub(super) fn repair(&mut self, map: KvMap, revision: i64) {
        debug_assert_eq!(revision, self.applied);
        let shared = self.shared.clone();
        let mut index = shared.subscribers.lock();
        self.store.replace(map);
        self.publish(&mut index, revision);
    }

    /// Test hook: writes `kvs` into the store behind etcd's back, as a bug would.
    pub(super) fn corrupt(&mut self, kvs: Vec<KeyValue>) {
        let shared = self.shared.clone();
        let mut index = shared.subscribers.lock();
        for kv in kvs {
            self.store.apply(EventType::Put, kv);
        }
        let revision = self.applied;
        self.publish(&mut index, revision);
    }

    /// Applies one upstream message: one batch per revision, dispatched in order.
    ///
    /// # Errors
    /// [`Error::Protocol`] if the message's revisions go backwards (etcd never sends
    /// that; a buggy proxy could): nothing of it is applied, and the follower
    /// reconnects from its last applied revision.
    pub(super) fn apply(&mut self, events: Vec<(EventType, KeyValue)>) -> Result<()> {
        if let Some(w) = events
            .windows(2)
            .find(|w| w[1].1.mod_revision() < w[0].1.mod_revision())
        {
            return Err(Error::protocol(format!(
                "an upstream message whose revisions go backwards ({} after {})",
                w[1].1.mod_revision(),
                w[0].1.mod_revision()
            )));
        }
        let shared = self.shared.clone();
        let mut index = shared.subscribers.lock();
        let mut last = self.applied;
        let mut batch_events = Vec::new();
        let mut lagged = 0;
        let (mut revisions, mut delivered, received) = (0, 0, events.len());
        let mut iter = events.into_iter().peekable();
        while let Some((t, kv)) = iter.next() {
            let rev = kv.mod_revision();
            if rev <= self.applied {
                // A resumed or buggy watch (etcd#20221) may repeat old events.
                continue;
            }
            batch_events.push(self.store.apply(t, kv));
            let boundary = iter
                .peek()
                .is_none_or(|(_, next)| next.mod_revision() != rev);
            if boundary {
                let batch = Batch::new(rev, std::mem::take(&mut batch_events));
                let lagging = shared.subscribers.lagging() > 0;
                shared.history.write().push(batch.clone(), lagging);
                let stats = index.dispatch(&batch);
                lagged += stats.lagged;
                delivered += stats.delivered;
                revisions += 1;
                last = rev;
            }
        }
        if lagged > 0 {
            debug!(
                lagged,
                revision = last,
                "subscribers fell behind; they will catch up from history"
            );
        }
        shared.metrics.applied(received, revisions, delivered);
        if lagged > 0 {
            shared.metrics.lagging(shared.subscribers.lagging(), true);
        }
        if last > self.applied {
            self.publish(&mut index, last);
        }
        index.take_wakers(&mut self.wakers);
        Ok(())
    }

    /// A trusted progress notification: nothing happened in the prefix up to `revision`.
    pub(super) fn progress(&mut self, revision: i64) {
        if revision <= self.applied {
            return;
        }
        let shared = self.shared.clone();
        let mut index = shared.subscribers.lock();
        shared.history.write().advance(revision);
        self.publish(&mut index, revision);
    }

    /// Wakes the consumers that got deliveries since the last call.
    pub(super) fn wake_consumers(&mut self) {
        for waker in self.wakers.drain(..) {
            waker.wake();
        }
    }

    /// Publishes the snapshot at `revision`. Takes the index lock as proof that no
    /// dispatch or registration runs meanwhile.
    fn publish(&mut self, _index: &mut LockedIndex<'_>, revision: i64) {
        self.applied = revision;
        let snapshot = self.store.snapshot(revision);
        #[cfg(feature = "metrics")]
        {
            let shared = &self.shared;
            let history = shared.history.read();
            shared.metrics.published(
                revision,
                snapshot.map.len(),
                snapshot.bytes,
                (history.len(), history.bytes()),
                shared.counters.cluster_revision(),
            );
            shared.metrics.watchers(shared.subscribers.watchers());
            shared.metrics.lagging(shared.subscribers.lagging(), false);
        }
        self.publisher.publish(snapshot);
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let error = Arc::new(Error::Internal {
                reason: "the follower task panicked; the cache is closed".into(),
            });
            self.shared.subscribers.end_all(End::Failed(error.clone()));
            self.publisher.set_state(CacheStatus::Failed { error });
        } else {
            self.shared.subscribers.end_all(End::Closed);
            self.publisher.set_state(CacheStatus::Closed);
        }
    }
}
