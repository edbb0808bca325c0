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
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_core::Stream;
use tokio::time::{Instant, Sleep};

use crate::cache::{Shared, Slot};
use crate::dispatch::{catch_up, End, Mailbox, Shape, SubId};
use crate::error::{Error, Result};
use crate::key_range::RangeSpec;
use crate::kv::Event;

/// Server-side style event filters, applied per subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WatchFilterType {
    /// Drop put events.
    NoPut,
    /// Drop delete events.
    NoDelete,
}

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
    shape: Shape,
    mailbox: Option<Arc<Mailbox>>,
    slot: Slot,
    created: Option<i64>,
    compacted: Option<i64>,
    finished: bool,
    progress_timer: Option<Pin<Box<Sleep>>>,
    progress_due: bool,
    /// Revision of the last events returned (progress never goes below it).
    delivered: i64,
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
    pub(crate) fn new(
        shared: Arc<Shared>,
        id: SubId,
        shape: Shape,
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
            shape,
            mailbox: Some(mailbox),
            slot,
            created: Some(revision),
            compacted: None,
            finished: false,
            progress_timer,
            progress_due: false,
            delivered: 0,
        }
    }

    pub(crate) fn compacted(
        shared: Arc<Shared>,
        id: SubId,
        shape: Shape,
        slot: Slot,
        floor: i64,
    ) -> Self {
        WatchStream {
            shared,
            id,
            shape,
            mailbox: None,
            slot,
            created: None,
            compacted: Some(floor),
            finished: false,
            progress_timer: None,
            progress_due: false,
            delivered: 0,
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
        self.shared.unsubscribe(self.id, End::Cancelled);
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
        self.shared.unsubscribe(self.id, End::Cancelled);
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
        loop {
            let mut st = mailbox.state.lock();
            if let Some(d) = st.queue.pop_front() {
                drop(st);
                this.delivered = d.revision;
                return Poll::Ready(Some(Ok(this.response(
                    Kind::Events,
                    d.revision,
                    Some(d.events),
                ))));
            }
            if st.lagging {
                drop(st);
                let history = this.shared.history.read();
                if catch_up(&history, mailbox, &this.shape) {
                    this.shared.lagging.fetch_sub(1, Ordering::Relaxed);
                }
                continue;
            }
            match st.end {
                Some(End::Closed | End::Cancelled) => {
                    drop(st);
                    this.finish();
                    return Poll::Ready(None);
                }
                Some(End::Compacted(compact_revision)) => {
                    let position = st.last_rev;
                    drop(st);
                    tracing::debug!(
                        watch_id = this.id,
                        position,
                        compact_revision,
                        "watch left the history window; ending with Compacted"
                    );
                    this.finish();
                    return Poll::Ready(Some(Err(Error::Compacted { compact_revision })));
                }
                None => {}
            }
            if this.progress_due {
                // Queue empty and not lagging: every matching event up to the cache's
                // revision (stored after its pushes) has been delivered.
                let revision = this.shared.revision().max(this.delivered);
                drop(st);
                this.progress_due = false;
                return Poll::Ready(Some(Ok(this.response(Kind::Progress, revision, None))));
            }
            match &st.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => st.waker = Some(cx.waker().clone()),
            }
            drop(st);
            if let Some(timer) = this.progress_timer.as_mut() {
                if timer.as_mut().poll(cx).is_ready() {
                    let next = Instant::now() + this.shared.config.progress_notify_interval;
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
            self.shared.unsubscribe(self.id, End::Cancelled);
        }
        self.slot.forget(self.id);
    }
}
