//! A refused watch create: its reason travels as a [`Refusal`] from where it is decided
//! (the session or the cache side) until [`refused`] prints it as etcd's clients read it.

use std::fmt;

use tonic::Status;

use super::messages::INVALID_WATCH_ID;
use crate::etcd_errors;
use crate::metrics::RefusalKind;
use crate::pb::etcdserverpb::{ResponseHeader, WatchResponse};

/// Why the proxy refuses a watch create: decided on the way in (by the session or the
/// cache side), printed only by [`refused`] as the cancel reason etcd's clients read, and
/// counted by its [`kind`](Refusal::kind).
#[derive(Debug)]
pub(crate) enum Refusal {
    /// A negative start revision: etcd >= 3.5 answers it as compacted (3.4 lets the
    /// watch start from the oldest revision).
    NegativeRevision,
    /// etcd's `mvcc.ErrEmptyWatcherRange`.
    EmptyRange,
    /// etcd's `mvcc.ErrWatcherDuplicateID`.
    DuplicateId,
    /// etcd does not allow the caller the range (no user, a bad or old token, no
    /// permission): its refusal, printed as etcd prints it.
    NotAllowed(Status),
    /// `--max-watches-per-connection`, reached.
    ConnectionLimit(usize),
    /// `--max-watches`, reached.
    ProxyLimit(usize),
    /// The range leaves the cached prefix (the cache's error).
    OutsidePrefix(etcd_cache::Error),
    /// Anything else the cache refused.
    Cache(etcd_cache::Error),
}

impl Refusal {
    /// Its label in `etcd_cache_proxy_watches_refused_total`.
    pub(crate) fn kind(&self) -> RefusalKind {
        match self {
            Refusal::ConnectionLimit(_) => RefusalKind::ConnectionLimit,
            Refusal::ProxyLimit(_) => RefusalKind::ProxyLimit,
            Refusal::NegativeRevision
            | Refusal::EmptyRange
            | Refusal::DuplicateId
            | Refusal::NotAllowed(_)
            | Refusal::OutsidePrefix(_)
            | Refusal::Cache(_) => RefusalKind::Invalid,
        }
    }
}

/// The cancel reason etcd's clients read.
impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NegativeRevision => f.write_str(etcd_errors::COMPACTED),
            Refusal::EmptyRange => f.write_str(etcd_errors::EMPTY_RANGE),
            Refusal::DuplicateId => f.write_str(etcd_errors::DUPLICATE_ID),
            Refusal::NotAllowed(s) => f.write_str(&etcd_errors::watch_refusal(s)),
            Refusal::ConnectionLimit(limit) => write!(
                f,
                "ETCD_WATCH_LIMIT: at most {limit} watches are allowed per connection"
            ),
            Refusal::ProxyLimit(limit) => write!(
                f,
                "ETCD_WATCH_LIMIT: at most {limit} watches are allowed on this proxy"
            ),
            Refusal::OutsidePrefix(e) => write!(
                f,
                "etcd-cache-proxy: the key range is outside the cached prefix ({e}); \
                 watches are served from the cache only"
            ),
            Refusal::Cache(e) => write!(f, "etcd-cache-proxy: {e}"),
        }
    }
}

/// A create refused as etcd refuses one: created and canceled at once, with watch id -1
/// and the reason printed.
pub(crate) fn refused(header: ResponseHeader, refusal: &Refusal) -> WatchResponse {
    WatchResponse {
        header: Some(header),
        watch_id: INVALID_WATCH_ID,
        created: true,
        canceled: true,
        cancel_reason: refusal.to_string(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_print_etcds_reasons_and_count_by_kind() {
        let limit = Refusal::ConnectionLimit(3);
        assert_eq!(
            limit.to_string(),
            "ETCD_WATCH_LIMIT: at most 3 watches are allowed per connection"
        );
        assert_eq!(limit.kind(), RefusalKind::ConnectionLimit);
        let limit = Refusal::ProxyLimit(3);
        assert_eq!(
            limit.to_string(),
            "ETCD_WATCH_LIMIT: at most 3 watches are allowed on this proxy"
        );
        assert_eq!(limit.kind(), RefusalKind::ProxyLimit);
        assert_eq!(
            Refusal::EmptyRange.to_string(),
            "mvcc: watcher range is empty"
        );
        assert_eq!(Refusal::EmptyRange.kind(), RefusalKind::Invalid);
        let denied =
            Refusal::NotAllowed(Status::permission_denied("etcdserver: permission denied"));
        assert_eq!(
            denied.to_string(),
            "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
        );
        assert_eq!(denied.kind(), RefusalKind::Invalid);
        let header = ResponseHeader::default();
        let resp = refused(header, &Refusal::DuplicateId);
        assert!(resp.created && resp.canceled);
        assert_eq!(resp.watch_id, INVALID_WATCH_ID);
        assert_eq!(resp.cancel_reason, etcd_errors::DUPLICATE_ID);
    }
}
