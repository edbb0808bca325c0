//! Where the cache is in its life: [`CacheStatus`] (public), the lifecycle as the
//! follower publishes it ([`Status`], inside the [view](crate::view)), the
//! [`StatusStream`] of its changes, and the waits on it ([`wait_ready`],
//! [`wait_loaded`], [`wait_closed`]), each on a receiver of anything that holds a
//! `Status` (the view does).

use std::borrow::Borrow;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::{Error, Result};

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

    /// The same state (the same error, by identity): waiters wake only on a change.
    pub(crate) fn same(&self, other: &CacheStatus) -> bool {
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

impl StatusStream {
    /// The status in `rx` now, then every change of it; ends after the cache stopped.
    pub(crate) fn new<V: Borrow<Status> + Send + Sync + 'static>(
        rx: watch::Receiver<V>,
    ) -> StatusStream {
        let inner =
            futures_util::stream::unfold((rx, None::<CacheStatus>), |(mut rx, last)| async move {
                loop {
                    let current = status_of(&*rx.borrow_and_update()).state.clone();
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
}

impl Status {
    /// The error a stopped cache reports.
    pub(crate) fn closed_error(&self) -> Error {
        match &self.state {
            CacheStatus::Failed { error } => Error::Failed {
                source: error.clone(),
            },
            _ => Error::Closed,
        }
    }
}

/// Waits until the status in `rx` satisfies `f`, or the cache has stopped (its
/// publisher closes the status before it goes).
async fn wait_status<V: Borrow<Status>>(
    mut rx: watch::Receiver<V>,
    f: impl Fn(&Status) -> bool,
) -> Status {
    let result = rx
        .wait_for(|v| f(status_of(v)) || status_of(v).closed())
        .await
        .map(|v| status_of(&*v).clone());
    result.unwrap_or_else(|_| status_of(&*rx.borrow()).clone())
}

fn status_of<V: Borrow<Status>>(v: &V) -> &Status {
    v.borrow()
}

/// Waits until the cache is ready (loaded and following).
///
/// # Errors
/// [`Error::Closed`] if the cache closes first; [`Error::Failed`] if it stopped on a
/// permanent failure.
pub(crate) async fn wait_ready<V: Borrow<Status>>(rx: watch::Receiver<V>) -> Result<()> {
    let s = wait_status(rx, |s| s.ready()).await;
    if s.closed() {
        return Err(s.closed_error());
    }
    Ok(())
}

/// Waits until the follower has stopped.
pub(crate) async fn wait_closed<V: Borrow<Status>>(rx: watch::Receiver<V>) {
    wait_status(rx, |s| s.closed()).await;
}

/// Waits until a snapshot is loaded, up to `limit`.
///
/// # Errors
/// [`Error::NotReady`] after `limit`; [`Error::Closed`] / [`Error::Failed`].
pub(crate) async fn wait_loaded<V: Borrow<Status>>(
    rx: watch::Receiver<V>,
    limit: Duration,
) -> Result<()> {
    match tokio::time::timeout(limit, wait_status(rx, |s| s.loaded)).await {
        Ok(s) if s.closed() => Err(s.closed_error()),
        Ok(_) => Ok(()),
        Err(_) => Err(Error::NotReady),
    }
}
