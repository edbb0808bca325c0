//! What every service shares: the cache, the forwarding upstream, the authorization of
//! what the cache serves, the namespace, the cached key range (as etcd stores keys) and
//! the limits.

use std::sync::Arc;

use bytes::Bytes;
use etcd_cache::Cache;

use crate::authz::Authz;
use crate::cache_slot::CacheSlot;
use crate::namespace::{prefix_end, Namespace};
use crate::upstream::Upstream;

/// Limits a service applies per call or per stream.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// Watches per client connection (0: none).
    pub(crate) watches_per_connection: usize,
    /// Fragment threshold of watch responses (etcd's --max-request-bytes).
    pub(crate) max_request_bytes: usize,
    /// Responses queued per Watch stream.
    pub(crate) watch_send_queue: usize,
}

/// Shared by every service of one proxy.
pub(crate) struct State {
    slot: Arc<CacheSlot>,
    pub(crate) upstream: Arc<Upstream>,
    /// Who may be served what from memory.
    pub(crate) authz: Arc<Authz>,
    pub(crate) namespace: Namespace,
    /// The cache's range in etcd's keyspace; `end == "\0"`: no upper bound.
    cached_start: Bytes,
    cached_end: Bytes,
    pub(crate) limits: Limits,
    /// The URL Cluster.MemberList announces (`--advertise-client-url`); without it,
    /// MemberList is etcd's.
    pub(crate) advertised_url: Option<String>,
    /// `--resolver-prefix`: where the proxies register (`register.rs`); MemberList
    /// lists the registered ones.
    pub(crate) resolver_prefix: Option<String>,
    /// Fires once at shutdown: streams end, unary calls finish.
    pub(crate) shutdown: tokio::sync::watch::Receiver<bool>,
}

impl State {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        slot: Arc<CacheSlot>,
        cache_prefix: &[u8],
        upstream: Arc<Upstream>,
        authz: Arc<Authz>,
        namespace: Namespace,
        limits: Limits,
        advertised_url: Option<String>,
        resolver_prefix: Option<String>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Arc<State> {
        let cached_start = Bytes::copy_from_slice(cache_prefix);
        let cached_end = prefix_end(cache_prefix);
        Arc::new(State {
            slot,
            upstream,
            authz,
            namespace,
            cached_start,
            cached_end,
            limits,
            advertised_url,
            resolver_prefix,
            shutdown,
        })
    }

    /// True if the etcd-space range `[key, end)` lies inside the cache and is well
    /// formed (empty end: one key; `"\0"`: every key from `key`). Anything else is
    /// forwarded, so etcd gives its own answer to a reversed range.
    pub(crate) fn in_cache(&self, key: &[u8], end: &[u8]) -> bool {
        inside(&self.cached_start, &self.cached_end, key, end)
    }

    /// The cache to serve from, if one can serve now (see `cache_slot.rs`); without
    /// one, everything is forwarded.
    pub(crate) fn cache(&self) -> Option<Cache> {
        self.slot.get()
    }

    /// Whether etcd compacted `revision` (0: the latest, never), asked after this call
    /// and shared with the requests asking meanwhile (`Cache::compacted`): what is
    /// below etcd's compaction, etcd answers, never the cache's window. A check that
    /// fails leaves the cache to answer (what it knows of etcd's compaction is the
    /// cache's own), as it answers while etcd is away.
    pub(crate) async fn compacted(&self, revision: i64) -> bool {
        self.compaction_check(revision)
            .await
            .is_some_and(|c| c.compacted().is_some())
    }

    /// [`compacted`](Self::compacted), with etcd's revision when it said readable
    /// (`None`: not asked, or the check failed).
    pub(crate) async fn compaction_check(
        &self,
        revision: i64,
    ) -> Option<etcd_cache::CompactionCheck> {
        let cache = self.cache().filter(|_| revision > 0)?;
        match cache.check_compaction(revision).await {
            Ok(check) => Some(check),
            Err(e) => {
                tracing::debug!(error = %e, revision, "compaction check failed");
                None
            }
        }
    }

    /// The newest revision the cache has applied (0 without a cache).
    pub(crate) fn revision(&self) -> i64 {
        self.slot.get().map_or(0, |c| c.revision())
    }
}

/// True if the well-formed range `[key, range_end)` lies inside `[start, end)` (for both,
/// an empty end is one key and `"\0"` is no bound).
pub(crate) fn inside(start: &[u8], end: &[u8], key: &[u8], range_end: &[u8]) -> bool {
    let unbounded = end == b"\0";
    if key < start {
        return false;
    }
    match range_end {
        b"" => unbounded || key < end,
        b"\0" => unbounded,
        e => key < e && (unbounded || e <= end),
    }
}

/// Resolves once shutdown has begun (and the guard `wait_for` returns is dropped, so
/// the future stays `Send`).
pub(crate) async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use super::inside;

    #[test]
    fn ranges_inside_the_cache() {
        // The whole keyspace.
        assert!(inside(b"", b"\0", b"a", b""));
        assert!(inside(b"", b"\0", b"\0", b"\0"));
        assert!(inside(b"", b"\0", b"a", b"b"));
        assert!(!inside(b"", b"\0", b"b", b"a"), "reversed: forwarded");
        // A prefix /a/ = [/a/, /a0).
        assert!(inside(b"/a/", b"/a0", b"/a/x", b""));
        assert!(inside(b"/a/", b"/a0", b"/a/", b"/a0"));
        assert!(
            !inside(b"/a/", b"/a0", b"/a/", b"\0"),
            "from-key leaves the prefix"
        );
        assert!(!inside(b"/a/", b"/a0", b"/b", b""));
        assert!(!inside(b"/a/", b"/a0", b"/a/x", b"/b"));
    }
}
