//! The single writer: applies what the upstream sends to the store, then the history,
//! then the subscribers, then publishes the new snapshot — always in that order and
//! under the index lock, so a subscriber registered at revision R has every revision
//! after R pushed to it and none before.

use std::sync::Arc;
use std::task::Waker;

use tracing::{debug, warn};

use crate::error::{Error, Result};
use crate::history::Batch;
use crate::history::HistoryWriter;
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
    /// The history's one writer.
    history: HistoryWriter,
    store: Store,
    /// Newest revision applied (as published).
    applied: i64,
    /// Consumers to wake (collected while the index lock is held, woken after).
    wakers: Vec<Waker>,
    /// The burst of upstream messages applied to the store and not yet flushed (see
    /// [`flush`](Self::flush)).
    burst: Burst,
}

/// A burst of upstream messages applied to the store (which only the writer reads
/// until it publishes) and not yet in the history, dispatched or published: the
/// follower applies every message already received, then flushes them together, so
/// that each mailbox is locked once per burst, not once per revision.
#[derive(Default)]
struct Burst {
    batches: Vec<Arc<Batch>>,
    /// Newest revision applied to the store (`applied` if the burst is empty).
    stored: i64,
    /// Events received in the burst's messages (metrics).
    received: usize,
}

impl Writer {
    pub(super) fn new(shared: Arc<Shared>, publisher: Publisher, history: HistoryWriter) -> Self {
        Writer {
            shared,
            publisher,
            history,
            store: Store::default(),
            applied: 0,
            wakers: Vec::new(),
            burst: Burst::default(),
        }
    }

    /// Moves the cache to `state` (see [`Publisher::set_state`]).
    pub(super) fn set_state(&self, state: CacheStatus) {
        self.publisher.set_state(state);
    }

    /// Newest revision applied (and published: call after [`flush`](Self::flush)).
    pub(super) fn applied(&self) -> i64 {
        debug_assert!(self.burst.batches.is_empty(), "a burst not flushed");
        self.applied
    }

    /// Replaces the store with a fresh list at `revision`. After a gap (any list but
    /// the first), subscribers positioned before `revision` may have missed events, so
    /// they end as compacted — unless they watch one key that exists before and after
    /// with the same `mod_revision`: any put or delete in between would have changed it.
    /// (An absent key proves nothing: it may have been created and deleted in the gap.)
    pub(super) fn install(&mut self, map: KvMap, revision: i64) {
        self.flush();
        let first = !self.shared.view().status().loaded;
        let revision = revision.max(self.applied);
        let shared = self.shared.clone();
        let mut index = shared.subscribers().lock();
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
        self.history.write().reset(revision);
        self.publish(&mut index, revision);
        drop(index);
        self.publisher.set_loaded();
    }

    /// Replaces the store with a list made at the applied revision itself (a repair
    /// after a failed consistency check): the history and every subscriber stay as they
    /// are, since nothing happened between the two.
    pub(super) fn repair(&mut self, map: KvMap, revision: i64) {
        self.flush();
        debug_assert_eq!(revision, self.applied);
        let shared = self.shared.clone();
        let mut index = shared.subscribers().lock();
        self.store.replace(map);
        self.publish(&mut index, revision);
    }

    /// Test hook: writes `kvs` into the store behind etcd's back, as a bug would.
    pub(super) fn corrupt(&mut self, kvs: Vec<KeyValue>) {
        self.flush();
        let shared = self.shared.clone();
        let mut index = shared.subscribers().lock();
        for kv in kvs {
            self.store.apply(EventType::Put, kv);
        }
        let revision = self.applied;
        self.publish(&mut index, revision);
    }

    /// Applies one upstream message to the store: one batch per revision, held in the
    /// burst until [`flush`](Self::flush) puts them in the history, dispatches them
    /// in order and publishes.
    ///
    /// # Errors
    /// [`Error::Protocol`] if the message's revisions go backwards (etcd never sends
    /// that; a buggy proxy could): nothing of it is applied, and the follower
    /// reconnects from its last applied revision (what came before it in the burst is
    /// flushed).
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
        if self.burst.batches.is_empty() {
            self.burst.stored = self.applied;
        }
        self.burst.received += events.len();
        let mut batch_events = Vec::new();
        let mut iter = events.into_iter().peekable();
        while let Some((t, kv)) = iter.next() {
            let rev = kv.mod_revision();
            if rev <= self.burst.stored {
                // A resumed or buggy watch (etcd#20221) may repeat old events.
                continue;
            }
            batch_events.push(self.store.apply(t, kv));
            let boundary = iter
                .peek()
                .is_none_or(|(_, next)| next.mod_revision() != rev);
            if boundary {
                let batch = Batch::new(rev, std::mem::take(&mut batch_events));
                self.burst.batches.push(batch);
                self.burst.stored = rev;
            }
        }
        Ok(())
    }

    /// Puts the burst's batches in the history, dispatches them to the subscribers
    /// (each mailbox locked once for all of them) and publishes the snapshot at the
    /// newest, all under the index lock: a subscriber registered meanwhile sees all of
    /// the burst or none of it. Every other change of the writer flushes first.
    pub(super) fn flush(&mut self) {
        if self.burst.batches.is_empty() {
            if self.burst.received > 0 {
                self.shared.metrics().applied(self.burst.received, 0, 0);
                self.burst.received = 0;
            }
            return;
        }
        let shared = self.shared.clone();
        let mut index = shared.subscribers().lock();
        let batches = std::mem::take(&mut self.burst.batches);
        {
            // While a subscriber lags, the history may keep more than its capacity
            // (`keep_history_while_lagging`). A subscriber may start lagging anywhere in
            // this burst's dispatch, so nothing is evicted for the capacity until the
            // dispatch has shown whether one lags.
            let mut history = self.history.write();
            for batch in &batches {
                history.push(batch.clone(), true);
            }
        }
        let stats = index.dispatch_all(&batches);
        self.history
            .write()
            .evict(shared.subscribers().lagging() > 0);
        let last = self.burst.stored;
        if stats.lagged > 0 {
            debug!(
                lagged = stats.lagged,
                revision = last,
                "subscribers fell behind; they will catch up from history"
            );
        }
        shared
            .metrics()
            .applied(self.burst.received, batches.len(), stats.delivered);
        self.burst.received = 0;
        if stats.lagged > 0 {
            shared
                .metrics()
                .lagging(shared.subscribers().lagging(), true);
        }
        self.publish(&mut index, last);
        index.take_wakers(&mut self.wakers);
        drop(index);
        // The allocation is kept for the next burst.
        let mut batches = batches;
        batches.clear();
        self.burst.batches = batches;
    }

    /// A trusted progress notification: nothing happened in the prefix up to `revision`.
    pub(super) fn progress(&mut self, revision: i64) {
        // Events before the progress go out before it claims their revisions.
        self.flush();
        if revision <= self.applied {
            return;
        }
        let shared = self.shared.clone();
        let mut index = shared.subscribers().lock();
        self.history.write().advance(revision);
        self.publish(&mut index, revision);
    }

    /// Flushes the burst, then wakes the consumers that got deliveries since the last
    /// call.
    pub(super) fn wake_consumers(&mut self) {
        self.flush();
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
            let history = shared.history().read();
            shared.metrics().published(
                revision,
                snapshot.map.len(),
                snapshot.bytes,
                (history.len(), history.bytes()),
                shared.counters().cluster_revision(),
            );
            shared.metrics().watchers(shared.subscribers().watchers());
            shared
                .metrics()
                .lagging(shared.subscribers().lagging(), false);
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
            self.shared
                .subscribers()
                .end_all(End::Failed(error.clone()));
            self.publisher.set_state(CacheStatus::Failed { error });
        } else {
            // Never left pending at an await (the follower flushes before each), so
            // this finds nothing; but what was applied is delivered before the end.
            self.flush();
            self.shared.subscribers().end_all(End::Closed);
            self.publisher.set_state(CacheStatus::Closed);
        }
    }
}
