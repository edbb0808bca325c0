//! The cache-served side of a Watch stream, and the seam to the cache's watch API:
//! [`Watches`] is one cache `WatchStream` per gRPC Watch stream (split into its request
//! and response halves), so ids, `created` / `canceled` responses and stream-level
//! progress are the cache's, which gives them as etcd does. This module only maps the
//! requests in (etcd's create request straight into `WatchOptions`) and the cache's
//! refusals out (a [`Refusal`]); nothing else in the proxy calls the cache's watch API.
//!
//! The per-connection cap is a `WatchScope` shared by a connection's Watch streams (see
//! `conn.rs: ConnScope`).

use futures::FutureExt;

use etcd_cache::{
    Cache, WatchFilterType, WatchOptions, WatchRequestSender, WatchResponse, WatchResponseStream,
};

use super::refusal::Refusal;
use crate::pb::etcdserverpb::{watch_create_request::FilterType, WatchCreateRequest};

/// Why the cache did not take a create.
#[derive(Debug)]
pub(crate) enum NotTaken {
    /// The cache has no snapshot yet (just started): etcd can serve the watch instead.
    NotReady,
    /// Refused, as etcd would refuse it, or for the proxy's limits.
    Refused(Refusal),
}

/// The watches of one gRPC Watch stream.
pub(crate) struct Watches {
    cache: Cache,
    sender: WatchRequestSender,
    responses: WatchResponseStream,
    /// The per-connection cap (0: none).
    limit: usize,
    /// A create with id 0 (the cache's next free id) was made: the cache gives ids as
    /// etcd does, never one twice, so 0 is not given again.
    zero_used: bool,
}

impl Watches {
    /// An empty stream, counted against the connection's scope when there is a cap.
    pub(crate) fn new(cache: &Cache, conn: &crate::conn::ConnScope, limit: usize) -> Self {
        let stream = if limit == 0 {
            cache.watch_stream()
        } else {
            conn.get_or_init(cache, limit).watch_stream()
        };
        let (sender, responses) = stream.split();
        Watches {
            cache: cache.clone(),
            sender,
            responses,
            limit,
            zero_used: false,
        }
    }

    /// Whether etcd's answers to `RequestProgress` are trusted (etcd#15220: earlier
    /// versions answer before a new watch has caught up).
    pub(crate) fn progress_trusted(&self) -> bool {
        self.cache.progress_trusted()
    }

    /// Whether a create with id 0 gets id 0 (no create with id 0 was made on this
    /// stream yet): a watch the client knows as 0 can come to the cache under its id.
    pub(crate) fn gives_zero(&self) -> bool {
        !self.zero_used
    }

    /// The revisions the cache can replay (`Cache::history_span`).
    pub(crate) fn history_span(&self) -> (i64, i64) {
        self.cache.history_span()
    }

    /// The cache's newest revision (headers of the proxy's own responses).
    pub(crate) fn revision(&self) -> i64 {
        self.cache.revision()
    }

    /// Adds the watch `request` asks for, on `[key, range_end)` (the cache's keyspace:
    /// namespace applied, an empty key already `"\0"`, the range well formed) with id
    /// `watch_id` (0: the next free one). Its `created` response (with its id) comes from
    /// [`next`](Self::next), before any of its events.
    ///
    /// # Errors
    /// [`NotTaken::NotReady`] before the cache's first list; else the cancel reason
    /// etcd would give (empty range, duplicate id), the per-connection cap, or what the
    /// cache refused.
    pub(crate) async fn create(
        &mut self,
        request: &WatchCreateRequest,
        key: &[u8],
        range_end: &[u8],
        watch_id: i64,
    ) -> Result<(), NotTaken> {
        self.zero_used |= watch_id == 0;
        let mut opts = WatchOptions::new()
            .with_start_revision(request.start_revision)
            .with_watch_id(watch_id);
        if !range_end.is_empty() {
            opts = opts.with_range(range_end.to_vec());
        }
        if request.prev_kv {
            opts = opts.with_prev_key();
        }
        if request.progress_notify {
            opts = opts.with_progress_notify();
        }
        let mut filters = Vec::new();
        if request.filters.contains(&(FilterType::Noput as i32)) {
            filters.push(WatchFilterType::NoPut);
        }
        if request.filters.contains(&(FilterType::Nodelete as i32)) {
            filters.push(WatchFilterType::NoDelete);
        }
        if !filters.is_empty() {
            opts = opts.with_filters(filters);
        }
        self.sender
            .watch(key.to_vec(), Some(opts))
            .await
            .map_err(|e| match e {
                etcd_cache::Error::NotReady => NotTaken::NotReady,
                e => NotTaken::Refused(self.refusal(e)),
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

    /// The responses ready now, without waiting: up to `max` appended to `out` (a batch
    /// receive, `WatchResponseStream::messages`, so a round of replies costs one future,
    /// not one per response); how many. A failure of the cache is logged and ends the
    /// round as [`next`](Self::next) would (the stream then ends).
    pub(crate) fn take_ready(&mut self, out: &mut Vec<WatchResponse>, max: usize) -> usize {
        let before = out.len();
        if let Some(Err(e)) = self.responses.messages(out, max).now_or_never() {
            tracing::warn!(error = %e, "cache watch stream failed");
        }
        out.len() - before
    }

    /// Why the cache refused a watch.
    fn refusal(&self, e: etcd_cache::Error) -> Refusal {
        use etcd_cache::Error;
        match e {
            Error::InvalidRange { .. } => Refusal::EmptyRange,
            Error::WatchIdInUse { .. } => Refusal::DuplicateId,
            Error::WatchLimit { limit } if self.limit != 0 && limit == self.limit => {
                Refusal::ConnectionLimit(limit)
            }
            Error::WatchLimit { limit } => Refusal::ProxyLimit(limit),
            e @ Error::OutOfRange { .. } => Refusal::OutsidePrefix(e),
            other => Refusal::Cache(other),
        }
    }
}

/// The cache side's next response (never, without a cache side: the stream opened when
/// there was no cache to serve from).
pub(crate) async fn next(watches: &mut Option<Watches>) -> Option<WatchResponse> {
    match watches {
        Some(w) => w.next().await,
        None => futures::future::pending().await,
    }
}
