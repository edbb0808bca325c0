//! The crate's error type (`classify.rs`: etcd-client's errors, classified).

mod classify;

use thiserror::Error;

use classify::{
    closed_under_call, is_stream_break, permanent, root_cause_text, shorten, too_many_data_frames,
    upstream_summary,
};
pub(crate) use classify::{
    connection_failed, token_refused, AUTH_OLD_REVISION, COMPACTED_REVISION, FUTURE_REVISION,
    INVALID_AUTH_TOKEN, PERMISSION_DENIED,
};

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
/// `Display` is one short line for a person: what happened and, where the cache knows
/// it, which member; for a wrapped upstream failure, etcd's own message or the root
/// cause of a transport error (`connection refused`, `connection reset by peer`), never
/// tonic's and hyper's nested debug output. The whole chain is behind
/// [`source()`](std::error::Error::source): [`Error::Upstream`] and a broken stream's
/// [`Error::Transport`] keep etcd-client's error there.
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
        reason: InvalidReason,
    },

    /// The key range is well-formed but not inside the prefix that the cache holds.
    #[error(
        "key range [{:?}, {:?}) is outside the cache's prefix range [{:?}, {:?})",
        lossy(.start),
        lossy(.end),
        lossy(.prefix_start),
        lossy(.prefix_end)
    )]
    OutOfRange {
        /// Start of the requested range (its bytes; `Display` shows them as lossy UTF-8).
        start: Vec<u8>,
        /// End of the requested range (empty for a single key, `"\0"` for "to the end").
        end: Vec<u8>,
        /// Start of the cache's range.
        prefix_start: Vec<u8>,
        /// End of the cache's range (`"\0"` means "to the end of the keyspace").
        prefix_end: Vec<u8>,
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

    /// What etcd, or the client transport, reported. Displays a one-line summary
    /// (etcd's message and status code, or the root cause of a transport error); the
    /// error itself is the source.
    #[error("etcd error: {}", upstream_summary(.0))]
    Upstream(#[source] etcd_client::Error),

    /// etcd could not be reached or did not answer in time, or a stream to it broke
    /// (an HTTP/2 protocol error, a connection reset or closed under the watch).
    #[error("etcd transport failure: {reason}")]
    Transport {
        /// What failed (which member, where known), and the limit that was exceeded
        /// where there is one.
        reason: String,
        /// etcd-client's error, for a stream that broke; `None` for a timeout.
        #[source]
        source: Option<etcd_client::Error>,
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

    /// [`TypedView::by_index`](crate::TypedView::by_index) named an index the view was
    /// not built with.
    #[error("the typed view has no index named {name:?} (its indexes: {known})")]
    UnknownIndex {
        /// The name asked for.
        name: String,
        /// The view's index names, comma-separated ("none" when it has none).
        known: String,
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

/// What is wrong with a request refused as [`Error::InvalidRange`]: the problem, with
/// the value at fault. `Display` is the sentence [`Error::InvalidRange`] shows.
///
/// ```
/// use etcd_cache::{Error, InvalidReason, WatchOptions};
///
/// # async fn demo(cache: etcd_cache::Cache) {
/// let refused = cache
///     .watch("/app/a", Some(WatchOptions::new().with_start_revision(-1)))
///     .await
///     .unwrap_err();
/// assert!(matches!(
///     refused,
///     Error::InvalidRange { reason: InvalidReason::NegativeStartRevision(-1) }
/// ));
/// # }
/// let reason = InvalidReason::NegativeLimit(-5);
/// assert_eq!(reason.to_string(), "negative limit -5");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum InvalidReason {
    /// A single-key request with an empty key.
    #[error("empty key (use with_prefix or with_all_keys to select many keys)")]
    EmptyKey,
    /// A range end with an empty key.
    #[error("empty key with a range end")]
    EmptyKeyWithRangeEnd,
    /// An empty range end (a single key has none).
    #[error("empty range end (omit with_range to select one key)")]
    EmptyRangeEnd,
    /// A range end at or before its key.
    #[error("range end {:?} is not after the key {:?}", lossy(.end), lossy(.key))]
    EndNotAfterKey {
        /// The key (the range's start).
        key: Vec<u8>,
        /// The range end.
        end: Vec<u8>,
    },
    /// A watch from a negative revision.
    #[error("negative start revision {0}")]
    NegativeStartRevision(i64),
    /// A negative watch id (0 picks one).
    #[error("negative watch id {0} (0 picks one)")]
    NegativeWatchId(i64),
    /// A read at a negative revision.
    #[error("negative revision {0}")]
    NegativeRevision(i64),
    /// A read with a negative limit.
    #[error("negative limit {0}")]
    NegativeLimit(i64),
}

/// Key bytes as a person reads them (lossy UTF-8).
fn lossy(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

impl Error {
    pub(crate) fn timeout(what: &'static str, waited: std::time::Duration) -> Self {
        tracing::debug!(what, ?waited, "timed out");
        Error::Timeout
    }

    pub(crate) fn invalid(reason: InvalidReason) -> Self {
        Error::InvalidRange { reason }
    }

    pub(crate) fn transport(reason: impl Into<String>) -> Self {
        Error::Transport {
            reason: reason.into(),
            source: None,
        }
    }

    /// The error for `e`, which ended the upstream watch stream from `member` (0:
    /// unknown): [`Error::Transport`] when the stream broke (see [`is_stream_break`]),
    /// else [`Error::Upstream`] (what etcd said).
    pub(crate) fn watch_stream(e: etcd_client::Error, member: u64) -> Self {
        if !is_stream_break(&e) {
            return Error::Upstream(e);
        }
        let from = if member == 0 {
            String::new()
        } else {
            format!(" from member {member:x}")
        };
        Error::Transport {
            reason: format!(
                "the watch stream{from} broke: {}",
                shorten(&root_cause_text(&e))
            ),
            source: Some(e),
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
        match self {
            Error::Upstream(e)
            | Error::Transport {
                source: Some(e), ..
            } => permanent(e),
            Error::Failed { .. } | Error::ClosedAtConnect { .. } => true,
            _ => false,
        }
    }

    /// True for a connection closed by the client's own h2 because too many small DATA
    /// frames from etcd sat unread (see `upstream/channel.rs`), not by etcd.
    pub(crate) fn is_too_many_data_frames(&self) -> bool {
        match self {
            Error::Upstream(e)
            | Error::Transport {
                source: Some(e), ..
            } => too_many_data_frames(e),
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
        let Error::Upstream(etcd_client::Error::GRpcStatus(status)) = self else {
            return false;
        };
        // The connect step's failures (refused, reset during the connect, TLS handshake)
        // come as tonic's connect error, answered `Unavailable`.
        status.code() != tonic::Code::Unavailable && closed_under_call(status)
    }
}

/// What etcd-client reports for a request whose connection the server closed right after
/// it was made (hyper's "operation was canceled" on "connection closed"), as the fake
/// upstream scripts it.
#[cfg(any(test, feature = "unstable-bench-internals"))]
pub(crate) fn closed_after_connect() -> Error {
    let mut status = tonic::Status::cancelled("operation was canceled");
    status.set_source(std::sync::Arc::new(std::io::Error::other(
        classify::CONNECTION_CLOSED,
    )));
    Error::Upstream(etcd_client::Error::GRpcStatus(status))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

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

    /// What tonic gives when the connection under a watch stream is reset (etcd killed):
    /// code Unknown, hyper's text, and the I/O error two levels down.
    fn h2_reset() -> etcd_client::Error {
        #[derive(Debug)]
        struct Hyper(std::io::Error);
        impl std::fmt::Display for Hyper {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("error reading a body from connection")
            }
        }
        impl std::error::Error for Hyper {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let io = std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "Connection reset by peer (os error 104)",
        );
        let mut status =
            tonic::Status::unknown("h2 protocol error: error reading a body from connection");
        status.set_source(std::sync::Arc::new(Hyper(io)));
        etcd_client::Error::GRpcStatus(status)
    }

    #[test]
    fn a_broken_watch_stream_is_a_transport_failure_with_its_cause_behind_source() {
        let e = Error::watch_stream(h2_reset(), 0x2a);
        let Error::Transport { reason, source } = &e else {
            panic!("not a transport failure: {e:?}");
        };
        assert_eq!(
            reason,
            "the watch stream from member 2a broke: Connection reset by peer (os error 104)"
        );
        assert!(source.is_some());
        assert_eq!(
            e.to_string(),
            "etcd transport failure: the watch stream from member 2a broke: \
             Connection reset by peer (os error 104)"
        );
        // The whole chain is still there: etcd-client's error, with tonic's status in it.
        let cause = std::error::Error::source(&e).expect("a source");
        assert!(cause.to_string().contains("h2 protocol error"), "{cause}");
        assert!(!e.is_permanent_upstream_failure());
        // Member unknown (no response yet); an I/O error or a closed connection.
        let e = Error::watch_stream(
            etcd_client::Error::IoError(std::io::Error::from(std::io::ErrorKind::BrokenPipe)),
            0,
        );
        assert!(
            e.to_string()
                .starts_with("etcd transport failure: the watch stream broke: "),
            "{e}"
        );
        let closed = etcd_client::Error::GRpcStatus(tonic::Status::cancelled(
            "operation was canceled: connection closed",
        ));
        assert!(matches!(
            Error::watch_stream(closed, 1),
            Error::Transport { .. }
        ));
    }

    #[test]
    fn etcd_answers_on_a_watch_stream_stay_upstream_errors() {
        for status in [
            tonic::Status::unavailable("etcdserver: no leader"),
            tonic::Status::permission_denied("etcdserver: permission denied"),
            tonic::Status::unknown("etcdserver: request timed out"),
        ] {
            let e = Error::watch_stream(etcd_client::Error::GRpcStatus(status), 7);
            assert!(matches!(e, Error::Upstream(_)), "{e:?}");
        }
    }

    #[test]
    fn a_certificate_refused_on_a_stream_stays_permanent() {
        let alert = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "received fatal alert: CertificateRequired",
        );
        let mut status = tonic::Status::unknown("transport error");
        status.set_source(std::sync::Arc::new(alert));
        let e = Error::watch_stream(etcd_client::Error::GRpcStatus(status), 1);
        assert!(matches!(e, Error::Transport { .. }), "{e:?}");
        assert!(e.is_permanent_upstream_failure(), "{e}");
    }

    #[test]
    fn upstream_display_is_one_short_line_without_tonic_internals() {
        let e = Error::Upstream(h2_reset());
        assert_eq!(
            e.to_string(),
            "etcd error: h2 protocol error: error reading a body from connection: \
             Connection reset by peer (os error 104) (Unknown)"
        );
        // etcd-client's own text carries tonic's `source: …` debug output; ours does not.
        let inner = std::error::Error::source(&e).expect("a source").to_string();
        assert!(inner.contains("source:"), "{inner}");
        assert!(!e.to_string().contains("source:"), "{e}");

        let long = "x".repeat(1000);
        let e = Error::from(etcd_client::Error::GRpcStatus(tonic::Status::internal(
            format!("{long}\nsecond line"),
        )));
        let text = e.to_string();
        assert!(text.chars().count() < 200, "{text}");
        assert!(
            text.contains('…') && !text.contains("second line"),
            "{text}"
        );
        let e = Error::from(etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
            "",
        )));
        assert_eq!(e.to_string(), "etcd error: Unavailable");
        let e = Error::from(etcd_client::Error::InvalidArgs("no endpoint".into()));
        assert_eq!(e.to_string(), "etcd error: invalid arguments: no endpoint");
    }

    #[test]
    fn status_display_says_what_the_cache_does() {
        use crate::CacheStatus;
        let error = Arc::new(Error::watch_stream(h2_reset(), 0x2a));
        let status = CacheStatus::Reconnecting {
            error: error.clone(),
            attempts: 3,
        };
        let text = status.to_string();
        assert_eq!(
            text,
            "reconnecting to etcd (attempt 3); watches stay open and resume without loss: \
             etcd transport failure: the watch stream from member 2a broke: \
             Connection reset by peer (os error 104)"
        );
        assert!(text.len() < 200, "{} characters: {text}", text.len());
        let failed = CacheStatus::Failed {
            error: Arc::new(Error::from(etcd_client::Error::GRpcStatus(
                tonic::Status::permission_denied("etcdserver: permission denied"),
            ))),
        };
        assert_eq!(
            failed.to_string(),
            "stopped for good (retrying would not help): \
             etcd error: etcdserver: permission denied (PermissionDenied)"
        );
        assert_eq!(CacheStatus::Ready.to_string(), "ready: following etcd");
        assert!(CacheStatus::Relisting {
            compact_revision: 9
        }
        .to_string()
        .contains("revision 9"));
    }
}
