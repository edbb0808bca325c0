//! The state shared by the cache's handles, its follower task, its streams and its
//! readers: the configuration, the history, the subscriber registry, the published
//! view, the counters, and the seam to etcd.
//!
//! The follower is the only writer of the history, the store and the view. The view —
//! the newest snapshot (which carries its revision) and the lifecycle status — is one
//! published value, so readers never see a revision without its data or a status from
//! another moment.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::history::History;
use crate::key_range::KeyRange;
use crate::metrics::Metrics;
use crate::progress::ProgressRequestor;
use crate::store::Snapshot;
use crate::subscribers::Subscribers;
use crate::upstream::probe::RevisionProbe;
use crate::upstream::{Header, Upstream};
use crate::watch::response::response_header;

/// Where the cache is in its life, as [`Cache::status`](crate::Cache::status) and
/// [`Cache::status_stream`](crate::Cache::status_stream) report it.
///
/// ```
/// use etcd_cache::CacheStatus;
///
/// fn describe(status: &CacheStatus) -> String {
///     match status {
///         CacheStatus::Ready => "serving".into(),
///         CacheStatus::Reconnecting { error, .. } => format!("reconnecting: {error}"),
///         other => format!("{other:?}"),
///     }
/// }
/// assert_eq!(describe(&CacheStatus::Ready), "serving");
/// ```
///
/// `Display` is one line for a person: the state, what the cache does about it, and the
/// error's own one-line `Display` where there is one (its causes are behind
/// [`error()`](CacheStatus::error) and `source()`):
///
/// ```
/// use std::sync::Arc;
/// use etcd_cache::{CacheStatus, Error};
///
/// let status = CacheStatus::Reconnecting {
///     error: Arc::new(Error::Timeout),
///     attempts: 2,
/// };
/// assert!(status.to_string().starts_with("reconnecting to etcd (attempt 2)"));
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum CacheStatus {
    /// Connecting and listing the prefix for the first time.
    #[default]
    Loading,
    /// Loaded and following etcd: reads and watches are current.
    Ready,
    /// The upstream broke and the cache is reconnecting. Watches resume on their own
    /// once it is back (nothing is lost); consistent reads go to etcd meanwhile (with
    /// `ReadFallback::Etcd`); serializable reads answer from what the cache holds.
    Reconnecting {
        /// The failure that broke the connection, or the last failed attempt.
        error: Arc<Error>,
        /// Failed attempts since the cache was last ready.
        attempts: u32,
    },
    /// Listing the prefix again after etcd compacted the revision the cache had to
    /// resume from (it was disconnected too long).
    Relisting {
        /// The revision etcd compacted.
        compact_revision: i64,
    },
    /// Closed by [`Cache::close`](crate::Cache::close) or by dropping the last handle.
    Closed,
    /// Stopped for good: etcd refused the cache with an error that retrying cannot
    /// change (permission denied, authentication failed, ...).
    Failed {
        /// That error.
        error: Arc<Error>,
    },
}

impl CacheStatus {
    /// True while the cache serves current data.
    pub fn is_ready(&self) -> bool {
        matches!(self, CacheStatus::Ready)
    }

    /// True once the cache has stopped (closed or failed).
    pub fn is_closed(&self) -> bool {
        matches!(self, CacheStatus::Closed | CacheStatus::Failed { .. })
    }

    /// The error behind a `Reconnecting` or `Failed` status.
    pub fn error(&self) -> Option<&Error> {
        match self {
            CacheStatus::Reconnecting { error, .. } | CacheStatus::Failed { error } => Some(error),
            _ => None,
        }
    }

    fn same(&self, other: &CacheStatus) -> bool {
        match (self, other) {
            (
                CacheStatus::Reconnecting {
                    error: a,
                    attempts: x,
                },
                CacheStatus::Reconnecting {
                    error: b,
                    attempts: y,
                },
            ) => Arc::ptr_eq(a, b) && x == y,
            (CacheStatus::Failed { error: a }, CacheStatus::Failed { error: b }) => {
                Arc::ptr_eq(a, b)
            }
            (
                CacheStatus::Relisting {
                    compact_revision: a,
                },
                CacheStatus::Relisting {
                    compact_revision: b,
                },
            ) => a == b,
            (a, b) => std::mem::discriminant(a) == std::mem::discriminant(b),
        }
    }
}

impl std::fmt::Display for CacheStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CacheStatus::Loading => f.write_str("loading: listing the prefix from etcd"),
            CacheStatus::Ready => f.write_str("ready: following etcd"),
            CacheStatus::Reconnecting { error, attempts } => write!(
                f,
                "reconnecting to etcd (attempt {attempts}); watches stay open and resume \
                 without loss: {error}"
            ),
            CacheStatus::Relisting {
                compact_revision: 0,
            } => f.write_str("re-listing the prefix to repair the store"),
            CacheStatus::Relisting { compact_revision } => write!(
                f,
                "re-listing the prefix: etcd compacted its history up to revision \
                 {compact_revision}, past where the cache had to resume"
            ),
            CacheStatus::Closed => f.write_str("closed"),
            CacheStatus::Failed { error } => {
                write!(f, "stopped for good (retrying would not help): {error}")
            }
        }
    }
}

/// The status of a cache and every change of it, from
/// [`Cache::status_stream`](crate::Cache::status_stream): a `Stream` of
/// [`CacheStatus`] that yields the status at the call, then each new one, and ends once
/// the cache has stopped (after yielding `Closed` or `Failed`).
pub struct StatusStream {
    inner: futures_util::stream::BoxStream<'static, CacheStatus>,
}

impl std::fmt::Debug for StatusStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusStream").finish_non_exhaustive()
    }
}

impl StatusStream {
    /// The next status: the current one on the first call, then each change; `None`
    /// once the cache has stopped.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn next(&mut self) -> Option<CacheStatus> {
        futures_util::StreamExt::next(&mut self.inner).await
    }
}

impl futures_core::Stream for StatusStream {
    type Item = CacheStatus;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<CacheStatus>> {
        self.inner.as_mut().poll_next(cx)
    }
}

/// The lifecycle as the follower publishes it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Status {
    /// A snapshot has been loaded at least once.
    pub(crate) loaded: bool,
    pub(crate) state: CacheStatus,
}

impl Status {
    pub(crate) fn ready(&self) -> bool {
        self.state.is_ready()
    }

    pub(crate) fn closed(&self) -> bool {
        self.state.is_closed()
    }
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
    /// Members whose version the cache could not learn (unreachable, or refused the
    /// Status call): while there are any, progress answers are not trusted. The
    /// versions themselves: [`Cache::server_versions`](crate::Cache::server_versions).
    pub unknown_versions: usize,
    /// The newest revision of the cluster the cache has seen (from its upstream watch,
    /// its revision probes and etcd's answers).
    pub cluster_revision: i64,
    /// How many revisions the cache is known to be behind the cluster
    /// (`cluster_revision - revision`, at least 0). Revisions outside the prefix count
    /// too until a progress notification covers them.
    pub behind: i64,
    /// How long ago the follower last heard from etcd (None before the first answer).
    pub since_last_heard: Option<Duration>,
    /// Consistency checks done (`CacheBuilder::consistency_check`).
    pub consistency_checks: u64,
    /// Consistency checks that found the cache different from etcd (each repaired by a
    /// re-list).
    pub consistency_mismatches: u64,
}

/// Counters with one writer each: the follower (connects, lists, trust, what it heard)
/// and the read path (fallback reads). The cluster revision is raised by whoever
/// learns a newer one.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    connects: AtomicU64,
    lists: AtomicU64,
    fallback_reads: AtomicU64,
    progress_trusted: AtomicBool,
    cluster_revision: AtomicI64,
    /// When the follower last heard from etcd.
    heard: Mutex<Option<Instant>>,
    /// The server versions of the last probe (`unreachable:<url>` where unknown).
    versions: Mutex<Vec<String>>,
    /// Every member answers keys-only reads without leases (all known to be >= 3.7).
    keys_only_without_lease: AtomicBool,
    /// Who answered last: cluster id, member id and raft term for response headers.
    /// (cluster id, member id, raft term), each written whole (a torn mix of two
    /// members' ids for one response is harmless: both are real and current).
    identity: [AtomicU64; 3],
    consistency_checks: AtomicU64,
    consistency_mismatches: AtomicU64,
}

impl Counters {
    /// Records who answered (from an upstream header).
    pub(crate) fn set_identity(&self, header: Header) {
        if header.cluster_id != 0 {
            self.identity[0].store(header.cluster_id, Ordering::Relaxed);
            self.identity[1].store(header.member_id, Ordering::Relaxed);
            self.identity[2].store(header.raft_term, Ordering::Relaxed);
        }
    }

    /// Records that etcd's revision is at least `revision`.
    pub(crate) fn saw_cluster_revision(&self, revision: i64) {
        self.cluster_revision.fetch_max(revision, Ordering::Relaxed);
    }

    /// The newest cluster revision seen.
    pub(crate) fn cluster_revision(&self) -> i64 {
        self.cluster_revision.load(Ordering::Relaxed)
    }

    /// Records one consistency check.
    pub(crate) fn consistency_checked(&self, mismatch: bool) {
        self.consistency_checks.fetch_add(1, Ordering::Relaxed);
        if mismatch {
            self.consistency_mismatches.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records that etcd answered just now.
    pub(crate) fn heard(&self) {
        *self.heard.lock() = Some(Instant::now());
    }

    pub(crate) fn set_versions(&self, versions: Vec<String>) {
        let without_lease = !versions.is_empty()
            && versions
                .iter()
                .all(|v| crate::upstream::keys_only_drops_lease(v));
        self.keys_only_without_lease
            .store(without_lease, Ordering::Relaxed);
        *self.versions.lock() = versions;
    }

    /// Whether keys-only reads are answered without leases, as etcd >= 3.7 answers them
    /// (until the versions are known, with them, as 3.4 to 3.6).
    pub(crate) fn keys_only_without_lease(&self) -> bool {
        self.keys_only_without_lease.load(Ordering::Relaxed)
    }

    pub(crate) fn versions(&self) -> Vec<String> {
        self.versions.lock().clone()
    }

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

/// A registered wait for the cache to reach a revision (the follower asks etcd for
/// progress while any is registered), owned by a stream.
pub(crate) struct ProgressWait(Arc<Shared>);

impl ProgressWait {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        shared.progress.enter();
        ProgressWait(shared)
    }
}

impl Drop for ProgressWait {
    fn drop(&mut self) {
        self.0.progress.leave();
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
    /// What the cache knows of etcd's compaction, and its shared checks.
    pub(crate) compaction: Arc<crate::compaction::Compaction>,
    pub(crate) upstream: Arc<dyn Upstream>,
    pub(crate) counters: Counters,
    pub(crate) metrics: Metrics,
    /// Test hooks (feature `unstable-test-hooks`); inert otherwise.
    pub(crate) hooks: Hooks,
}

/// Writes a test asks the follower to make behind etcd's back.
#[derive(Debug, Default)]
pub(crate) struct Hooks {
    pub(crate) wake: tokio::sync::Notify,
    corruptions: Mutex<Vec<crate::kv::KeyValue>>,
}

impl Hooks {
    #[cfg_attr(not(feature = "unstable-test-hooks"), allow(dead_code))]
    pub(crate) fn corrupt(&self, kv: crate::kv::KeyValue) {
        self.corruptions.lock().push(kv);
        self.wake.notify_one();
    }

    pub(crate) fn take(&self) -> Vec<crate::kv::KeyValue> {
        std::mem::take(&mut *self.corruptions.lock())
    }
}

impl Shared {
    pub(crate) fn new(config: Config, upstream: Arc<dyn Upstream>) -> Arc<Self> {
        Arc::new(Shared {
            range: KeyRange::for_prefix(&config.prefix),
            history: RwLock::new(History::new(config.history_window, config.history_bytes)),
            subscribers: Subscribers::new(config.max_watchers, config.subscriber_buffer),
            view: watch::Sender::new(View::default()),
            progress: ProgressRequestor::default(),
            probe: Arc::default(),
            compaction: Arc::default(),
            upstream,
            counters: Counters::default(),
            metrics: Metrics::new(&config.prefix),
            hooks: Hooks::default(),
            config,
        })
    }

    /// The cluster's current revision: one linearizable round trip shared with
    /// concurrent callers, bounded by the consistent-read timeout, recorded as seen.
    /// The one way the crate asks for it (reads fail with its error; watches from now
    /// and stream-wide progress requests go on without it).
    pub(crate) async fn cluster_revision_now(&self) -> Result<i64> {
        let limit = self.config.consistent_read_timeout;
        let revision = self
            .probe
            .current(&self.upstream, &self.range, limit)
            .await?;
        self.counters.saw_cluster_revision(revision);
        Ok(revision)
    }

    /// Whether etcd compacted `revision` (a check sent after this call, shared, bounded
    /// by the consistent-read timeout): `Some(etcd's compact revision)` if so.
    pub(crate) async fn etcd_compacted(&self, revision: i64) -> Result<Option<i64>> {
        let limit = self.config.consistent_read_timeout;
        self.compaction
            .check(&self.upstream, &self.range, revision, limit)
            .await
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

    /// The status now (a clone: cheap, but not for hot paths; see `is_*`).
    pub(crate) fn status(&self) -> Status {
        self.view.borrow().status.clone()
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.view.borrow().status.ready()
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.view.borrow().status.closed()
    }

    /// Runs `f` on the newest snapshot if the cache is loaded and not closed (one look
    /// at the view: the fast path of a serializable read).
    pub(crate) fn with_serving_snapshot<T>(&self, f: impl FnOnce(&Snapshot) -> T) -> Option<T> {
        let v = self.view.borrow();
        (v.status.loaded && !v.status.closed()).then(|| f(&v.snapshot))
    }

    /// A response header at `revision`, with the upstream's identity.
    pub(crate) fn header(&self, revision: i64) -> etcd_client::ResponseHeader {
        let id = &self.counters.identity;
        let header = Header {
            cluster_id: id[0].load(Ordering::Relaxed),
            member_id: id[1].load(Ordering::Relaxed),
            raft_term: id[2].load(Ordering::Relaxed),
            revision,
        };
        response_header(&header, revision)
    }

    /// A future that resolves at the next published change (a revision or a status).
    pub(crate) fn changed(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let mut rx = self.view.subscribe();
        Box::pin(async move {
            let _ = rx.changed().await;
        })
    }

    /// The status now, then every change of it; ends after the cache stopped.
    pub(crate) fn status_stream(&self) -> StatusStream {
        let rx = self.view.subscribe();
        let inner =
            futures_util::stream::unfold((rx, None::<CacheStatus>), |(mut rx, last)| async move {
                loop {
                    let current = rx.borrow_and_update().status.state.clone();
                    match &last {
                        Some(l) if l.same(&current) => {
                            if l.is_closed() {
                                return None;
                            }
                        }
                        _ => return Some((current.clone(), (rx, Some(current)))),
                    }
                    if rx.changed().await.is_err() {
                        return None;
                    }
                }
            });
        StatusStream {
            inner: Box::pin(inner),
        }
    }

    /// Publishes a new snapshot (follower only, after its dispatch, under the index lock).
    pub(crate) fn publish(&self, snapshot: Snapshot) {
        self.view.send_modify(|v| v.snapshot = Arc::new(snapshot));
    }

    /// Marks a snapshot as loaded (follower only).
    pub(crate) fn set_loaded(&self) {
        self.view
            .send_if_modified(|v| !std::mem::replace(&mut v.status.loaded, true));
    }

    /// Moves to `state` (follower only); waiters wake only on a change. A closed or
    /// failed cache stays so.
    pub(crate) fn set_state(&self, state: CacheStatus) {
        self.view.send_if_modified(|v| {
            if v.status.closed() || v.status.state.same(&state) {
                return false;
            }
            v.status.state = state;
            true
        });
    }

    /// Waits until the status satisfies `f`, or the follower is gone.
    async fn wait_status(&self, f: impl Fn(&Status) -> bool) -> Status {
        let mut rx = self.view.subscribe();
        let result = rx.wait_for(|v| f(&v.status) || v.status.closed()).await;
        match result {
            Ok(v) => v.status.clone(),
            // The sender lives in `self`: it cannot be gone while we borrow it.
            Err(_) => Status {
                loaded: false,
                state: CacheStatus::Closed,
            },
        }
    }

    /// The error a stopped cache reports.
    pub(crate) fn closed_error(status: &Status) -> Error {
        match &status.state {
            CacheStatus::Failed { error } => Error::Failed {
                source: error.clone(),
            },
            _ => Error::Closed,
        }
    }

    /// Waits until the cache is ready (loaded and following).
    ///
    /// # Errors
    /// [`Error::Closed`] if the cache closes first; [`Error::Failed`] if it stopped on a
    /// permanent failure.
    pub(crate) async fn wait_ready(&self) -> Result<()> {
        let s = self.wait_status(|s| s.ready()).await;
        if s.closed() {
            return Err(Self::closed_error(&s));
        }
        Ok(())
    }

    /// Waits until the follower has stopped.
    pub(crate) async fn wait_closed(&self) {
        self.wait_status(|s| s.closed()).await;
    }

    /// Waits until a snapshot is loaded, up to `limit`.
    ///
    /// # Errors
    /// [`Error::NotReady`] after `limit`; [`Error::Closed`] / [`Error::Failed`].
    pub(crate) async fn wait_loaded(&self, limit: Duration) -> Result<()> {
        match tokio::time::timeout(limit, self.wait_status(|s| s.loaded)).await {
            Ok(s) if s.closed() => Err(Self::closed_error(&s)),
            Ok(_) => Ok(()),
            Err(_) => Err(Error::NotReady),
        }
    }

    /// Waits until the applied revision is at least `rev`, asking for progress upstream
    /// while it waits.
    ///
    /// # Errors
    /// [`Error::Closed`] / [`Error::Failed`] if the cache stops first.
    pub(crate) async fn wait_for_revision(&self, rev: i64) -> Result<()> {
        if self.revision() >= rev {
            return Ok(());
        }
        let _guard = self.progress.wait();
        let mut rx = self.view.subscribe();
        let v = rx
            .wait_for(|v| v.snapshot.revision >= rev || v.status.closed())
            .await
            .map_err(|_| Error::Closed)?;
        if v.snapshot.revision >= rev {
            Ok(())
        } else {
            Err(Self::closed_error(&v.status))
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
            unknown_versions: self
                .counters
                .versions
                .lock()
                .iter()
                .filter(|v| v.starts_with("unreachable:"))
                .count(),
            cluster_revision: self.counters.cluster_revision().max(revision),
            behind: (self.counters.cluster_revision() - revision).max(0),
            since_last_heard: self.counters.heard.lock().map(|t| t.elapsed()),
            consistency_checks: self.counters.consistency_checks.load(Ordering::Relaxed),
            consistency_mismatches: self.counters.consistency_mismatches.load(Ordering::Relaxed),
        }
    }
}
