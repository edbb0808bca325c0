//! The crate's error type.

use thiserror::Error;

/// A `Result` whose error defaults to this crate's [`Error`](enum@Error).
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when building, watching or reading through a [`Cache`].
///
/// Bad input is reported with a variant that names the problem and the limit; it never
/// panics and never affects other subscribers.
///
/// [`Cache`]: crate::Cache
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// The requested revision is older than the oldest revision the cache can serve.
    ///
    /// A watcher that gets this must re-list (for example with [`Cache::get`]) and watch
    /// again from the revision of that read + 1.
    ///
    /// [`Cache::get`]: crate::Cache::get
    #[error(
        "required revision has been compacted; the oldest revision available is {compact_revision}"
    )]
    Compacted {
        /// The smallest revision that can still be requested.
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

    /// The key range is malformed: an empty key, an end at or before the start, or a
    /// negative revision or limit.
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

    /// An invalid value was given to [`CacheBuilder`].
    ///
    /// [`CacheBuilder`]: crate::CacheBuilder
    #[error("invalid cache configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },

    /// The cache is not serving yet (first snapshot not loaded, or the upstream is down
    /// and the request cannot be answered correctly from memory).
    #[error("the cache is not ready")]
    NotReady,

    /// The operation waited longer than it was allowed to (for reads:
    /// `CacheBuilder::consistent_read_timeout`). A unit variant, so it can be matched as
    /// `Error::Timeout`; what was waited for is logged with `tracing`.
    #[error("timed out waiting for the cache or for etcd (see consistent_read_timeout)")]
    Timeout,

    /// The cache was closed.
    #[error("the cache is closed")]
    Closed,

    /// A key or value is not valid UTF-8 (from [`KeyValue::key_str`] and friends).
    ///
    /// [`KeyValue::key_str`]: crate::KeyValue::key_str
    #[error("invalid UTF-8")]
    Utf8(#[source] std::str::Utf8Error),

    /// An error reported by etcd or by the client transport.
    #[error("etcd error")]
    Upstream(#[source] etcd_client::Error),
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
}
