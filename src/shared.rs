//! The state shared by the cache's handles, its follower task, its streams and its
//! readers: the configuration, the history, the subscriber registry, the published
//! view, the counters, and the seam to etcd.
//!
//! The follower is the only writer of the history, the store and the view. The view —
//! the newest snapshot (which carries its revision) and the lifecycle status — is one
//! published value, so readers never see a revision without its data or a status from
//! another moment.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tokio::sync::watch;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::history::History;
use crate::key_range::KeyRange;
use crate::progress::ProgressRequestor;
use crate::store::Snapshot;
use crate::subscribers::Subscribers;
use crate::upstream::probe::RevisionProbe;
use crate::upstream::Upstream;

/// Lifecycle flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Status {
    /// A snapshot has been loaded at least once.
    pub(crate) loaded: bool,
    /// Loaded and the upstream watch is confirmed: the data is current.
    pub(crate) ready: bool,
    /// The follower has stopped.
    pub(crate) closed: bool,
}

/// What the follower publishes: the newest snapshot and the status, as one value.
#[derive(Debug, Clone, Default)]
pub(crate) struct View {
    pub(crate) snapshot: Arc<Snapshot>,
    pub(crate) status: Status,
}

/// Numbers a user checks. See [`Cache::stats`](crate::Cache::stats).
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

/// Counters with one writer each: the follower (connects, lists, trust) and the read
/// path (fallback reads).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    connects: AtomicU64,
    lists: AtomicU64,
    fallback_reads: AtomicU64,
    progress_trusted: AtomicBool,
}

impl Counters {
    pub(crate) fn connected(&self) {
        self.connects.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn listed(&self) {
        self.lists.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn read_from_etcd(&self) {
        self.fallback_reads.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn set_progress_trusted(&self, trusted: bool) {
        self.progress_trusted.store(trusted, Ordering::Release);
    }

    /// True when `RequestProgress` answers may advance the cache (server fixed).
    pub(crate) fn progress_trusted(&self) -> bool {
        self.progress_trusted.load(Ordering::Acquire)
    }
}

/// State shared by the handles, the follower and the streams.
pub(crate) struct Shared {
    pub(crate) config: Config,
    /// The cache's key range (derived from the prefix).
    pub(crate) range: KeyRange,
    /// Written by the follower only. Lock order: the index, then the history.
    pub(crate) history: RwLock<History>,
    pub(crate) subscribers: Subscribers,
    view: watch::Sender<View>,
    pub(crate) progress: ProgressRequestor,
    /// Shared linearizable revision probes (consistent reads, watches from now).
    pub(crate) probe: Arc<RevisionProbe>,
    pub(crate) upstream: Arc<dyn Upstream>,
    pub(crate) counters: Counters,
}

impl Shared {
    pub(crate) fn new(config: Config, upstream: Arc<dyn Upstream>) -> Arc<Self> {
        Arc::new(Shared {
            range: KeyRange::for_prefix(&config.prefix),
            history: RwLock::new(History::new(config.history_window)),
            subscribers: Subscribers::new(config.max_watchers, config.subscriber_buffer),
            view: watch::Sender::new(View::default()),
            progress: ProgressRequestor::default(),
            probe: Arc::default(),
            upstream,
            counters: Counters::default(),
            config,
        })
    }

    /// Newest revision applied and dispatched.
    pub(crate) fn revision(&self) -> i64 {
        self.view.borrow().snapshot.revision
    }

    /// The newest snapshot.
    pub(crate) fn snapshot(&self) -> Arc<Snapshot> {
        self.view.borrow().snapshot.clone()
    }

    /// Runs `f` on the newest snapshot without taking a reference to it.
    pub(crate) fn with_snapshot<T>(&self, f: impl FnOnce(&Snapshot) -> T) -> T {
        f(&self.view.borrow().snapshot)
    }

    pub(crate) fn status(&self) -> Status {
        self.view.borrow().status
    }

    /// Publishes a new snapshot (follower only, after its dispatch, under the index lock).
    pub(crate) fn publish(&self, snapshot: Snapshot) {
        self.view.send_modify(|v| v.snapshot = Arc::new(snapshot));
    }

    /// Changes the status (follower only); waiters wake only on a change.
    pub(crate) fn update_status(&self, f: impl FnOnce(&mut Status)) {
        self.view.send_if_modified(|v| {
            let before = v.status;
            f(&mut v.status);
            v.status != before
        });
    }

    /// Waits until the status satisfies `f`, or the follower is gone.
    async fn wait_status(&self, f: impl Fn(&Status) -> bool) -> Result<Status> {
        let mut rx = self.view.subscribe();
        let v = rx
            .wait_for(|v| f(&v.status) || v.status.closed)
            .await
            .map_err(|_| Error::Closed)?;
        Ok(v.status)
    }

    /// Waits until the cache is ready (loaded and following).
    ///
    /// # Errors
    /// [`Error::Closed`] if the cache closes first.
    pub(crate) async fn wait_ready(&self) -> Result<()> {
        let s = self.wait_status(|s| s.ready).await?;
        if s.closed {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// Waits until the follower has stopped.
    pub(crate) async fn wait_closed(&self) {
        let _ = self.wait_status(|s| s.closed).await;
    }

    /// Waits until a snapshot is loaded, up to `limit`.
    ///
    /// # Errors
    /// [`Error::NotReady`] after `limit`; [`Error::Closed`].
    pub(crate) async fn wait_loaded(&self, limit: Duration) -> Result<()> {
        match tokio::time::timeout(limit, self.wait_status(|s| s.loaded)).await {
            Ok(Ok(s)) if s.closed => Err(Error::Closed),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::NotReady),
        }
    }

    /// Waits until the applied revision is at least `rev`, asking for progress upstream
    /// while it waits.
    ///
    /// # Errors
    /// [`Error::Closed`] if the cache closes first.
    pub(crate) async fn wait_for_revision(&self, rev: i64) -> Result<()> {
        if self.revision() >= rev {
            return Ok(());
        }
        let _guard = self.progress.wait();
        let mut rx = self.view.subscribe();
        let v = rx
            .wait_for(|v| v.snapshot.revision >= rev || v.status.closed)
            .await
            .map_err(|_| Error::Closed)?;
        if v.snapshot.revision >= rev {
            Ok(())
        } else {
            Err(Error::Closed)
        }
    }

    pub(crate) fn stats(&self) -> CacheStats {
        let (revision, keys, store_bytes) =
            self.with_snapshot(|s| (s.revision, s.map.len(), s.bytes));
        let history = self.history.read();
        CacheStats {
            revision,
            watchers: self.subscribers.watchers(),
            lagging: self.subscribers.lagging(),
            history_len: history.len(),
            history_floor: history.floor(),
            history_bytes: history.bytes(),
            keys,
            store_bytes,
            connects: self.counters.connects.load(Ordering::Relaxed),
            lists: self.counters.lists.load(Ordering::Relaxed),
            progress_requests: self.progress.sent(),
            fallback_reads: self.counters.fallback_reads.load(Ordering::Relaxed),
            progress_trusted: self.counters.progress_trusted(),
        }
    }
}
