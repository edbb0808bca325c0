//! The numbers a user checks ([`CacheStats`], from
//! [`Cache::stats`](crate::Cache::stats)) and the counters behind them, each with one
//! writer.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::upstream::Header;

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
    /// its revision barrier and etcd's answers).
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

/// The identity of the member that answered last, on a cache line of its own: every
/// response's header reads it, and the counters beside it change at every upstream
/// message.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Identity([AtomicU64; 3]);

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
    identity: Identity,
    consistency_checks: AtomicU64,
    consistency_mismatches: AtomicU64,
}

impl Counters {
    /// Fills in what the counters know: everything but the view's, the history's and
    /// the subscribers' numbers (`revision` must be set).
    pub(crate) fn fill(&self, stats: &mut CacheStats) {
        let revision = stats.revision;
        stats.connects = self.connects.load(Ordering::Relaxed);
        stats.lists = self.lists.load(Ordering::Relaxed);
        stats.fallback_reads = self.fallback_reads.load(Ordering::Relaxed);
        stats.progress_trusted = self.progress_trusted();
        stats.unknown_versions = self
            .versions
            .lock()
            .iter()
            .filter(|v| v.starts_with("unreachable:"))
            .count();
        stats.cluster_revision = self.cluster_revision().max(revision);
        stats.behind = (self.cluster_revision() - revision).max(0);
        stats.since_last_heard = self.heard.lock().map(|t| t.elapsed());
        stats.consistency_checks = self.consistency_checks.load(Ordering::Relaxed);
        stats.consistency_mismatches = self.consistency_mismatches.load(Ordering::Relaxed);
    }

    /// The identity of the member that answered last (cluster id, member id, raft
    /// term; zeros before any answer).
    #[inline]
    pub(crate) fn identity(&self) -> (u64, u64, u64) {
        let id = &self.identity.0;
        (
            id[0].load(Ordering::Relaxed),
            id[1].load(Ordering::Relaxed),
            id[2].load(Ordering::Relaxed),
        )
    }

    /// Records who answered (from an upstream header).
    ///
    /// Stored only when it changed: every response's header reads it, on every core,
    /// and a store (even of the same values) at each upstream message would take the
    /// line from all of them.
    pub(crate) fn set_identity(&self, header: Header) {
        let new = (header.cluster_id, header.member_id, header.raft_term);
        if header.cluster_id != 0 && self.identity() != new {
            let id = &self.identity.0;
            id[0].store(new.0, Ordering::Relaxed);
            id[1].store(new.1, Ordering::Relaxed);
            id[2].store(new.2, Ordering::Relaxed);
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
