//! The seam between the Watch service and the cache: [`Watches`] is one cache
//! `WatchStream` per gRPC Watch stream (split into its request and response halves), so
//! ids, `created` / `canceled` responses and stream-level progress are the cache's, which
//! gives them as etcd does. This module only maps the requests in and the refusals out;
//! nothing else in the proxy calls the cache's watch API.
//!
//! The per-connection cap is a `WatchScope` shared by a connection's Watch streams (see
//! [`ConnScope`]).

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use etcd_cache::{
    Cache, WatchFilterType, WatchOptions, WatchRequestSender, WatchResponse, WatchResponseStream,
    WatchScope,
};

/// etcd's `mvcc.ErrEmptyWatcherRange`.
pub(crate) const EMPTY_RANGE: &str = "mvcc: watcher range is empty";
/// etcd's `mvcc.ErrWatcherDuplicateID`.
pub(crate) const DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";

/// The watch budget of one client connection (`--max-watches-per-connection`), made on
/// the connection's first Watch stream and shared by all of them.
#[derive(Debug, Default, Clone)]
pub(crate) struct ConnScope(Arc<OnceLock<WatchScope>>);

/// A WatchCreateRequest in the cache's keyspace (namespace already applied; an empty key
/// already replaced by `"\0"`, as etcd does).
#[derive(Debug, Clone, Default)]
pub(crate) struct Create {
    pub(crate) key: Bytes,
    /// Empty: one key; `"\0"`: every key from `key`.
    pub(crate) range_end: Bytes,
    pub(crate) start_revision: i64,
    pub(crate) progress_notify: bool,
    pub(crate) prev_kv: bool,
    pub(crate) no_put: bool,
    pub(crate) no_delete: bool,
    /// 0: the next free id.
    pub(crate) watch_id: i64,
}

/// Why a create was refused: the cancel reason etcd's clients read.
#[derive(Debug)]
pub(crate) struct Refused {
    pub(crate) reason: String,
    /// The cache has no snapshot yet (just started): etcd can serve the watch instead.
    pub(crate) not_ready: bool,
}

/// The watches of one gRPC Watch stream.
pub(crate) struct Watches {
    cache: Cache,
    sender: WatchRequestSender,
    responses: WatchResponseStream,
    /// The per-connection cap (0: none).
    limit: usize,
}

impl Watches {
    /// An empty stream, counted against the connection's scope when there is a cap.
    pub(crate) fn new(cache: &Cache, conn: &ConnScope, limit: usize) -> Self {
        let stream = if limit == 0 {
            cache.watch_stream()
        } else {
            conn.0.get_or_init(|| cache.scope(limit)).watch_stream()
        };
        let (sender, responses) = stream.split();
        Watches {
            cache: cache.clone(),
            sender,
            responses,
            limit,
        }
    }

    /// The revisions the cache can replay (`Cache::history_span`).
    pub(crate) fn history_span(&self) -> (i64, i64) {
        self.cache.history_span()
    }

    /// The cache's newest revision (headers of the proxy's own responses).
    pub(crate) fn revision(&self) -> i64 {
        self.cache.revision()
    }

    /// Adds a watch; its `created` response (with its id) comes from
    /// [`next`](Self::next), before any of its events.
    ///
    /// # Errors
    /// The cancel reason etcd would give (empty range, duplicate id), the
    /// per-connection cap, or what the cache refused.
    pub(crate) async fn create(&mut self, c: Create) -> Result<(), Refused> {
        let end = c.range_end.as_ref();
        if !end.is_empty() && end != b"\0" && c.key.as_ref() >= end {
            return Err(Refused {
                reason: EMPTY_RANGE.into(),
                not_ready: false,
            });
        }
        let mut opts = WatchOptions::new()
            .with_start_revision(c.start_revision)
            .with_watch_id(c.watch_id);
        if !end.is_empty() {
            opts = opts.with_range(end.to_vec());
        }
        if c.prev_kv {
            opts = opts.with_prev_key();
        }
        if c.progress_notify {
            opts = opts.with_progress_notify();
        }
        let mut filters = Vec::new();
        if c.no_put {
            filters.push(WatchFilterType::NoPut);
        }
        if c.no_delete {
            filters.push(WatchFilterType::NoDelete);
        }
        if !filters.is_empty() {
            opts = opts.with_filters(filters);
        }
        self.sender
            .watch(c.key.to_vec(), Some(opts))
            .await
            .map_err(|e| Refused {
                reason: self.refusal(&e),
                not_ready: matches!(e, etcd_cache::Error::NotReady),
            })
    }

    /// Cancels a watch; a `canceled` response follows. An unknown id is ignored, as etcd
    /// ignores it.
    pub(crate) async fn cancel(&mut self, watch_id: i64) {
        let _ = self.sender.cancel(watch_id).await;
    }

    /// Asks for one stream-level progress response (watch id -1).
    pub(crate) async fn request_progress(&mut self) {
        let _ = self.sender.request_progress().await;
    }

    /// The next response of any watch; `None` when the cache has closed.
    ///
    /// # Cancel safety
    /// Cancel safe: a response is taken only when it is returned.
    pub(crate) async fn next(&mut self) -> Option<WatchResponse> {
        match self.responses.message().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cache watch stream failed");
                None
            }
        }
    }

    /// The cancel reason for a watch the cache refused.
    fn refusal(&self, e: &etcd_cache::Error) -> String {
        use etcd_cache::Error;
        match e {
            Error::InvalidRange { .. } => EMPTY_RANGE.into(),
            Error::WatchIdInUse { .. } => DUPLICATE_ID.into(),
            Error::WatchLimit { limit } if self.limit != 0 && *limit == self.limit => {
                format!("ETCD_WATCH_LIMIT: at most {limit} watches are allowed per connection")
            }
            Error::WatchLimit { limit } => {
                format!("ETCD_WATCH_LIMIT: at most {limit} watches are allowed on this proxy")
            }
            Error::OutOfRange { .. } => format!(
                "etcd-cache-proxy: the key range is outside the cached prefix ({e}); \
                 watches are served from the cache only"
            ),
            other => format!("etcd-cache-proxy: {other}"),
        }
    }
}
