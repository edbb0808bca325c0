//! The [`Cache`] handle, the state it shares with the upstream task and the streams,
//! and [`WatchScope`].
//!
//! ## Shutdown
//! [`Cache::close`], or dropping the last `Cache` handle, stops the upstream task. Every
//! open [`WatchStream`] then yields what was already delivered to it (including a
//! lagging stream's catch-up from the history) and ends with `None`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{CacheBuilder, Config};
use crate::dispatch::{End, Index, Mailbox, Shape, SubId};
use crate::error::{Error, Result};
use crate::history::History;
use crate::key_range::KeyRange;
use crate::probe::RevisionProbe;
use crate::progress::ProgressRequestor;
use crate::store::Snapshot;
use crate::upstream::{EtcdUpstream, Upstream};
use crate::watch::{WatchOptions, WatchStream};

/// Lifecycle flags published to waiters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Status {
    /// A snapshot has been loaded at least once.
    pub(crate) loaded: bool,
    /// Loaded and the upstream watch is confirmed: the data is current.
    pub(crate) ready: bool,
    /// The upstream task has stopped.
    pub(crate) closed: bool,
}

/// Numbers a user checks. See [`Cache::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStats {
    /// Newest revision applied (0 before the first snapshot).
    pub revision: i64,
    /// Open watches.
    pub watchers: usize,
    /// Watches currently lagging (catching up from the history).
    pub lagging: usize,
    /// Event batches (revisions) in the history.
    pub history_len: usize,
    /// Oldest start revision a watch can replay from.
    pub history_floor: i64,
    /// Keys held.
    pub keys: usize,
    /// Key and value bytes held by the store.
    pub store_bytes: usize,
    /// Key and value bytes referenced by the history.
    pub history_bytes: usize,
    /// Upstream (re)connections that reached a confirmed watch.
    pub connects: u64,
    /// Full lists (the first one included).
    pub lists: u64,
    /// `RequestProgress` messages sent upstream.
    pub progress_requests: u64,
    /// Consistent reads answered by etcd instead of the cache.
    pub fallback_reads: u64,
    /// True when every endpoint runs an etcd whose `RequestProgress` answers are
    /// trusted (>= 3.4.31 / 3.5.13, or forced with `ProgressTrust::Always`).
    pub progress_trusted: bool,
}

/// State shared by the handles, the upstream task and the streams.
pub(crate) struct Shared {
    pub(crate) config: Config,
    /// The cache's key range (derived from the prefix).
    pub(crate) range: KeyRange,
    pub(crate) history: RwLock<History>,
    /// Guards the subscriber index. Lock order: index, then history, then a mailbox.
    pub(crate) index: Mutex<Index>,
    pub(crate) snapshot: ArcSwap<Snapshot>,
    /// Newest revision applied and dispatched; written under the index lock.
    pub(crate) revision: AtomicI64,
    pub(crate) revision_tx: watch::Sender<i64>,
    pub(crate) status: watch::Sender<Status>,
    pub(crate) watchers: AtomicUsize,
    pub(crate) lagging: AtomicUsize,
    next_id: AtomicU64,
    pub(crate) progress: ProgressRequestor,
    /// Shared linearizable revision probes (consistent reads, watches from now).
    pub(crate) probe: Arc<RevisionProbe>,
    /// True when `RequestProgress` answers may advance the cache (server fixed).
    pub(crate) trust_progress: AtomicBool,
    pub(crate) upstream: Arc<dyn Upstream>,
    pub(crate) connects: AtomicU64,
    pub(crate) lists: AtomicU64,
    pub(crate) fallback_reads: AtomicU64,
    pub(crate) keys: AtomicUsize,
    pub(crate) store_bytes: AtomicUsize,
}

impl Shared {
    pub(crate) fn new(config: Config, upstream: Arc<dyn Upstream>) -> Arc<Self> {
        let range = KeyRange::for_prefix(&config.prefix);
        Arc::new(Shared {
            range,
            history: RwLock::new(History::new(config.history_window)),
            index: Mutex::new(Index::default()),
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            revision: AtomicI64::new(0),
            revision_tx: watch::Sender::new(0),
            status: watch::Sender::new(Status::default()),
            watchers: AtomicUsize::new(0),
            lagging: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            progress: ProgressRequestor::default(),
            probe: Arc::default(),
            trust_progress: AtomicBool::new(false),
            upstream,
            connects: AtomicU64::new(0),
            lists: AtomicU64::new(0),
            fallback_reads: AtomicU64::new(0),
            keys: AtomicUsize::new(0),
            store_bytes: AtomicUsize::new(0),
            config,
        })
    }

    pub(crate) fn revision(&self) -> i64 {
        self.revision.load(Ordering::Acquire)
    }

    pub(crate) fn status(&self) -> Status {
        *self.status.borrow()
    }

    /// Waits until a snapshot is loaded, up to `limit`.
    pub(crate) async fn wait_loaded(&self, limit: Duration) -> Result<()> {
        let mut rx = self.status.subscribe();
        let res = tokio::time::timeout(limit, rx.wait_for(|s| s.loaded || s.closed)).await;
        match res {
            Ok(Ok(s)) if s.closed => Err(Error::Closed),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(Error::Closed),
            Err(_) => Err(Error::NotReady),
        }
    }

    /// Waits until the applied revision is at least `rev`, asking for progress upstream
    /// while it waits.
    pub(crate) async fn wait_for_revision(&self, rev: i64) -> Result<()> {
        if self.revision() >= rev {
            return Ok(());
        }
        let _guard = self.progress.wait();
        let mut rx = self.revision_tx.subscribe();
        let mut status = self.status.subscribe();
        loop {
            if *rx.borrow_and_update() >= rev {
                return Ok(());
            }
            if status.borrow_and_update().closed {
                return Err(Error::Closed);
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return Err(Error::Closed) },
                r = status.changed() => if r.is_err() { return Err(Error::Closed) },
            }
        }
    }

    /// Opens a watch. See [`Cache::watch`].
    pub(crate) async fn watch(
        self: &Arc<Self>,
        key: &[u8],
        options: WatchOptions,
        scope: Option<&Arc<ScopeInner>>,
    ) -> Result<WatchStream> {
        let range = KeyRange::new(key, &options.spec)?;
        range.check_within(&self.range)?;
        if options.start_revision < 0 {
            return Err(Error::invalid(format!(
                "negative start revision {}",
                options.start_revision
            )));
        }
        if self.status().closed {
            return Err(Error::Closed);
        }
        let slot = Slot::acquire(self, scope)?;
        self.wait_loaded(self.config.consistent_read_timeout)
            .await?;
        // "From now", as etcd means it: after every write that completed before this
        // call, even those the cache has not applied yet.
        let now = if options.start_revision == 0 {
            self.cluster_revision_for_watch().await
        } else {
            0
        };
        let shape = Shape {
            range,
            prev_kv: options.prev_kv,
            no_put: options.no_put(),
            no_delete: options.no_delete(),
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut index = self.index.lock();
        if index.closed {
            return Err(Error::Closed);
        }
        let current = self.revision();
        let (last_rev, lagging) = match options.start_revision {
            // A revision the cache has not reached makes a future-start subscriber:
            // events up to it are skipped, the first one after it is delivered.
            0 => (current.max(now), false),
            start => {
                let history = self.history.read();
                if start < history.floor() {
                    let floor = history.floor();
                    drop(history);
                    drop(index);
                    return Ok(WatchStream::compacted(self.clone(), id, shape, slot, floor));
                }
                (start - 1, start - 1 < history.head())
            }
        };
        let mailbox = Mailbox::new(self.config.subscriber_buffer, last_rev, lagging);
        if lagging {
            self.lagging.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(scope) = scope {
            scope.ids.lock().insert(id);
        }
        index.insert(id, shape.clone(), mailbox.clone());
        drop(index);
        tracing::trace!(
            watch_id = id,
            start_revision = options.start_revision,
            revision = current,
            "watch opened"
        );
        Ok(WatchStream::new(
            self.clone(),
            id,
            shape,
            mailbox,
            slot,
            current.max(now),
            options.progress_notify,
        ))
    }

    /// The cluster's current revision for a watch "from now" (one linearizable round
    /// trip), or 0 when it is not wanted or cannot be had in time: then the watch starts
    /// after the cache's own revision.
    async fn cluster_revision_for_watch(&self) -> i64 {
        if !self.config.linearizable_watch_start || !self.status().ready {
            return 0;
        }
        let probe = self.probe.current(&self.upstream, &self.range);
        match tokio::time::timeout(self.config.consistent_read_timeout, probe).await {
            Ok(Ok(rev)) => rev,
            _ => 0,
        }
    }

    /// Removes a subscriber from the index (idempotent).
    pub(crate) fn unsubscribe(&self, id: SubId, why: End) {
        let removed = self.index.lock().remove(id);
        if let Some(mailbox) = removed {
            if mailbox.end(why) {
                self.lagging.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Ends every subscription (close or upstream task exit).
    pub(crate) fn end_all(&self, why: End) {
        let mut index = self.index.lock();
        index.closed = true;
        for (_, _, mailbox) in index.all() {
            if mailbox.end(why) {
                self.lagging.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn stats(&self) -> CacheStats {
        let history = self.history.read();
        CacheStats {
            revision: self.revision(),
            watchers: self.watchers.load(Ordering::Relaxed),
            lagging: self.lagging.load(Ordering::Relaxed),
            history_len: history.len(),
            history_floor: history.floor(),
            history_bytes: history.bytes(),
            keys: self.keys.load(Ordering::Relaxed),
            store_bytes: self.store_bytes.load(Ordering::Relaxed),
            connects: self.connects.load(Ordering::Relaxed),
            lists: self.lists.load(Ordering::Relaxed),
            progress_requests: self.progress.sent(),
            fallback_reads: self.fallback_reads.load(Ordering::Relaxed),
            progress_trusted: self.trust_progress.load(Ordering::Relaxed),
        }
    }
}

/// A counted watch slot (cache-wide and, for scoped watches, per scope). Freed on drop.
pub(crate) struct Slot {
    shared: Arc<Shared>,
    scope: Option<Arc<ScopeInner>>,
}

impl Slot {
    fn acquire(shared: &Arc<Shared>, scope: Option<&Arc<ScopeInner>>) -> Result<Slot> {
        let limit = shared.config.max_watchers;
        if shared.watchers.fetch_add(1, Ordering::AcqRel) >= limit {
            shared.watchers.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::WatchLimit { limit });
        }
        if let Some(scope) = scope {
            if scope.count.fetch_add(1, Ordering::AcqRel) >= scope.limit {
                scope.count.fetch_sub(1, Ordering::AcqRel);
                shared.watchers.fetch_sub(1, Ordering::AcqRel);
                return Err(Error::WatchLimit { limit: scope.limit });
            }
        }
        Ok(Slot {
            shared: shared.clone(),
            scope: scope.cloned(),
        })
    }

    pub(crate) fn forget(&self, id: SubId) {
        if let Some(scope) = &self.scope {
            scope.ids.lock().remove(&id);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.shared.watchers.fetch_sub(1, Ordering::AcqRel);
        if let Some(scope) = &self.scope {
            scope.count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Stops the upstream task when the last `Cache` handle goes away.
struct Handle {
    shutdown: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// One upstream watch on a key prefix, a revision-ordered history, and any number of
/// local subscribers and readers. Cheap to clone; all clones share one cache.
///
/// See the [crate docs](crate) for a quick start.
#[derive(Clone)]
pub struct Cache {
    shared: Arc<Shared>,
    handle: Arc<Handle>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field(
                "prefix",
                &String::from_utf8_lossy(&self.shared.config.prefix),
            )
            .field("stats", &self.stats())
            .finish()
    }
}

impl Cache {
    /// Starts configuring a cache over `client`.
    pub fn builder(client: etcd_client::Client) -> CacheBuilder {
        CacheBuilder::new(client)
    }

    /// Starts the cache on any upstream (the etcd client, or a scripted one in tests).
    pub(crate) fn start(config: Config, upstream: Arc<dyn Upstream>) -> Result<Cache> {
        config.validate()?;
        let shared = Shared::new(config, upstream);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let task = tokio::spawn(crate::follower::run(shared.clone(), shutdown_rx));
        Ok(Cache {
            handle: Arc::new(Handle {
                shutdown,
                task: Mutex::new(Some(task)),
            }),
            shared,
        })
    }

    /// Waits until the first snapshot is loaded and the upstream watch is confirmed.
    ///
    /// # Errors
    /// [`Error::Closed`] if the cache is closed first.
    pub async fn wait_ready(&self) -> Result<()> {
        let mut rx = self.shared.status.subscribe();
        let s = rx
            .wait_for(|s| s.ready || s.closed)
            .await
            .map_err(|_| Error::Closed)?;
        if s.closed {
            Err(Error::Closed)
        } else {
            Ok(())
        }
    }

    /// [`wait_ready`](Self::wait_ready) with a time limit.
    ///
    /// # Errors
    /// [`Error::Timeout`] after `limit`; [`Error::Closed`].
    pub async fn wait_ready_timeout(&self, limit: Duration) -> Result<()> {
        tokio::time::timeout(limit, self.wait_ready())
            .await
            .map_err(|_| Error::timeout("the cache to become ready", limit))?
    }

    /// True while the cache can vouch for its data: loaded and following etcd.
    pub fn is_ready(&self) -> bool {
        self.shared.status().ready
    }

    /// Newest revision applied (0 before the first snapshot).
    pub fn revision(&self) -> i64 {
        self.shared.revision()
    }

    /// Resolves once [`revision`](Self::revision) `>= rev`. While it waits, the cache
    /// asks etcd for progress (on servers where that answer can be trusted).
    ///
    /// # Errors
    /// [`Error::Closed`] if the cache closes first. Wrap it in `tokio::time::timeout` to
    /// bound the wait.
    pub async fn wait_for_revision(&self, rev: i64) -> Result<()> {
        self.shared.wait_for_revision(rev).await
    }

    /// Watches `key` (and, with the options, a range) from the cache. Mirrors
    /// `etcd_client::Client::watch`; see [`WatchOptions`] for the forms.
    ///
    /// The first response has `created() == true`. A start revision below the window
    /// yields `Err(Error::Compacted { .. })` and then the stream ends.
    ///
    /// # Errors
    /// [`Error::InvalidRange`], [`Error::OutOfRange`], [`Error::WatchLimit`],
    /// [`Error::NotReady`] if no snapshot was loaded within the consistent-read timeout,
    /// [`Error::Closed`].
    pub async fn watch(
        &self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> Result<WatchStream> {
        let key = key.into();
        self.shared
            .watch(&key, options.unwrap_or_default(), None)
            .await
    }

    /// A handle with its own watch budget: at most `max_watchers` open watches through
    /// it, all cancelled when it is dropped. Give one to each tenant or connection.
    pub fn scope(&self, max_watchers: usize) -> WatchScope {
        WatchScope {
            shared: self.shared.clone(),
            inner: Arc::new(ScopeInner {
                limit: max_watchers,
                count: AtomicUsize::new(0),
                ids: Mutex::new(HashSet::new()),
            }),
        }
    }

    /// Counters: revision, watchers, lagging, history span, store size, connections.
    pub fn stats(&self) -> CacheStats {
        self.shared.stats()
    }

    /// Open watches.
    pub fn watcher_count(&self) -> usize {
        self.shared.watchers.load(Ordering::Relaxed)
    }

    /// Watches currently lagging.
    pub fn lagging_count(&self) -> usize {
        self.shared.lagging.load(Ordering::Relaxed)
    }

    /// `(oldest replayable start revision, newest revision covered)`.
    pub fn history_span(&self) -> (i64, i64) {
        let h = self.shared.history.read();
        (h.floor(), h.head())
    }

    /// The key prefix the cache holds.
    pub fn prefix(&self) -> &[u8] {
        &self.shared.config.prefix
    }

    /// Stops the upstream task and ends every stream after what it was already
    /// delivered. Idempotent; other handles see [`Error::Closed`] afterwards.
    pub async fn close(&self) {
        let _ = self.handle.shutdown.send(true);
        let task = self.handle.task.lock().take();
        match task {
            Some(task) => {
                let _ = task.await;
            }
            None => {
                let mut rx = self.shared.status.subscribe();
                let _ = rx.wait_for(|s| s.closed).await;
            }
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

impl CacheBuilder {
    /// Validates the configuration and spawns the upstream task. It does not wait for
    /// the first snapshot: use [`Cache::wait_ready`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the bad value.
    ///
    /// # Panics
    /// If called outside a tokio runtime.
    pub async fn build(mut self) -> Result<Cache> {
        let client = self.client.take().ok_or_else(|| Error::InvalidConfig {
            reason: "builder used twice".into(),
        })?;
        Cache::start(self.config, Arc::new(EtcdUpstream::new(client)))
    }
}

/// The bookkeeping of one [`WatchScope`].
#[derive(Debug)]
pub(crate) struct ScopeInner {
    limit: usize,
    count: AtomicUsize,
    ids: Mutex<HashSet<SubId>>,
}

/// A watch budget for one tenant or connection, made by [`Cache::scope`].
///
/// At most its limit of watches are open through it at once (one more fails with
/// [`Error::WatchLimit`]), and they also count against the cache's own limit. Dropping
/// the scope cancels every watch opened through it: their streams end with `None`
/// after what was already delivered. A service that re-issues watches in a reconnect
/// loop drops the old scope and makes a new one, and leaks nothing.
pub struct WatchScope {
    shared: Arc<Shared>,
    inner: Arc<ScopeInner>,
}

impl std::fmt::Debug for WatchScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchScope")
            .field("limit", &self.inner.limit)
            .field("open", &self.open())
            .finish()
    }
}

impl WatchScope {
    /// Like [`Cache::watch`], counted against this scope.
    ///
    /// # Errors
    /// As [`Cache::watch`]; [`Error::WatchLimit`] names this scope's limit.
    pub async fn watch(
        &self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> Result<WatchStream> {
        let key = key.into();
        self.shared
            .watch(&key, options.unwrap_or_default(), Some(&self.inner))
            .await
    }

    /// Watches open through this scope.
    pub fn open(&self) -> usize {
        self.inner.count.load(Ordering::Relaxed)
    }

    /// This scope's limit.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }
}

impl Drop for WatchScope {
    fn drop(&mut self) {
        let ids: Vec<SubId> = self.inner.ids.lock().drain().collect();
        for id in ids {
            self.shared.unsubscribe(id, End::Cancelled);
        }
    }
}
