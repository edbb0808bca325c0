//! [`WatchOptions`], [`WatchStream`] and [`WatchResponse`].
//!
//! ## Ordering
//! Every stream sees revisions in strictly increasing order, each revision's matching
//! events in one response, no gap and no duplicate, across upstream reconnects and
//! while lagging.
//!
//! ## Lagging
//! A stream that does not keep up fills its buffer (`subscriber_buffer` responses) and
//! becomes lagging. Nothing waits for it: when it is polled again it catches up from the
//! cache's history, in order, and then rejoins the live stream. If its position has left
//! the history window by then, it yields `Err(Error::Compacted { .. })` and ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_core::Stream;
use tokio::time::{Instant, Sleep};

use crate::error::{Error, Result};
use crate::key_range::{KeyRange, RangeSpec};
use crate::kv::Event;
use crate::shared::Shared;
use crate::subscribers::filter::Filter;
use crate::subscribers::mailbox::{End, Mailbox, Polled};
use crate::subscribers::{Registered, Scope, Slot, SubId};

/// Server-side style event filters, applied per subscriber (etcd-client's type).
pub use etcd_client::WatchFilterType;

/// Options for [`Cache::watch`](crate::Cache::watch), as `etcd_client::WatchOptions`.
#[derive(Debug, Clone, Default)]
pub struct WatchOptions {
    pub(crate) spec: RangeSpec,
    pub(crate) start_revision: i64,
    pub(crate) prev_kv: bool,
    pub(crate) progress_notify: bool,
    pub(crate) filters: Vec<WatchFilterType>,
}

impl WatchOptions {
    /// Watch one key, from the next revision.
    pub fn new() -> Self {
        Self::default()
    }

    /// Watch every key with the key as prefix (the empty key: every key).
    pub fn with_prefix(mut self) -> Self {
        self.spec = RangeSpec::Prefix;
        self
    }

    /// Watch `[key, end)`. `end = "\0"` means every key >= key.
    pub fn with_range(mut self, end: impl Into<Vec<u8>>) -> Self {
        self.spec = RangeSpec::Range(end.into());
        self
    }

    /// Watch every key >= key.
    pub fn with_from_key(mut self) -> Self {
        self.spec = RangeSpec::FromKey;
        self
    }

    /// Watch every key (the cache's prefix must be empty).
    pub fn with_all_keys(mut self) -> Self {
        self.spec = RangeSpec::AllKeys;
        self
    }

    /// Start at `revision` (0: from the next revision). A revision inside the cache's
    /// window replays from the history, then continues live; below it, the stream yields
    /// `Compacted`; a future revision waits for it.
    pub fn with_start_revision(mut self, revision: i64) -> Self {
        self.start_revision = revision;
        self
    }

    /// Attach each event's previous key-value (synthesized by the cache).
    pub fn with_prev_key(mut self) -> Self {
        self.prev_kv = true;
        self
    }

    /// Receive periodic progress responses (no events; every matching event up to the
    /// revision was delivered). Interval: `CacheBuilder::progress_notify_interval`.
    pub fn with_progress_notify(mut self) -> Self {
        self.progress_notify = true;
        self
    }

    /// Drop events of these types.
    pub fn with_filters(mut self, filters: impl Into<Vec<WatchFilterType>>) -> Self {
        self.filters = filters.into();
        self
    }

    pub(crate) fn no_put(&self) -> bool {
        self.filters.contains(&WatchFilterType::NoPut)
    }

    pub(crate) fn no_delete(&self) -> bool {
        self.filters.contains(&WatchFilterType::NoDelete)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Created,
    Events,
    Progress,
}

/// One response of a [`WatchStream`], as `etcd_client::WatchResponse`.
#[derive(Debug, Clone)]
pub struct WatchResponse {
    revision: i64,
    watch_id: i64,
    kind: Kind,
    events: Option<Arc<[Event]>>,
}

impl WatchResponse {
    /// The header revision: for events, their revision; for progress, the revision up to
    /// which every matching event was delivered; for `created`, the cache's revision.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The events, all of one revision. Shared with other subscribers, never copied.
    pub fn events(&self) -> &[Event] {
        self.events.as_deref().unwrap_or(&[])
    }

    /// True for a progress response: no events, and every matching event with a
    /// revision <= [`revision`](Self::revision) was delivered.
    pub fn is_progress_notify(&self) -> bool {
        self.kind == Kind::Progress
    }

    /// True for the first response of a stream.
    pub fn created(&self) -> bool {
        self.kind == Kind::Created
    }

    /// Always false: a stream that ends reports why as an error or ends with `None`.
    pub fn canceled(&self) -> bool {
        false
    }

    /// Always 0 (compaction is reported as [`Error::Compacted`]).
    pub fn compact_revision(&self) -> i64 {
        0
    }

    /// The stream's id, unique within the cache.
    pub fn watch_id(&self) -> i64 {
        self.watch_id
    }
}

/// A watch on the cache: a `Stream` of responses. Dropping it cancels the watch and
/// frees its slot and index entries at once.
pub struct WatchStream {
    shared: Arc<Shared>,
    id: SubId,
    filter: Filter,
    mailbox: Option<Arc<Mailbox>>,
    slot: Slot,
    created: Option<i64>,
    compacted: Option<i64>,
    finished: bool,
    progress_timer: Option<Pin<Box<Sleep>>>,
    progress_due: bool,
    /// The highest revision reported on this stream: no response goes below it.
    reported: i64,
}

impl std::fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStream")
            .field("watch_id", &self.id)
            .field("finished", &self.finished)
            .finish()
    }
}

impl WatchStream {
    fn new(
        shared: Arc<Shared>,
        id: SubId,
        filter: Filter,
        mailbox: Arc<Mailbox>,
        slot: Slot,
        revision: i64,
        progress_notify: bool,
    ) -> Self {
        let progress_timer = progress_notify
            .then(|| Box::pin(tokio::time::sleep(shared.config.progress_notify_interval)));
        WatchStream {
            shared,
            id,
            filter,
            mailbox: Some(mailbox),
            slot,
            created: Some(revision),
            compacted: None,
            finished: false,
            progress_timer,
            progress_due: false,
            reported: revision,
        }
    }

    fn compacted(shared: Arc<Shared>, filter: Filter, slot: Slot, floor: i64) -> Self {
        WatchStream {
            shared,
            id: 0,
            filter,
            mailbox: None,
            slot,
            created: None,
            compacted: Some(floor),
            finished: false,
            progress_timer: None,
            progress_due: false,
            reported: 0,
        }
    }

    /// The next response; `Ok(None)` when the stream has ended. As
    /// `etcd_client::WatchStream::message`.
    ///
    /// # Errors
    /// [`Error::Compacted`] once, when the stream's position left the cache's window.
    ///
    /// # Cancel safety
    /// Cancel safe: a response is removed from the stream only when it is returned.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx))
            .await
            .transpose()
    }

    /// Asks for a progress response, as `etcd_client::WatchStream::request_progress`.
    /// It is answered locally, once every matching event up to the cache's revision has
    /// been delivered to this stream.
    ///
    /// # Errors
    /// None today; the `Result` mirrors `etcd-client`.
    pub async fn request_progress(&mut self) -> Result<()> {
        self.progress_due = true;
        Ok(())
    }

    /// Cancels the watch: the stream yields what is queued and then ends.
    ///
    /// # Errors
    /// None today; the `Result` mirrors `etcd-client`.
    pub async fn cancel(&mut self) -> Result<()> {
        self.shared.subscribers.unsubscribe(self.id, End::Cancelled);
        Ok(())
    }

    /// This stream's id.
    pub fn watch_id(&self) -> i64 {
        self.id as i64
    }

    fn response(&self, kind: Kind, revision: i64, events: Option<Arc<[Event]>>) -> WatchResponse {
        WatchResponse {
            revision,
            watch_id: self.id as i64,
            kind,
            events,
        }
    }

    fn finish(&mut self) {
        self.finished = true;
        self.shared.subscribers.unsubscribe(self.id, End::Cancelled);
        self.progress_timer = None;
    }
}

impl Stream for WatchStream {
    type Item = Result<WatchResponse>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.finished {
            return Poll::Ready(None);
        }
        if let Some(compact_revision) = this.compacted.take() {
            this.finish();
            return Poll::Ready(Some(Err(Error::Compacted { compact_revision })));
        }
        if let Some(rev) = this.created.take() {
            return Poll::Ready(Some(Ok(this.response(Kind::Created, rev, None))));
        }
        // Borrowed, not cloned: a clone per poll would touch the reference count that
        // shares a cache line with the mailbox lock the producer takes.
        let Some(mailbox) = this.mailbox.as_ref() else {
            return Poll::Ready(None);
        };
        let shared = &this.shared;
        loop {
            let polled = mailbox.poll(
                cx.waker(),
                &shared.history,
                &this.filter,
                shared.subscribers.lag(),
                || shared.revision(),
            );
            match polled {
                Polled::Delivery(d) => {
                    this.reported = d.revision;
                    return Poll::Ready(Some(Ok(this.response(
                        Kind::Events,
                        d.revision,
                        Some(d.events),
                    ))));
                }
                Polled::Ended(End::Closed | End::Cancelled) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Polled::Ended(End::Failed(source)) => {
                    this.finish();
                    return Poll::Ready(Some(Err(Error::Failed { source })));
                }
                Polled::Ended(End::Compacted(compact_revision)) => {
                    tracing::debug!(
                        watch_id = this.id,
                        compact_revision,
                        "the watch fell behind the history window; ending it as compacted"
                    );
                    this.finish();
                    return Poll::Ready(Some(Err(Error::Compacted { compact_revision })));
                }
                Polled::Idle { revision } => {
                    if this.progress_due {
                        // Queue empty and not lagging: every matching event up to the
                        // cache's revision has been delivered.
                        this.progress_due = false;
                        let revision = revision.max(this.reported);
                        this.reported = revision;
                        return Poll::Ready(Some(Ok(this.response(
                            Kind::Progress,
                            revision,
                            None,
                        ))));
                    }
                }
            }
            if let Some(timer) = this.progress_timer.as_mut() {
                if timer.as_mut().poll(cx).is_ready() {
                    let next = Instant::now() + shared.config.progress_notify_interval;
                    timer.as_mut().reset(next);
                    this.progress_due = true;
                    continue;
                }
            }
            return Poll::Pending;
        }
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        // Ending the mailbox as cancelled also clears (and uncounts) a lagging state.
        if self.mailbox.take().is_some() {
            self.shared.subscribers.unsubscribe(self.id, End::Cancelled);
        }
        self.slot.forget(self.id);
    }
}

/// Opens a watch: validates the request, takes a slot, waits for the first snapshot,
/// learns "now" for a watch without a start revision, and registers it.
pub(crate) async fn open(
    shared: &Arc<Shared>,
    key: &[u8],
    options: WatchOptions,
    scope: Option<&Arc<Scope>>,
) -> Result<WatchStream> {
    let range = KeyRange::new(key, &options.spec)?;
    range.check_within(&shared.range)?;
    if options.start_revision < 0 {
        return Err(Error::invalid(format!(
            "negative start revision {}",
            options.start_revision
        )));
    }
    if shared.is_closed() {
        return Err(Error::Closed);
    }
    let slot = shared.subscribers.acquire(scope)?;
    shared
        .wait_loaded(shared.config.consistent_read_timeout)
        .await?;
    // "From now", as etcd means it: after every write that completed before this
    // call, even those the cache has not applied yet.
    let now = if options.start_revision == 0 {
        cluster_revision_for_watch(shared).await
    } else {
        0
    };
    let filter = Filter {
        range,
        prev_kv: options.prev_kv,
        no_put: options.no_put(),
        no_delete: options.no_delete(),
    };
    match shared.subscribers.register(
        filter.clone(),
        options.start_revision,
        now,
        &shared.history,
        || shared.revision(),
        &slot,
    )? {
        Registered::Compacted { floor } => {
            Ok(WatchStream::compacted(shared.clone(), filter, slot, floor))
        }
        Registered::Live {
            id,
            mailbox,
            position,
        } => {
            // The created response reports the revision the watch is current at: for
            // a watch from now, the one it starts after, read under the index lock
            // (the cache may have applied more since `now` was learned).
            let current = if options.start_revision == 0 {
                position
            } else {
                shared.revision()
            };
            tracing::trace!(
                watch_id = id,
                start_revision = options.start_revision,
                revision = current,
                "watch opened"
            );
            Ok(WatchStream::new(
                shared.clone(),
                id,
                filter,
                mailbox,
                slot,
                current,
                options.progress_notify,
            ))
        }
    }
}

/// The cluster's current revision for a watch "from now" (one linearizable round
/// trip), or 0 when it is not wanted or cannot be had in time: then the watch starts
/// after the cache's own revision.
async fn cluster_revision_for_watch(shared: &Shared) -> i64 {
    if !shared.config.linearizable_watch_start || !shared.is_ready() {
        return 0;
    }
    let limit = shared.config.consistent_read_timeout;
    match shared
        .probe
        .current(&shared.upstream, &shared.range, limit)
        .await
    {
        Ok(rev) => {
            shared.counters.saw_cluster_revision(rev);
            rev
        }
        Err(e) => {
            tracing::warn!(error = %e, revision = shared.revision(), "could not learn the cluster's revision for a watch from now; it starts after the cache's revision");
            0
        }
    }
}

/// A watch budget for one tenant or connection, made by
/// [`Cache::scope`](crate::Cache::scope).
///
/// At most its limit of watches are open through it at once (one more fails with
/// [`Error::WatchLimit`]), and they also count against the cache's own limit. Dropping
/// the scope cancels every watch opened through it: their streams end with `None`
/// after what was already delivered. A service that re-issues watches in a reconnect
/// loop drops the old scope and makes a new one, and leaks nothing.
pub struct WatchScope {
    shared: Arc<Shared>,
    scope: Arc<Scope>,
    /// Keeps the cache running while the scope exists (the cache's handle).
    _cache: Arc<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for WatchScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchScope")
            .field("limit", &self.scope.limit())
            .field("open", &self.open())
            .finish()
    }
}

impl WatchScope {
    pub(crate) fn new(
        shared: Arc<Shared>,
        cache: Arc<dyn std::any::Any + Send + Sync>,
        max_watchers: usize,
    ) -> Self {
        WatchScope {
            shared,
            scope: Scope::new(max_watchers),
            _cache: cache,
        }
    }

    /// Like [`Cache::watch`](crate::Cache::watch), counted against this scope.
    ///
    /// # Errors
    /// As [`Cache::watch`](crate::Cache::watch); [`Error::WatchLimit`] names this
    /// scope's limit.
    pub async fn watch(
        &self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> Result<WatchStream> {
        let key = key.into();
        open(
            &self.shared,
            &key,
            options.unwrap_or_default(),
            Some(&self.scope),
        )
        .await
    }

    /// Watches open through this scope.
    pub fn open(&self) -> usize {
        self.scope.open()
    }

    /// This scope's limit.
    pub fn limit(&self) -> usize {
        self.scope.limit()
    }
}

impl Drop for WatchScope {
    fn drop(&mut self) {
        self.scope.cancel_all(&self.shared.subscribers);
    }
}
