//! The gRPC errors etcd answers with (`api/v3rpc/rpctypes/error.go`) and the texts of
//! its watch refusals, whether an answer of etcd's is a refusal of the caller's
//! authority, and the mapping of the cache's errors onto them: the proxy's one home for
//! etcd's words.

use tonic::{Code, Status};

/// etcd's `mvcc.ErrEmptyWatcherRange`.
pub(crate) const EMPTY_RANGE: &str = "mvcc: watcher range is empty";
/// etcd's `mvcc.ErrWatcherDuplicateID`.
pub(crate) const DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";
/// `rpctypes.ErrGRPCCompacted`: what etcd >= 3.5 answers a watch from a negative revision.
pub(crate) const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";

/// Whether etcd refused a call for its caller's authority (no user, a bad or old
/// token, no permission), as opposed to failing to answer.
pub(crate) fn is_auth_refusal(s: &Status) -> bool {
    let m = s.message();
    matches!(
        s.code(),
        Code::InvalidArgument
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::FailedPrecondition
    ) && (m.contains("user name is empty")
        || m.contains("permission denied")
        || m.contains("invalid auth token")
        || m.contains("revision of auth store is old")
        || m.contains("user name not found"))
}

/// The cancel reason etcd gives a watch create it does not permit: the refusal's
/// gRPC error as Go prints it (`rpc error: code = PermissionDenied desc = etcdserver:
/// permission denied`).
pub(crate) fn watch_refusal(s: &Status) -> String {
    format!("rpc error: code = {:?} desc = {}", s.code(), s.message())
}

/// `rpctypes.ErrGRPCEmptyKey`.
pub(crate) fn empty_key() -> Status {
    Status::invalid_argument("etcdserver: key is not provided")
}

/// `rpctypes.ErrGRPCNoLeader`.
pub(crate) fn no_leader() -> Status {
    Status::unavailable("etcdserver: no leader")
}

/// `rpctypes.ErrGRPCInvalidSortOption`.
pub(crate) fn invalid_sort_option() -> Status {
    Status::invalid_argument("etcdserver: invalid sort option")
}

/// A failed receive on a client stream as etcd's grpc-go reports it: a message over the
/// limit is `ResourceExhausted` "grpc: received message larger than max (N vs. M)"
/// (tonic says `OutOfRange` "Error, decoded message length too large: found N bytes, the
/// limit is: M bytes"); anything else keeps its status.
pub(crate) fn from_receive(e: Status) -> Status {
    const PREFIX: &str = "Error, decoded message length too large: found ";
    if let Some(rest) = e.message().strip_prefix(PREFIX) {
        let mut nums = rest
            .split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty());
        if let (Some(found), Some(limit)) = (nums.next(), nums.next()) {
            return Status::resource_exhausted(format!(
                "grpc: received message larger than max ({found} vs. {limit})"
            ));
        }
    }
    e
}

/// The proxy is shutting down.
pub(crate) fn shutting_down() -> Status {
    Status::unavailable("etcd-cache-proxy is shutting down")
}

/// What a cache error means for a read. `None`: the cache cannot answer this read (not
/// ready, outside its window or range, a revision it has not applied yet): it should be forwarded to etcd, whose answer is
/// then the one a client would get from etcd itself.
pub(crate) fn from_cache_read(e: &etcd_cache::Error) -> Option<Status> {
    use etcd_cache::Error;
    match e {
        // The cache's own round trip (its revision probe) was refused for the proxy's
        // identity: etcd answers the caller itself.
        Error::Upstream(u) if is_auth_refusal(&from_upstream(u)) => None,
        // The cache's own connection cannot reach etcd (its endpoint is down): the
        // forwarding channel may reach it by another (--endpoints-auto-sync-interval), and
        // answers Unavailable itself when no endpoint does.
        Error::Upstream(u) if from_upstream(u).code() == Code::Unavailable => None,
        Error::Upstream(u) => Some(from_upstream(u)),
        Error::Closed => Some(shutting_down()),
        _ => None,
    }
}

/// grpc-go's text for a call whose connection closed under it (`transport: error reading
/// from server: EOF`, reported as `Unavailable`): what etcd's own clients see, through
/// grpc-proxy too, when the member dies in a call.
pub(crate) const CONNECTION_CLOSED: &str = "error reading from server: EOF";

/// A forwarded call's failure as a client of etcd would see it. tonic answers a call
/// whose HTTP/2 connection to etcd broke with `Unknown: transport error` (or an h2
/// error); grpc-go, and so etcd's clients and grpc-proxy, with
/// `Unavailable: error reading from server: EOF`. `Unknown` tells a client the call
/// failed for a reason it cannot retry; `Unavailable` that another member may answer.
/// Every other status, etcd's own answers included, is kept as it is.
pub(crate) fn as_etcd_client_sees(s: Status) -> Status {
    let broken = matches!(s.code(), Code::Unknown | Code::Internal) && {
        let m = s.message();
        m == "transport error"
            || m.starts_with("h2 protocol error")
            || m.contains("connection reset")
            || m.contains("connection closed")
            || m.contains("broken pipe")
    };
    if broken {
        Status::unavailable(CONNECTION_CLOSED)
    } else {
        s
    }
}

/// An etcd-client error as the status etcd gave (or `Unavailable` for transport errors).
pub(crate) fn from_upstream(e: &etcd_client::Error) -> Status {
    match e {
        etcd_client::Error::GRpcStatus(s) => Status::new(s.code(), s.message()),
        other => Status::new(Code::Unavailable, other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection that broke under a forwarded call is `Unavailable` with grpc-go's
    /// text (robustness finding R1); etcd's own answers stay as they are.
    #[test]
    fn a_broken_connection_is_unavailable_as_grpc_go_says_it() {
        for broken in [
            Status::unknown("transport error"),
            Status::internal("h2 protocol error: error reading a body from connection"),
            Status::unknown("connection reset by peer"),
        ] {
            let s = as_etcd_client_sees(broken);
            assert_eq!(
                (s.code(), s.message()),
                (Code::Unavailable, CONNECTION_CLOSED)
            );
        }
        for etcds in [
            Status::unknown("etcdserver: no leader"),
            Status::unavailable("etcdserver: leader changed"),
            Status::internal("etcdserver: request timed out"),
            Status::permission_denied("etcdserver: permission denied"),
        ] {
            let kept = as_etcd_client_sees(etcds.clone());
            assert_eq!(
                (kept.code(), kept.message()),
                (etcds.code(), etcds.message())
            );
        }
    }
}
