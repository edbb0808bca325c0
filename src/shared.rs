//! The state shared by the cache's handles, its follower task, its streams and its
//! readers: the configuration, the history, the subscriber registry, the published
//! [view](crate::view) (snapshot and status), the progress requestor, the shared
//! round trips to etcd (revision, compaction), the [counters](crate::stats), and the
//! seam to etcd.
//!
//! The follower is the only writer of the history, the store and the view (it alone
//! holds the view's [`Publisher`]).

use std::sync::Arc;

use parking_lot::Mutex;

use crate::config::Config;
use crate::error::Result;
use crate::history::{History, HistoryWriter, SharedHistory};
use crate::key_range::KeyRange;
use crate::metrics::Metrics;
use crate::progress::ProgressRequestor;
use crate::stats::{CacheStats, Counters};
use crate::subscribers::Subscribers;
use crate::upstream::barrier::RevisionBarrier;
use crate::upstream::{Header, Upstream};
use crate::view::{Publisher, Viewer};

/// State shared by the handles, the follower and the streams.
pub(crate) struct Shared {
    config: Config,
    /// The cache's key range (derived from the prefix).
    range: KeyRange,
    /// Written by the follower only. Lock order: the index, then the history.
    history: Arc<SharedHistory>,
    subscribers: Subscribers,
    /// The published view (snapshot and status); only the follower's
    /// [`Publisher`] changes it.
    view: Viewer,
    progress: Arc<ProgressRequestor>,
    /// Shared linearizable revision probes (consistent reads, watches from now).
    barrier: Arc<RevisionBarrier>,
    /// What the cache knows of etcd's compaction, and its shared checks.
    compaction: Arc<crate::compaction::Compaction>,
    upstream: Arc<dyn Upstream>,
    counters: Counters,
    metrics: Metrics,
    /// Test hooks (feature `unstable-test-hooks`); inert otherwise.
    hooks: Hooks,
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
    // Readers' access: every part of the shared state is read through these (the
    // fields are private; what changes them is the follower's own).

    /// The configuration.
    #[inline]
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// The cache's key range (derived from the prefix).
    #[inline]
    pub(crate) fn range(&self) -> &KeyRange {
        &self.range
    }

    /// The history: readers only (the follower holds its writer). Lock order: the index, then the history.
    #[inline]
    pub(crate) fn history(&self) -> &SharedHistory {
        &self.history
    }

    /// The subscriber registry.
    #[inline]
    pub(crate) fn subscribers(&self) -> &Subscribers {
        &self.subscribers
    }

    /// The published view (snapshot and status); only the follower's [`Publisher`] changes it.
    #[inline]
    pub(crate) fn view(&self) -> &Viewer {
        &self.view
    }

    /// The progress requestor.
    #[inline]
    pub(crate) fn progress(&self) -> &Arc<ProgressRequestor> {
        &self.progress
    }

    /// What the cache knows of etcd's compaction, and its shared checks.
    #[inline]
    pub(crate) fn compaction(&self) -> &Arc<crate::compaction::Compaction> {
        &self.compaction
    }

    /// The seam to etcd.
    #[inline]
    pub(crate) fn upstream(&self) -> &Arc<dyn Upstream> {
        &self.upstream
    }

    /// The cache's counters.
    #[inline]
    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The cache's metrics.
    #[inline]
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Test hooks (feature `unstable-test-hooks`); inert otherwise.
    #[inline]
    pub(crate) fn hooks(&self) -> &Hooks {
        &self.hooks
    }

    /// The shared state, and what only the follower may hold: the publisher of its
    /// view and the writer of its history.
    pub(crate) fn new(
        config: Config,
        upstream: Arc<dyn Upstream>,
    ) -> (Arc<Self>, Publisher, HistoryWriter) {
        let (publisher, view) = crate::view::channel();
        let (history, history_writer) = SharedHistory::new(
            History::new(config.history_window, config.history_bytes)
                .keeping_while_lagging(config.keep_history_while_lagging),
        );
        let shared = Arc::new(Shared {
            range: KeyRange::for_prefix(&config.prefix),
            history,
            subscribers: Subscribers::new(config.max_watchers, config.subscriber_buffer),
            view,
            progress: Arc::default(),
            barrier: Arc::default(),
            compaction: Arc::default(),
            upstream,
            counters: Counters::default(),
            metrics: Metrics::new(&config.prefix),
            hooks: Hooks::default(),
            config,
        });
        (shared, publisher, history_writer)
    }

    /// The cluster's current revision: one linearizable round trip shared with
    /// concurrent callers, bounded by the consistent-read timeout, recorded as seen.
    /// The one way the crate asks for it (reads fail with its error; watches from now
    /// and stream-wide progress requests go on without it).
    pub(crate) async fn cluster_revision_now(&self) -> Result<i64> {
        let limit = self.config.consistent_read_timeout;
        let revision = self
            .barrier
            .current(&self.upstream, &self.range, limit)
            .await?;
        self.counters.saw_cluster_revision(revision);
        Ok(revision)
    }

    /// Whether etcd compacted `revision` (a check sent after this call, shared, bounded
    /// by the consistent-read timeout): `Some(etcd's compact revision)` if so.
    pub(crate) async fn etcd_compacted(&self, revision: i64) -> Result<Option<i64>> {
        Ok(self.etcd_compaction_check(revision).await?.compacted())
    }

    /// [`etcd_compacted`](Self::etcd_compacted), with etcd's revision when readable.
    pub(crate) async fn etcd_compaction_check(
        &self,
        revision: i64,
    ) -> Result<crate::CompactionCheck> {
        let limit = self.config.consistent_read_timeout;
        self.compaction
            .check_at(&self.upstream, &self.range, revision, limit)
            .await
    }

    /// A response header at `revision`, with the upstream's identity.
    pub(crate) fn header(&self, revision: i64) -> etcd_client::ResponseHeader {
        let (cluster_id, member_id, raft_term) = self.counters.identity();
        let header = Header {
            cluster_id,
            member_id,
            raft_term,
            revision,
        };
        header.at(revision)
    }

    /// Waits until the applied revision is at least `rev`, asking for progress upstream
    /// while it waits.
    ///
    /// # Errors
    /// [`Error::Closed`] / [`Error::Failed`] if the cache stops first.
    pub(crate) async fn wait_for_revision(&self, rev: i64) -> Result<()> {
        if self.view.revision() >= rev {
            return Ok(());
        }
        let _wait = self.progress.wait();
        let v = self.view.wait_revision(rev).await;
        if v.snapshot.revision >= rev {
            Ok(())
        } else {
            Err(v.status.closed_error())
        }
    }

    pub(crate) fn stats(&self) -> CacheStats {
        let mut stats = self.view.with_snapshot(|s| CacheStats {
            revision: s.revision,
            keys: s.map.len(),
            store_bytes: s.bytes,
            ..CacheStats::default()
        });
        {
            let history = self.history.read();
            stats.history_len = history.len();
            stats.history_floor = history.floor();
            stats.history_bytes = history.bytes();
        }
        stats.watchers = self.subscribers.watchers();
        stats.lagging = self.subscribers.lagging();
        stats.progress_requests = self.progress.sent();
        self.counters.fill(&mut stats);
        stats
    }
}
