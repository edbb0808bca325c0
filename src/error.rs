//! The crate's error type.

use thiserror::Error;

/// A `Result` whose error defaults to this crate's [`Error`](enum@Error).
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when building, watching or reading through a [`Cache`].
///
/// Bad input is reported with a variant that names the problem and the limit; it never
/// panics and never affects other subscribers. Failures of etcd or of the connection to
/// it are [`Error::Upstream`] (what etcd or the transport said), [`Error::Transport`]
/// (etcd did not answer in time, a stream broke) or [`Error::Protocol`] (etcd answered
/// something the cache cannot use).
///
/// ```
/// use etcd_cache::Error;
///
/// let e = Error::WatchLimit { limit: 10 };
/// assert_eq!(e.to_string(), "at most 10 watches are allowed");
/// assert!(!e.is_permanent_upstream_failure());
/// ```
///
/// [`Cache`]: crate::Cache
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// A read asked for a revision older than the cache can serve.
    ///
    /// `compact_revision` is the oldest revision the cache serves both reads and watches
    /// from now (the same number a watch gets in its canceled response); a read at
    /// `compact_revision - 1` is also served (the snapshot the history starts after).
    /// A watch that starts below the window does not get this error: as with etcd, it
    /// gets a canceled response carrying `compact_revision`. Re-list with
    /// [`Cache::get`] and watch again from the read's revision + 1.
    ///
    /// [`Cache::get`]: crate::Cache::get
    #[error(
        "required revision has been compacted; the cache serves reads and watches from revision {compact_revision}"
    )]
    Compacted {
        /// The oldest revision a read can still ask for.
        compact_revision: i64,
    },

    /// A read asked for a revision that the cluster has not reached yet.
    #[error(
        "required revision {requested} is a future revision; the current revision is {current}"
    )]
    FutureRevision {
        /// The revision that was asked for.
        requested: i64,
        /// The newest revision known when the request was refused.
        current: i64,
    },

    /// The request is malformed: an empty key, an end at or before the start, a negative
    /// revision or limit, an option the cache cannot honour.
    #[error("invalid request: {reason}")]
    InvalidRange {
        /// What is wrong with the request.
        reason: String,
    },

    /// The key range is well-formed but not inside the prefix that the cache holds.
    #[error("key range [{start:?}, {end:?}) is outside the cache's prefix range [{prefix_start:?}, {prefix_end:?})")]
    OutOfRange {
        /// Start of the requested range (lossy UTF-8).
        start: String,
        /// End of the requested range (lossy UTF-8; empty for a single key, "\0" for "to the end").
        end: String,
        /// Start of the cache's range.
        prefix_start: String,
        /// End of the cache's range ("\0" means "to the end of the keyspace").
        prefix_end: String,
    },

    /// Too many watches are open, on the cache or on a [`WatchScope`].
    ///
    /// [`WatchScope`]: crate::WatchScope
    #[error("at most {limit} watches are allowed")]
    WatchLimit {
        /// The configured limit.
        limit: usize,
    },

    /// A watch asked for a watch id that is already in use on its stream.
    #[error("watch id {watch_id} is already in use on this stream")]
    WatchIdInUse {
        /// The id asked for.
        watch_id: i64,
    },

    /// An invalid value was given to [`CacheBuilder`].
    ///
    /// [`CacheBuilder`]: crate::CacheBuilder
    #[error("invalid cache configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },

    /// The cache is not serving yet: its first snapshot is not loaded.
    #[error("the cache is not ready: its first snapshot of the prefix is not loaded yet (see Cache::wait_ready)")]
    NotReady,

    /// The operation waited longer than it was allowed to. For reads that is
    /// `CacheBuilder::consistent_read_timeout`; for [`Cache::wait_ready_timeout`] the
    /// limit given. A unit variant, so that it matches as `Error::Timeout`; what was
    /// waited for is logged with `tracing` at debug level, and the upstream's state is in
    /// [`Cache::status`].
    ///
    /// [`Cache::wait_ready_timeout`]: crate::Cache::wait_ready_timeout
    /// [`Cache::status`]: crate::Cache::status
    #[error(
        "timed out: the cache did not reach the required state within the operation's time limit"
    )]
    Timeout,

    /// The cache was closed.
    #[error("the cache is closed")]
    Closed,

    /// A key or value is not valid UTF-8 (from [`KeyValue::key_str`] and friends).
    ///
    /// [`KeyValue::key_str`]: crate::KeyValue::key_str
    #[error("invalid UTF-8: {0}")]
    Utf8(#[source] std::str::Utf8Error),

    /// What etcd, or the client transport, reported.
    #[error("etcd error: {0}")]
    Upstream(#[source] etcd_client::Error),

    /// etcd could not be reached or did not answer in time, or a stream to it broke.
    #[error("etcd transport failure: {reason}")]
    Transport {
        /// What failed, and the limit that was exceeded where there is one.
        reason: String,
    },

    /// etcd answered something the cache cannot use (an unexpected or malformed
    /// message). The cache reconnects.
    #[error("unexpected answer from etcd: {reason}")]
    Protocol {
        /// What was wrong with the answer.
        reason: String,
    },

    /// The cache stopped because etcd refused it for good (permission denied,
    /// authentication failed, ...), or because of an internal error: retrying would not
    /// help. Its streams end with this error; its reads and waits return it.
    #[error("the cache stopped: {source}")]
    Failed {
        /// The permanent failure.
        #[source]
        source: std::sync::Arc<Error>,
    },

    /// The cache did not become ready within the time given to
    /// [`Cache::wait_ready_timeout`](crate::Cache::wait_ready_timeout) because etcd
    /// kept failing; the cache keeps retrying.
    #[error("the cache did not become ready within {waited:?}; it keeps retrying; the last upstream error: {source}")]
    Unavailable {
        /// How long was waited.
        waited: std::time::Duration,
        /// The last failure of the upstream.
        #[source]
        source: std::sync::Arc<Error>,
    },

    /// etcd accepted every connection of the cache and closed it right after it was made,
    /// before answering anything, `attempts` times in a row since the cache was built.
    /// Over TLS that is etcd refusing a missing or untrusted client certificate
    /// (`--client-cert-auth`) whose alert the client did not read: the server closes
    /// while the client already writes, and the client sees a closed connection or a
    /// broken pipe instead of the alert. The cache stops on it (permanent). A proxy or
    /// load balancer in front of etcd that accepts and closes while no etcd is behind it
    /// looks the same; etcd itself down is refused instead and retried.
    #[error("etcd closed every connection right after it was made, {attempts} times in a row, before answering anything: a TLS client certificate missing or not trusted by etcd (--client-cert-auth; etcd's alert was not read), or a proxy with no etcd behind it; the last error: {source}")]
    ClosedAtConnect {
        /// Connection attempts that ended so.
        attempts: u32,
        /// The last of them.
        #[source]
        source: std::sync::Arc<Error>,
    },

    /// A bug in the cache (its follower task panicked). Please report it.
    #[error("internal error in etcd-cache: {reason}")]
    Internal {
        /// What went wrong.
        reason: String,
    },
}

impl From<etcd_client::Error> for Error {
    fn from(e: etcd_client::Error) -> Self {
        Error::Upstream(e)
    }
}

impl Error {
    pub(crate) fn timeout(what: &'static str, waited: std::time::Duration) -> Self {
        tracing::debug!(what, ?waited, "timed out");
        Error::Timeout
    }

    pub(crate) fn invalid(reason: impl Into<String>) -> Self {
        Error::InvalidRange {
            reason: reason.into(),
        }
    }

    pub(crate) fn transport(reason: impl Into<String>) -> Self {
        Error::Transport {
            reason: reason.into(),
        }
    }

    pub(crate) fn protocol(reason: impl Into<String>) -> Self {
        Error::Protocol {
            reason: reason.into(),
        }
    }

    /// True for an answer from etcd that retrying cannot change: permission denied,
    /// authentication failed or required, an invalid argument, an unimplemented call,
    /// and a TLS handshake refused over certificates (the server's is not trusted, or
    /// etcd refused the client's or its absence). The cache stops on such an error
    /// instead of retrying it.
    pub fn is_permanent_upstream_failure(&self) -> bool {
        use tonic::Code;
        match self {
            Error::Upstream(etcd_client::Error::GRpcStatus(status)) => {
                // A token older than the auth store (JWT, after an auth change): the next
                // attempt authenticates again.
                let old_token = status
                    .message()
                    .contains(crate::upstream::etcd::AUTH_OLD_REVISION);
                (matches!(
                    status.code(),
                    Code::PermissionDenied
                        | Code::Unauthenticated
                        | Code::InvalidArgument
                        | Code::Unimplemented
                ) && !old_token)
                    || certificate_refused(status)
            }
            Error::Upstream(etcd_client::Error::InvalidArgs(_))
            | Error::Upstream(etcd_client::Error::InvalidUri(_)) => true,
            Error::Failed { .. } | Error::ClosedAtConnect { .. } => true,
            _ => false,
        }
    }

    /// True for a connection that was made (TCP, and TLS where configured) and then
    /// closed by the server before anything was answered: hyper's request canceled on
    /// a "connection closed", or a broken pipe, reset or abort after the connect. Not a
    /// refused or failed connect (tonic's "tcp connect error"), a TLS handshake that
    /// failed, or a timeout. One such close is any broken connection; the follower counts
    /// them in a row before anything was answered (see [`Error::ClosedAtConnect`]).
    pub(crate) fn is_closed_after_connect(&self) -> bool {
        use std::io::ErrorKind;
        let Error::Upstream(etcd_client::Error::GRpcStatus(status)) = self else {
            return false;
        };
        // The connect step's failures (refused, reset during the connect, TLS handshake)
        // come as tonic's connect error, answered `Unavailable`.
        if status.code() == tonic::Code::Unavailable {
            return false;
        }
        let mut source = std::error::Error::source(status);
        while let Some(e) = source {
            let text = e.to_string();
            if text.contains(CONNECT_ERROR) {
                return false;
            }
            if text.contains(CONNECTION_CLOSED) {
                return true;
            }
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                return matches!(
                    io.kind(),
                    ErrorKind::BrokenPipe
                        | ErrorKind::ConnectionReset
                        | ErrorKind::ConnectionAborted
                        | ErrorKind::UnexpectedEof
                );
            }
            source = e.source();
        }
        false
    }
}

/// What etcd-client reports for a request whose connection the server closed right after
/// it was made (hyper's "operation was canceled" on "connection closed"), as the fake
/// upstream scripts it.
#[cfg(any(test, feature = "bench-internals"))]
pub(crate) fn closed_after_connect() -> Error {
    let mut status = tonic::Status::cancelled("operation was canceled");
    status.set_source(std::sync::Arc::new(std::io::Error::other(
        CONNECTION_CLOSED,
    )));
    Error::Upstream(etcd_client::Error::GRpcStatus(status))
}

/// tonic's text for a failed connect (refused, unreachable, reset while connecting).
const CONNECT_ERROR: &str = "connect error";
/// hyper's reason for a request canceled because its connection closed under it.
const CONNECTION_CLOSED: &str = "connection closed";

/// Whether a transport failure is a TLS handshake refused over certificates: rustls's
/// "invalid peer certificate: …" (the server's certificate does not verify against the
/// configured CA), or a fatal alert from the server (etcd refused the client's
/// certificate or its absence under `--client-cert-auth`). Read from the error chain's
/// text, which carries rustls's error through tonic and hyper.
fn certificate_refused(status: &tonic::Status) -> bool {
    let refused = |text: &str| {
        text.contains("invalid peer certificate") || text.contains("received fatal alert")
    };
    if refused(status.message()) {
        return true;
    }
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if refused(&e.to_string()) {
            return true;
        }
        source = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_errors_display_their_cause() {
        let e = Error::from(etcd_client::Error::GRpcStatus(
            tonic::Status::permission_denied("etcdserver: permission denied"),
        ));
        assert!(e.to_string().contains("permission denied"), "{e}");
        assert!(e.is_permanent_upstream_failure());
        let e = Error::from(etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
            "connection refused",
        )));
        assert!(e.to_string().contains("connection refused"), "{e}");
        assert!(!e.is_permanent_upstream_failure());
        // TLS refused over certificates (the texts rustls gives, through tonic and hyper).
        let e = Error::from(etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
            "invalid peer certificate: BadSignature",
        )));
        assert!(e.is_permanent_upstream_failure(), "{e}");
        let alert = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "received fatal alert: CertificateRequired",
        );
        let mut status = tonic::Status::unknown("transport error");
        status.set_source(std::sync::Arc::new(alert));
        assert!(Error::from(etcd_client::Error::GRpcStatus(status)).is_permanent_upstream_failure());
        let e = Error::from(etcd_client::Error::GRpcStatus(
            tonic::Status::invalid_argument("etcdserver: revision of auth store is old"),
        ));
        assert!(!e.is_permanent_upstream_failure(), "{e}");
        // Closed right after the connect (what a TLS refusal looks like when its alert
        // was not read): not permanent alone, counted by the follower.
        let e = closed_after_connect();
        assert!(e.is_closed_after_connect() && !e.is_permanent_upstream_failure());
        let mut status = tonic::Status::unknown("transport error");
        status.set_source(std::sync::Arc::new(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "stream closed because of a broken pipe",
        )));
        assert!(Error::from(etcd_client::Error::GRpcStatus(status)).is_closed_after_connect());
        // A connect that failed (refused, or reset while connecting) is not one.
        for kind in [
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::ConnectionReset,
        ] {
            let mut status = tonic::Status::unavailable("tcp connect error");
            status.set_source(std::sync::Arc::new(std::io::Error::new(kind, "os error")));
            let e = Error::from(etcd_client::Error::GRpcStatus(status));
            assert!(!e.is_closed_after_connect(), "{e}");
        }
        let e = Error::ClosedAtConnect {
            attempts: 5,
            source: std::sync::Arc::new(closed_after_connect()),
        };
        assert!(e.is_permanent_upstream_failure());
        assert!(e.to_string().contains("client certificate"), "{e}");
        let e = Error::transport("etcd did not answer within 30s (upstream_idle_timeout)");
        assert!(e.to_string().starts_with("etcd transport failure"), "{e}");
        assert!(!e.is_permanent_upstream_failure());
    }
}
