//! The one seam to etcd. The [`Upstream`] trait speaks only the crate's own types, so
//! the follower, the read path and the barrier can be driven by the [`fake`] upstream in
//! unit tests and benchmarks. Every conversion from and to `etcd_client` types lives in
//! [`etcd`].
//!
//! - [`etcd`]: the production upstream over an `etcd_client::Client`;
//! - [`channel`]: the HTTP/2 windows of the connections to etcd;
//! - [`barrier`]: the shared linearizable revision barrier (consistent reads, watches from
//!   now);
//! - [`fake`]: an in-memory upstream whose every answer a test scripts.

pub(crate) mod channel;
pub(crate) mod etcd;
#[cfg(any(test, feature = "unstable-bench-internals"))]
pub(crate) mod fake;
// `map_or(true, ..)` in barrier.rs predates the MSRV of 1.88 (`Option::is_none_or` is
// 1.82); it becomes `is_none_or` with the next change to that file.
#[allow(clippy::unnecessary_map_or)]
pub(crate) mod barrier;

use futures_util::future::BoxFuture;

use crate::error::{Error, Result};
use crate::key_range::KeyRange;
use crate::kv::{EventType, KeyValue};
use crate::range_request::{RangeRequest, RangeResult};

/// An upstream call that must answer within `limit` (`upstream_idle_timeout`): a
/// connection that died without a reset must not stall the cache forever.
pub(crate) async fn bounded<T>(
    limit: std::time::Duration,
    what: &str,
    call: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(Error::transport(format!(
            "etcd did not answer {what} within {limit:?} (upstream_idle_timeout)"
        )))
    })
}

/// One message of the upstream watch, in the crate's terms.
#[derive(Debug)]
pub(crate) enum WatchMsg {
    /// The watch was created.
    Created,
    /// Events, oldest first; several revisions may share one message.
    Events(Vec<(EventType, KeyValue)>),
    /// No events; every event up to `revision` was sent. `requested` is true for the
    /// answer to a stream-level `RequestProgress` (watch id -1), false for a per-watch
    /// periodic notification.
    Progress { revision: i64, requested: bool },
    /// The watch was cancelled; `compact_revision > 0` means the start revision was
    /// compacted.
    Canceled {
        compact_revision: i64,
        reason: String,
    },
}

/// Who answered, as etcd's response header says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) cluster_id: u64,
    pub(crate) member_id: u64,
    pub(crate) raft_term: u64,
    /// The cluster's revision when etcd answered.
    pub(crate) revision: i64,
}

impl Header {
    /// etcd's response header for a state at `revision`, with this identity (the
    /// revision a response is a state of, not always the one etcd answered at).
    pub(crate) fn at(&self, revision: i64) -> etcd_client::ResponseHeader {
        etcd_client::ResponseHeader(etcd_client::proto::PbResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision,
            raft_term: self.raft_term,
        })
    }
}

/// An answered range: the revision etcd answered at (its header) and the result.
#[derive(Debug, Clone, Default)]
pub(crate) struct RangeResponse {
    /// The header revision: the cluster's revision when etcd answered.
    pub(crate) revision: i64,
    pub(crate) header: Header,
    pub(crate) result: RangeResult,
}

/// An open upstream watch.
pub(crate) trait UpstreamWatch: Send {
    /// The next message; `Ok(None)` when the stream ended. Cancel safe.
    fn message(&mut self) -> BoxFuture<'_, Result<Option<WatchMsg>>>;
    /// Sends a stream-level `RequestProgress`.
    fn request_progress(&mut self) -> BoxFuture<'_, Result<()>>;
    /// The header of the last message received (who answered).
    fn header(&self) -> Header;
}

/// What the cache needs from etcd.
pub(crate) trait Upstream: Send + Sync + 'static {
    /// The server version of every endpoint that could be reached; an endpoint whose
    /// version could not be learned is reported as `unreachable:<url>`.
    fn versions(&self) -> BoxFuture<'_, Result<Vec<String>>>;
    /// One page of `range` at `revision` (0: latest), at most `limit` keys, in key order.
    fn list_page(
        &self,
        range: KeyRange,
        revision: i64,
        limit: i64,
    ) -> BoxFuture<'_, Result<RangeResponse>>;
    /// Opens a watch on `range` from `start_revision` with progress notifications.
    fn watch(
        &self,
        range: KeyRange,
        start_revision: i64,
    ) -> BoxFuture<'_, Result<Box<dyn UpstreamWatch>>>;
    /// The cluster's current revision, by a linearizable count-only, limit-1 read of the
    /// first key of `range`.
    fn current_revision(&self, range: KeyRange) -> BoxFuture<'_, Result<i64>>;
    /// A read answered by etcd itself (the fallback of the read path).
    fn range(&self, request: RangeRequest) -> BoxFuture<'_, Result<RangeResponse>>;
    /// Whether etcd compacted `revision`: [`CompactionCheck::Compacted`] when a read at it
    /// is refused as compacted, [`CompactionCheck::Readable`] with etcd's revision when
    /// it can be read (or is in the future). One linearizable count-only, limit-1 read
    /// of the first key of `range` at `revision`; when compacted, a watch from
    /// `revision` learns etcd's compact revision.
    fn compacted_at(
        &self,
        range: KeyRange,
        revision: i64,
    ) -> BoxFuture<'_, Result<crate::CompactionCheck>>;
}

/// True if this etcd version answers `RequestProgress` correctly (etcd#15220 fixed in
/// 3.4.25 / 3.5.8, etcd#17507 fixed in 3.4.31 / 3.5.13; Kubernetes gates on the latter).
pub(crate) fn version_trusts_progress(version: &str) -> bool {
    let Some((major, minor, patch)) = parse_version(version) else {
        return false;
    };
    match (major, minor) {
        (3, 4) => patch >= 31,
        (3, 5) => patch >= 13,
        (3, m) => m >= 6,
        (m, _) => m > 3,
    }
}

/// Whether etcd at `version` answers a keys-only Range without the leases (3.7 does;
/// 3.4 to 3.6 keep them): the cache answers as the cluster it follows.
pub(crate) fn keys_only_drops_lease(version: &str) -> bool {
    parse_version(version).is_some_and(|(major, minor, _)| (major, minor) >= (3, 7))
}

/// `major.minor.patch` of a version as etcd reports it (`3.5.13`, `v3.6.0-alpha.0`).
fn parse_version(version: &str) -> Option<(u64, u64, u64)> {
    let mut parts = version
        .trim_start_matches('v')
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u64>().ok());
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Some(major)), Some(Some(minor)), Some(Some(patch))) => Some((major, minor, patch)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_only_reads_lose_their_leases_from_3_7() {
        for v in ["3.7.0", "3.7.3", "v3.8.0-alpha.0", "4.0.0"] {
            assert!(keys_only_drops_lease(v), "{v}");
        }
        for v in ["3.4.23", "3.5.35", "3.6.16", "unreachable:http://x", ""] {
            assert!(!keys_only_drops_lease(v), "{v}");
        }
    }

    #[test]
    fn fixed_versions_are_trusted() {
        for v in [
            "3.4.31", "3.4.38", "3.5.13", "3.5.21", "3.6.0", "3.6.5", "4.0.0", "v3.5.13",
        ] {
            assert!(version_trusts_progress(v), "{v}");
        }
        for v in [
            "3.4.23",
            "3.4.30",
            "3.5.8",
            "3.5.12",
            "3.3.27",
            "",
            "garbage",
            "unreachable:x",
        ] {
            assert!(!version_trusts_progress(v), "{v}");
        }
    }
}
