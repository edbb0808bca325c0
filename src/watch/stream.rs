//! [`WatchStream`]: one stream carrying any number of watches, as etcd-client's. Its
//! request half ([`WatchRequestSender`]) adds and cancels watches and asks for progress;
//! its response half ([`WatchResponseStream`]) yields every watch's responses. They
//! share a small control block: the watches added but not yet polled, the ids in use,
//! and the progress requests.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::num::NonZeroI64;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_core::Stream;
use futures_util::stream::StreamExt;
use futures_util::task::AtomicWaker;
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep};

use super::options::{Request, WatchOptions};
use super::ready_set::ReadySet;
use super::register::{add, register, Added};
use super::response::WatchResponse;
use super::subscription::{Item, Subscription, Tagged};
use crate::error::{Error, Result};
use crate::progress::ProgressWait;
use crate::shared::Shared;
use crate::subscribers::{Scope, SubId};
use crate::view::Changed;

/// The watch id of a response to a stream-wide progress request, as etcd's.
const STREAM_WATCH_ID: i64 = -1;

/// What the two halves of a stream share.
struct Control {
    shared: Arc<Shared>,
    scope: Option<Arc<Scope>>,
    inner: Mutex<ControlInner>,
    /// Set by the sender when `inner` has news for the response half, so that the
    /// response half takes the lock only then (not on every poll).
    dirty: AtomicBool,
    /// The request half was dropped (only after a split). Set before the news of it.
    sender_gone: AtomicBool,
    /// The response half's waker.
    waker: AtomicWaker,
}

#[derive(Default)]
struct ControlInner {
    /// Added and canceled by the sender, in order, not yet taken by the response half.
    incoming: Vec<Incoming>,
    /// Watch ids in use on the stream, with their registry ids.
    ids: Ids,
    /// The next id to try for a watch that did not choose one.
    next_id: i64,
}

/// What the sender hands the response half, in the order of the requests.
enum Incoming {
    /// A watch, registered, and the revision its `created` response reports.
    Watch(Subscription, i64),
    /// A watch from now whose start is being learned: a task asks for the cluster's
    /// revision and registers it the moment the answer comes (a slow reader of the
    /// stream does not hold it back). What follows it on the stream waits for it, so
    /// that replies keep the order of the requests.
    Opening {
        watch_id: i64,
        sub_id: SubId,
        task: JoinHandle<Result<(Subscription, i64)>>,
    },
    /// A cancel of the watch `watch_id` (registry id `sub_id`): its id is free already.
    Cancel { watch_id: i64, sub_id: SubId },
    /// The `canceled` reply of a watch that a cancel ended already (it was on the
    /// stream), waiting for its turn behind a watch that is opening.
    Canceled { watch_id: i64 },
    /// A stream-wide progress request. It does not wait behind a watch still opening
    /// (its answer does, in the response half's poll).
    Progress(UnansweredRequest),
}

impl Incoming {
    fn watch_id(&self) -> Option<i64> {
        match self {
            Incoming::Watch(sub, _) => Some(sub.watch_id),
            Incoming::Opening { watch_id, .. } => Some(*watch_id),
            Incoming::Cancel { .. } | Incoming::Canceled { .. } | Incoming::Progress(_) => None,
        }
    }
}

/// A reply to a request on the stream, sent in the order of the requests (etcd sends
/// its `created` and `canceled` replies on one control channel, in order; a client maps
/// them to its requests by that order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    Created { watch_id: i64, revision: i64 },
    Canceled { watch_id: i64 },
}

/// A [`Reply`] as a stream holds it until it is sent: 16 bytes, and an `Option` of it
/// too (a `Reply` takes 24). `code` is the created revision plus one (a revision is
/// never negative), or -1 for a cancel.
#[derive(Debug, Clone, Copy)]
struct Queued {
    watch_id: i64,
    code: NonZeroI64,
}

impl Queued {
    const CANCELED: NonZeroI64 = NonZeroI64::new(-1).expect("not zero");
}

impl From<Reply> for Queued {
    fn from(reply: Reply) -> Self {
        match reply {
            Reply::Created { watch_id, revision } => Queued {
                watch_id,
                code: NonZeroI64::new(revision.max(0).saturating_add(1)).expect("positive"),
            },
            Reply::Canceled { watch_id } => Queued {
                watch_id,
                code: Queued::CANCELED,
            },
        }
    }
}

impl From<Queued> for Reply {
    fn from(queued: Queued) -> Self {
        let watch_id = queued.watch_id;
        match queued.code.get() {
            -1 => Reply::Canceled { watch_id },
            code => Reply::Created {
                watch_id,
                revision: code - 1,
            },
        }
    }
}

/// Watch ids in use on a stream, with their registry ids (0 while registering): the
/// one watch most streams carry inline, a short list for a few, a boxed map beyond
/// [`Ids::FEW`] (so that a one-watch stream's control block holds no allocation for it).
#[derive(Default)]
enum Ids {
    #[default]
    None,
    One(i64, SubId),
    Few(Vec<(i64, SubId)>),
    // Boxed on purpose: it keeps `Ids` (and every control block) at 24 bytes.
    #[allow(clippy::box_collection)]
    Many(Box<HashMap<i64, SubId>>),
}

impl Ids {
    const FEW: usize = 16;

    fn get(&self, watch_id: i64) -> Option<SubId> {
        match self {
            Ids::None => None,
            Ids::One(id, sub) => (*id == watch_id).then_some(*sub),
            Ids::Few(few) => few.iter().find(|e| e.0 == watch_id).map(|e| e.1),
            Ids::Many(many) => many.get(&watch_id).copied(),
        }
    }

    fn contains(&self, watch_id: i64) -> bool {
        self.get(watch_id).is_some()
    }

    /// Sets the registry id of `watch_id`, adding it if it is new.
    fn insert(&mut self, watch_id: i64, sub_id: SubId) {
        match self {
            Ids::None => *self = Ids::One(watch_id, sub_id),
            Ids::One(id, sub) if *id == watch_id => *sub = sub_id,
            Ids::One(id, sub) => *self = Ids::Few(vec![(*id, *sub), (watch_id, sub_id)]),
            Ids::Few(few) => {
                if let Some(e) = few.iter_mut().find(|e| e.0 == watch_id) {
                    e.1 = sub_id;
                } else if few.len() < Self::FEW {
                    few.push((watch_id, sub_id));
                } else {
                    let mut many: HashMap<_, _> = few.drain(..).collect();
                    many.insert(watch_id, sub_id);
                    *self = Ids::Many(Box::new(many));
                }
            }
            Ids::Many(many) => {
                many.insert(watch_id, sub_id);
            }
        }
    }

    fn remove(&mut self, watch_id: i64) {
        match self {
            Ids::None => {}
            Ids::One(id, _) => {
                if *id == watch_id {
                    *self = Ids::None;
                }
            }
            Ids::Few(few) => few.retain(|e| e.0 != watch_id),
            Ids::Many(many) => {
                many.remove(&watch_id);
            }
        }
    }
}

impl Control {
    /// Frees the id of a watch that has ended, unless a cancel freed it already and a
    /// new watch took it.
    fn forget(&self, watch_id: i64, sub_id: SubId) {
        let mut inner = self.inner.lock();
        if inner.ids.get(watch_id) == Some(sub_id) {
            inner.ids.remove(watch_id);
        }
    }

    /// Tells the response half that there is news.
    fn notify(&self) {
        self.dirty.store(true, Ordering::Release);
        self.waker.wake();
    }
}

/// A stream-wide progress request: answered at a revision at least `at_least` (the
/// cluster's revision when it was asked, as etcd answers with its current one), or,
/// once `deadline` has passed, at what the cache can prove.
#[derive(Debug, Clone, Copy)]
struct UnansweredRequest {
    at_least: i64,
    deadline: Instant,
}

/// The request half of a [`WatchStream`] (from [`WatchStream::split`]), as
/// `etcd_client::WatchRequestSender`.
pub struct WatchRequestSender {
    control: Arc<Control>,
}

impl std::fmt::Debug for WatchRequestSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchRequestSender").finish_non_exhaustive()
    }
}

impl WatchRequestSender {
    /// Adds a watch to the stream; its `created` response carries its watch id. It
    /// returns without waiting for etcd, as etcd-client's sends the create and returns:
    /// a watch from now starts after the cluster's revision learned by a round trip
    /// sent after this call and shared by every watch waiting (watches added one after
    /// another share it), and its `created` reports where it starts. Replies keep the
    /// order of the requests. Use [`Cache::watch`](crate::Cache::watch) for a watch that
    /// is open when the call returns.
    ///
    /// # Errors
    /// [`Error::InvalidRange`], [`Error::OutOfRange`], [`Error::WatchLimit`],
    /// [`Error::WatchIdInUse`], [`Error::NotReady`] before the cache's first snapshot,
    /// [`Error::Closed`] / [`Error::Failed`]. Nothing is added then.
    pub async fn watch(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> Result<()> {
        let added = self.add(key.into(), options).await?;
        self.control.inner.lock().incoming.push(added);
        self.control.notify();
        Ok(())
    }

    /// Adds a watch under a new id on this stream without waiting for etcd: a watch
    /// from now is handed over while its start is learned (its `created` response
    /// follows once it is), as etcd answers a create on its stream; the caller hands it
    /// to the response half.
    async fn add(&self, key: Vec<u8>, options: Option<WatchOptions>) -> Result<Incoming> {
        let (request, watch_id, span) = self.reserve(&key, options)?;
        let control = &self.control;
        let added = add(&control.shared, request, control.scope.as_ref());
        match tracing::Instrument::instrument(added, span.clone()).await {
            Ok(Added::Registered(registration)) => {
                let (sub, created) = self.registered(registration, watch_id, &span);
                Ok(Incoming::Watch(sub, created))
            }
            Ok(Added::Opening(opening)) => {
                let sub_id = opening.sub_id();
                control.inner.lock().ids.insert(watch_id, sub_id);
                let shared = control.shared.clone();
                let opened = async move {
                    let registration = opening.open(&shared).await?;
                    Ok(Subscription::new(shared, registration, watch_id))
                };
                // Dropped unread (the stream is gone), its subscription ends itself.
                let task = tokio::spawn(tracing::Instrument::instrument(opened, span));
                Ok(Incoming::Opening {
                    watch_id,
                    sub_id,
                    task,
                })
            }
            Err(e) => {
                control.inner.lock().ids.remove(watch_id);
                Err(e)
            }
        }
    }

    /// Registers a watch with the cache under a new id on this stream, waiting for
    /// its start (one round trip for a watch from now); the caller hands it to the
    /// response half.
    async fn register(
        &self,
        key: Vec<u8>,
        options: Option<WatchOptions>,
    ) -> Result<(Subscription, i64)> {
        let (request, watch_id, span) = self.reserve(&key, options)?;
        let control = &self.control;
        let registered = register(&control.shared, request, control.scope.as_ref());
        match tracing::Instrument::instrument(registered, span.clone()).await {
            Ok(registration) => Ok(self.registered(registration, watch_id, &span)),
            Err(e) => {
                control.inner.lock().ids.remove(watch_id);
                Err(e)
            }
        }
    }

    /// The registered watch, with its id on the stream, and the revision its `created`
    /// response reports.
    fn registered(
        &self,
        registration: super::register::Registration,
        watch_id: i64,
        span: &tracing::Span,
    ) -> (Subscription, i64) {
        let control = &self.control;
        let (sub, created) = Subscription::new(control.shared.clone(), registration, watch_id);
        span.record("revision", created);
        span.in_scope(|| tracing::trace!(watch_id, "watch opened"));
        control.inner.lock().ids.insert(watch_id, sub.sub_id);
        (sub, created)
    }

    /// Checks a watch request and reserves its id on the stream.
    ///
    /// # Errors
    /// [`Error::InvalidRange`], [`Error::OutOfRange`], [`Error::WatchIdInUse`].
    fn reserve(
        &self,
        key: &[u8],
        options: Option<WatchOptions>,
    ) -> Result<(Request, i64, tracing::Span)> {
        let options = options.unwrap_or_default();
        let control = &self.control;
        let request = Request::new(&control.shared, key, &options)?;
        // Reserve the id first, so that a refused id costs no registration.
        let watch_id = {
            let mut inner = control.inner.lock();
            let id = match options.watch_id() {
                // As etcd: the lowest id above every id given so far; never one reused.
                0 => {
                    while inner.ids.contains(inner.next_id) {
                        inner.next_id += 1;
                    }
                    let id = inner.next_id;
                    inner.next_id += 1;
                    id
                }
                chosen if inner.ids.contains(chosen) => {
                    return Err(Error::WatchIdInUse { watch_id: chosen })
                }
                chosen => chosen,
            };
            inner.ids.insert(id, 0);
            id
        };
        let span = tracing::debug_span!(
            "etcd_cache.watch",
            key = %String::from_utf8_lossy(key),
            watch_id,
            start_revision = request.start_revision,
            revision = tracing::field::Empty,
        );
        Ok((request, watch_id, span))
    }

    /// Cancels the watch `watch_id`, as etcd cancels one: its id is free at once (a
    /// watch added next may take it), it gets no more events, and its `canceled`
    /// response follows the replies to the requests made before this one (the `created`
    /// responses of earlier watches, the `canceled` of earlier cancels), in order. An id
    /// not in use is ignored, as etcd ignores it.
    ///
    /// # Errors
    /// None today; the `Result` mirrors etcd-client.
    pub async fn cancel(&mut self, watch_id: i64) -> Result<()> {
        let sub_id = {
            let mut inner = self.control.inner.lock();
            let sub_id = inner.ids.get(watch_id);
            if let Some(sub_id) = sub_id {
                inner.ids.remove(watch_id);
                inner.incoming.push(Incoming::Cancel { watch_id, sub_id });
            }
            sub_id
        };
        if sub_id.is_some() {
            // The response half ends the watch when it takes the cancel, at its next
            // poll (before it yields anything more), even if the cancel's reply waits
            // behind a watch that is opening.
            self.control.notify();
        }
        Ok(())
    }

    /// Asks for a progress response for the whole stream (watch id -1), as etcd (on
    /// fixed versions) answers it: at a revision at least the cluster's when asked (one
    /// shared round trip learns it), once every watch on the stream has been delivered
    /// every matching event up to it. Answered by the cache. If the cache cannot prove
    /// that within `consistent_read_timeout` (a quiet prefix on an etcd whose progress
    /// answers cannot be trusted), the answer carries the revision it can prove; never
    /// one below the start of a watch on the stream, so with a watch from a revision the
    /// cache has not reached it waits until the cache has (fixed etcd drops such a
    /// request: etcd#20221).
    ///
    /// # Errors
    /// None today; the `Result` mirrors etcd-client.
    pub async fn request_progress(&mut self) -> Result<()> {
        let shared = &self.control.shared;
        let deadline = Instant::now() + shared.config.consistent_read_timeout;
        // Without the cluster's revision the answer is what the cache can prove.
        let at_least = shared.cluster_revision_now().await.unwrap_or(0);
        self.control
            .inner
            .lock()
            .incoming
            .push(Incoming::Progress(UnansweredRequest { at_least, deadline }));
        self.control.notify();
        Ok(())
    }
}

impl Drop for WatchRequestSender {
    fn drop(&mut self) {
        self.control.sender_gone.store(true, Ordering::Release);
        self.control.notify();
    }
}

/// The response half of a [`WatchStream`] (from [`WatchStream::split`]), as
/// `etcd_client::WatchResponseStream`: a `Stream` of every watch's responses.
///
/// It ends (`None`) once no watch is left and none can be added any more: its sender
/// was dropped, or the cache closed. Dropping it cancels every watch on it.
pub struct WatchResponseStream {
    control: Arc<Control>,
    /// The stream's only watch, polled directly: most streams carry one watch, and a
    /// [`ReadySet`] would add a ready-list hop and a wake-up per burst to each of them.
    solo: Option<Subscription>,
    /// What a stream with more than one watch needs; made when a second watch comes
    /// (most streams carry one, and a `ReadySet` holds a heap-allocated ready list).
    multi: Option<Box<Multi>>,
    /// Which of the two goes first next time (fairness).
    solo_first: bool,
    /// True for an unsplit stream: it ends whenever no watch is left.
    end_when_empty: bool,
    /// The highest revision reported: no response goes below it.
    reported: i64,
    /// Stream-wide progress requests not answered yet, boxed: most streams never ask.
    progress: Option<Box<Progress>>,
    /// The oldest reply (`created`, `canceled`) not sent yet; later ones wait in
    /// [`Multi::replies`].
    first_reply: Option<Queued>,
    /// While no watch is left on a split stream: a change of the cache's status (its
    /// close) wakes the stream. Boxed: most streams never wait for it.
    close_wait: Option<Box<Changed>>,
    /// Copied from the control block when it has news.
    sender_gone: bool,
}

/// A stream's unanswered stream-wide progress requests.
struct Progress {
    /// In the order they were asked.
    requests: VecDeque<UnansweredRequest>,
    /// While the first waits for the cache.
    wait: Option<AnswerWait>,
}

/// A stream-wide progress request's wait for the cache. A watch's delivery wakes the
/// stream as ever; besides:
struct AnswerWait {
    /// Until the deadline, registered with the cache, so that it asks etcd for
    /// progress (after it, the request waits for what the cache learns anyway).
    asking: Option<ProgressWait>,
    /// A change of the cache's revision.
    changed: Changed,
    /// The deadline, until it has passed. After it, the answer waits only for a watch
    /// that starts ahead of the cache (fixed etcd drops such a request; the cache answers
    /// it once it gets there), and nothing polls on a clock meanwhile, however far ahead
    /// that start is.
    deadline: Option<Pin<Box<Sleep>>>,
}

/// The part of a [`WatchResponseStream`] that only a stream with several watches uses.
#[derive(Default)]
struct Multi {
    /// The watches other than the solo one, polled as they are woken.
    watches: ReadySet<Subscription>,
    /// Replies after [`WatchResponseStream::first_reply`], in the order of their
    /// requests.
    replies: VecDeque<Queued>,
    /// Requests from an [`Incoming::Opening`] on, in order: the opening waits for its
    /// start, and what follows it waits for the opening.
    held: VecDeque<Incoming>,
}

impl std::fmt::Debug for WatchResponseStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchResponseStream")
            .field("watches", &self.len())
            .field("reported", &self.reported)
            .finish_non_exhaustive()
    }
}

impl WatchResponseStream {
    /// The next response; `Ok(None)` when the stream has ended.
    ///
    /// # Errors
    /// [`Error::Failed`] once, if the cache stopped on a permanent failure.
    ///
    /// # Cancel safety
    /// Cancel safe: a response is removed from the stream only when it is returned.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx))
            .await
            .transpose()
    }

    /// Everything ready now, up to `max` responses, waiting only for the first: a batch
    /// receive, so that a consumer woken once drains every revision queued for it (each
    /// response is still one revision of one watch, in order). Appends to `out` and
    /// returns how many it added; 0 once the stream has ended (as `Ok(None)` from
    /// [`message`](Self::message)).
    ///
    /// # Errors
    /// [`Error::Failed`] once, if the cache stopped on a permanent failure; what came
    /// before it in the same call stays in `out`.
    ///
    /// # Cancel safety
    /// Cancel safe: responses are removed from the stream only as they are added to
    /// `out`.
    pub async fn messages(&mut self, out: &mut Vec<WatchResponse>, max: usize) -> Result<usize> {
        std::future::poll_fn(|cx| self.poll_messages(cx, out, max.max(1))).await
    }

    /// [`messages`](Self::messages), polled with the caller's waker throughout: the
    /// poll that finds nothing more leaves that waker registered (as
    /// [`message`](Self::message) would), not a no-op one that the next call must
    /// replace.
    fn poll_messages(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<WatchResponse>,
        max: usize,
    ) -> Poll<Result<usize>> {
        let mut added = self.queued_into(out, max);
        if added > 0 {
            return Poll::Ready(Ok(added));
        }
        while added < max {
            match Pin::new(&mut *self).poll_next(cx) {
                Poll::Ready(Some(Ok(r))) => {
                    out.push(r);
                    added += 1;
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                Poll::Ready(None) => break,
                Poll::Pending if added == 0 => return Poll::Pending,
                Poll::Pending => break,
            }
        }
        Poll::Ready(Ok(added))
    }

    fn header(&mut self, revision: i64) -> crate::ResponseHeader {
        header_after(&mut self.reported, &self.control.shared, revision)
    }

    /// Watches on the stream (not counting those added but not yet polled).
    fn len(&self) -> usize {
        self.solo.iter().count() + self.multi.as_ref().map_or(0, |m| m.watches.len())
    }

    fn iter(&self) -> impl Iterator<Item = &Subscription> + '_ {
        let others = self.multi.iter().flat_map(|m| m.watches.iter());
        self.solo.iter().chain(others)
    }

    /// Ids of the watches whose `created` response has not been sent yet.
    fn pending_created(&self) -> impl Iterator<Item = i64> + '_ {
        let later = self.multi.iter().flat_map(|m| m.replies.iter());
        self.first_reply
            .iter()
            .chain(later)
            .filter_map(|&r| match Reply::from(r) {
                Reply::Created { watch_id, .. } => Some(watch_id),
                Reply::Canceled { .. } => None,
            })
    }

    /// Queues a reply after those not sent yet.
    fn reply(&mut self, reply: Reply) {
        let later = self.multi.as_ref().is_some_and(|m| !m.replies.is_empty());
        if self.first_reply.is_none() && !later {
            self.first_reply = Some(reply.into());
        } else {
            self.multi
                .get_or_insert_with(Box::default)
                .replies
                .push_back(reply.into());
        }
    }

    /// Takes a newly registered watch: its `created` response (at `created`) goes out
    /// next (after the replies to the requests before it), then its items.
    fn add(&mut self, sub: Subscription, created: i64) {
        self.reply(Reply::Created {
            watch_id: sub.watch_id,
            revision: created,
        });
        if self.len() == 0 {
            self.solo = Some(sub);
        } else {
            self.multi
                .get_or_insert_with(Box::default)
                .watches
                .push(sub);
        }
    }

    /// Ends the watch a cancel named (if it has not ended by itself meanwhile: then its
    /// `canceled` response went out already): nothing more of it is sent but its
    /// `canceled`, in its turn.
    fn cancel(&mut self, watch_id: i64, sub_id: SubId) {
        if self.end_watch(watch_id, sub_id) == Some(true) {
            self.reply(Reply::Canceled { watch_id });
        }
    }

    /// Ends the watch a cancel named, if it is on the stream (`None` if not): it yields
    /// nothing more. `Some(false)` if it had ended by itself already.
    fn end_watch(&mut self, watch_id: i64, sub_id: SubId) -> Option<bool> {
        let named = |w: &Subscription| w.watch_id == watch_id && w.sub_id == sub_id;
        if self.solo.as_ref().is_some_and(named) {
            self.solo.take().map(|mut w| w.cancel())
        } else {
            self.multi
                .as_mut()
                .and_then(|m| m.watches.find_mut(named))
                .map(|w| w.cancel())
        }
    }

    /// The fast path of a stream with one watch and no reply waiting: its next queued
    /// delivery, as the general path ([`poll_responses`](Self::poll_responses)) would
    /// give it (the sender's news is taken first; a reply goes before it; a stream-wide
    /// progress answer, after everything queued).
    #[inline]
    fn next_queued(&mut self) -> Option<WatchResponse> {
        self.take_news();
        if self.multi.is_some() || self.first_reply.is_some() {
            return None;
        }
        let solo = self.solo.as_ref()?;
        let watch_id = solo.watch_id;
        let (revision, events) = solo.queued()?;
        let h = self.header(revision);
        Some(WatchResponse::new_events(h, watch_id, events))
    }

    /// The batch receive's fast path, [`next_queued`](Self::next_queued) up to `max`
    /// times with one lock of the watch's mailbox: what it finds queued goes to `out`,
    /// in order. Returns how many; 0 sends the receive to the general path.
    fn queued_into(&mut self, out: &mut Vec<WatchResponse>, max: usize) -> usize {
        self.take_news();
        if self.multi.is_some() || self.first_reply.is_some() {
            return 0;
        }
        let Some(solo) = self.solo.as_ref() else {
            return 0;
        };
        let watch_id = solo.watch_id;
        let (reported, shared) = (&mut self.reported, &self.control.shared);
        solo.queued_up_to(max, |revision, events| {
            let h = header_after(reported, shared, revision);
            out.push(WatchResponse::new_events(h, watch_id, events));
        })
    }

    /// Takes what the sender handed over (watches, cancels, progress requests), in
    /// order, if there is news.
    #[inline]
    fn take_news(&mut self) {
        // A load first: most polls find no news, and a swap would take the line
        // exclusively at every one of them.
        if self.control.dirty.load(Ordering::Acquire) {
            self.take_news_now();
        }
    }

    /// [`take_news`](Self::take_news) once the flag is seen set.
    #[cold]
    fn take_news_now(&mut self) {
        if !self.control.dirty.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut inner = self.control.inner.lock();
        let incoming = std::mem::take(&mut inner.incoming);
        drop(inner);
        self.sender_gone = self.control.sender_gone.load(Ordering::Acquire);
        for item in incoming {
            self.take_request(item);
        }
    }

    /// Takes one request from the sender, in order: behind a watch still opening, a
    /// watch or a cancel waits; a progress request is queued at once (its answer waits
    /// in the poll until no watch is opening).
    fn take_request(&mut self, item: Incoming) {
        if let Incoming::Progress(request) = item {
            self.progress
                .get_or_insert_with(|| {
                    Box::new(Progress {
                        requests: VecDeque::new(),
                        wait: None,
                    })
                })
                .requests
                .push_back(request);
            return;
        }
        if self.opening() || matches!(item, Incoming::Opening { .. }) {
            let item = match item {
                // A cancel of a watch on the stream ends it now (it yields nothing
                // more); only its reply waits behind the watch that is opening.
                Incoming::Cancel { watch_id, sub_id } => match self.end_watch(watch_id, sub_id) {
                    Some(true) => Incoming::Canceled { watch_id },
                    Some(false) => return,
                    None => item,
                },
                item => item,
            };
            self.multi
                .get_or_insert_with(Box::default)
                .held
                .push_back(item);
            return;
        }
        match item {
            Incoming::Watch(sub, created) => self.add(sub, created),
            Incoming::Cancel { watch_id, sub_id } => self.cancel(watch_id, sub_id),
            Incoming::Canceled { watch_id } => self.reply(Reply::Canceled { watch_id }),
            Incoming::Opening { .. } | Incoming::Progress(_) => unreachable!("taken above"),
        }
    }

    /// Whether a watch added to the stream is still learning its start.
    fn opening(&self) -> bool {
        self.multi.as_ref().is_some_and(|m| !m.held.is_empty())
    }

    /// Registers the watches whose start has been learned, and takes the requests
    /// that waited behind them, in order, up to the next watch still opening.
    fn poll_openings(&mut self, cx: &mut Context<'_>) {
        loop {
            let Some(multi) = self.multi.as_mut() else {
                return;
            };
            let opened = match multi.held.front_mut() {
                None => return,
                Some(Incoming::Opening { task, .. }) => match Pin::new(task).poll(cx) {
                    Poll::Ready(opened) => Some(opened),
                    Poll::Pending => return,
                },
                Some(_) => None,
            };
            let Some(item) = multi.held.pop_front() else {
                return;
            };
            match (item, opened) {
                (Incoming::Opening { .. }, Some(Ok(Ok((sub, created))))) => self.add(sub, created),
                // The cache closed meanwhile (the stream ends with it), or the runtime
                // is shutting down.
                (
                    Incoming::Opening {
                        watch_id, sub_id, ..
                    },
                    Some(failed),
                ) => {
                    let error = match failed {
                        Ok(Err(e)) => e.to_string(),
                        Err(e) => e.to_string(),
                        Ok(Ok(_)) => String::new(),
                    };
                    tracing::debug!(watch_id, error, "watch not opened");
                    self.control.forget(watch_id, sub_id);
                }
                (Incoming::Watch(sub, created), _) => self.add(sub, created),
                (Incoming::Cancel { watch_id, sub_id }, _) => self.cancel(watch_id, sub_id),
                (Incoming::Canceled { watch_id }, _) => {
                    self.reply(Reply::Canceled { watch_id });
                }
                (item @ Incoming::Progress(_), _) => self.take_request(item),
                (Incoming::Opening { .. }, None) => unreachable!("an opening is polled first"),
            }
        }
    }

    /// The oldest reply not sent yet.
    fn next_reply(&mut self) -> Option<Reply> {
        self.first_reply
            .take()
            .or_else(|| self.multi.as_mut()?.replies.pop_front())
            .map(Reply::from)
    }

    /// The next item of any watch, if one is ready.
    fn poll_watches(&mut self, cx: &mut Context<'_>) -> Poll<Option<Tagged>> {
        self.solo_first = !self.solo_first;
        for solo_turn in [self.solo_first, !self.solo_first] {
            if solo_turn {
                if let Some(solo) = self.solo.as_mut() {
                    match solo.poll_next_unpin(cx) {
                        Poll::Ready(Some(item)) => return Poll::Ready(Some(item)),
                        Poll::Ready(None) => self.solo = None,
                        Poll::Pending => {}
                    }
                }
            } else if let Some(multi) = self.multi.as_mut().filter(|m| !m.watches.is_empty()) {
                if let Poll::Ready(Some(item)) = multi.watches.poll_next_unpin(cx) {
                    return Poll::Ready(Some(item));
                }
            }
        }
        if self.len() == 0 {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }

    /// The revision that every watch on the stream has been delivered up to, if it
    /// can be told now.
    fn provable(&self) -> Option<i64> {
        let mut revision = i64::MAX;
        for watch in self.iter() {
            revision = revision.min(watch.provable()?);
        }
        Some(if revision == i64::MAX {
            self.control.shared.view.revision()
        } else {
            revision
        })
    }

    fn respond(&mut self, item: Item, watch_id: i64) -> Option<Result<WatchResponse>> {
        Some(Ok(match item {
            Item::Events { revision, events } => {
                let h = self.header(revision);
                WatchResponse::new_events(h, watch_id, events)
            }
            Item::Progress { revision } => {
                // A claim below what the stream reported already would move its
                // revision backwards: skip this notification (etcd skips them for
                // watches that are not synced).
                if revision < self.reported {
                    return None;
                }
                let h = self.header(revision);
                WatchResponse::new_progress(h, watch_id)
            }
            Item::Canceled { compact_revision } => {
                let h = self.header(self.control.shared.view.revision());
                WatchResponse::new_canceled(h, watch_id, compact_revision)
            }
            Item::Failed(source) => return Some(Err(Error::Failed { source })),
        }))
    }

    /// One look for the next response (see `poll_next`, which registers for the
    /// sender's news).
    fn poll_responses(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<WatchResponse>>> {
        self.take_news();
        self.poll_openings(cx);
        match self.next_reply() {
            Some(Reply::Created { watch_id, revision }) => {
                let h = self.header(revision);
                return Poll::Ready(Some(Ok(WatchResponse::new_created(h, watch_id))));
            }
            Some(Reply::Canceled { watch_id }) => {
                let h = self.header(self.control.shared.view.revision());
                return Poll::Ready(Some(Ok(WatchResponse::new_canceled(h, watch_id, 0))));
            }
            None => {}
        }
        let sender_gone = self.sender_gone;
        while let Poll::Ready(Some(next)) = self.poll_watches(cx) {
            let Tagged {
                watch_id,
                sub_id,
                item,
            } = next;
            if item.is_last() {
                // The watch has ended: its id is free (unless a cancel freed it
                // already and a new watch took it).
                self.control.forget(watch_id, sub_id);
            }
            if let Some(resp) = self.respond(item, watch_id) {
                return Poll::Ready(Some(resp));
            }
        }
        // A progress request answers for the watches added before it: not before they
        // are open.
        let request = (self.progress.as_ref())
            .filter(|_| !self.opening())
            .and_then(|progress| progress.requests.front().copied());
        if let Some(request) = request {
            let provable = self.provable().filter(|&r| r >= self.reported);
            let due = Instant::now() >= request.deadline;
            let shared = &self.control.shared;
            let Some(progress) = self.progress.as_mut() else {
                unreachable!("a request was found in it above");
            };
            match provable.filter(|&r| r >= request.at_least || due) {
                Some(revision) => {
                    progress.requests.pop_front();
                    progress.wait = None;
                    if progress.requests.is_empty() {
                        self.progress = None;
                    }
                    shared.metrics.progress_response();
                    let h = self.header(revision);
                    return Poll::Ready(Some(Ok(WatchResponse::new_progress(h, STREAM_WATCH_ID))));
                }
                None => {
                    // Not yet: a new revision (or the deadline) wakes this stream to
                    // look again, and until the deadline the cache asks etcd for
                    // progress meanwhile. A new wait does not see a change made since
                    // the look above: one more look, then.
                    let wait = match &mut progress.wait {
                        Some(wait) => wait,
                        None => {
                            cx.waker().wake_by_ref();
                            progress.wait.insert(AnswerWait {
                                asking: (!due).then(|| shared.progress.wait()),
                                changed: shared.view.changed(),
                                deadline: (!due)
                                    .then(|| Box::pin(tokio::time::sleep_until(request.deadline))),
                            })
                        }
                    };
                    if wait.changed.as_mut().poll(cx).is_ready() {
                        wait.changed = shared.view.changed();
                        cx.waker().wake_by_ref();
                    }
                    // At the deadline: what the cache can prove, unless a watch starts
                    // ahead of it (looked at above when `due`, again if it passed since).
                    let passed = due
                        || (wait.deadline.as_mut())
                            .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
                    if passed {
                        wait.deadline = None;
                        wait.asking = None;
                        if !due {
                            cx.waker().wake_by_ref();
                        }
                    }
                }
            }
        }
        let shared = &self.control.shared;
        if self.len() == 0 && self.progress.is_none() && !self.opening() {
            if self.end_when_empty || sender_gone || shared.view.is_closed() {
                return Poll::Ready(None);
            }
            let wait = self
                .close_wait
                .get_or_insert_with(|| Box::new(shared.view.changed()));
            if Pin::as_mut(wait).poll(cx).is_ready() {
                self.close_wait = None;
                cx.waker().wake_by_ref();
            }
        } else {
            self.close_wait = None;
        }
        Poll::Pending
    }
}

/// A response header at `revision`, or at the revision the stream reported already if
/// that is later (a stream's headers never go backwards, as etcd's); `reported` follows.
fn header_after(reported: &mut i64, shared: &Shared, revision: i64) -> crate::ResponseHeader {
    *reported = (*reported).max(revision);
    shared.header(*reported)
}

impl Stream for WatchResponseStream {
    type Item = Result<WatchResponse>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(response) = this.next_queued() {
            return Poll::Ready(Some(Ok(response)));
        }
        let polled = this.poll_responses(cx);
        // Only a split stream's sender hands over news from another task: an unsplit
        // stream's owner calls its sender and polls it in turn, and a poll takes the news
        // first. A split stream registers its waker for the news only when it has
        // nothing to give, then looks at the news once more (news handed over between
        // the first look and the registration woke the waker registered before), so a
        // busy stream does not swap wakers at every response.
        if polled.is_pending() && !this.end_when_empty {
            this.control.waker.register(cx.waker());
            if this.control.dirty.load(Ordering::Acquire) {
                return this.poll_responses(cx);
            }
        }
        polled
    }
}

/// A watch stream: any number of watches, added with [`watch`](Self::watch), each
/// answered in order with a `created` response carrying its id, its events, and a
/// `canceled` response when it ends. Made by [`Cache::watch`](crate::Cache::watch)
/// (with one watch) or [`Cache::watch_stream`](crate::Cache::watch_stream) (empty).
/// Mirrors `etcd_client::WatchStream`; a `futures::Stream` of
/// `Result<WatchResponse>`. Dropping it cancels every watch on it and frees their slots
/// at once.
///
/// [`message`](Self::message) gives `Ok(None)` once no watch is left on the stream.
///
/// ```no_run
/// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
/// use std::collections::HashMap;
///
/// let mut stream = cache.watch("/app/a", None).await?;
/// stream.watch("/app/b", None).await?;
/// let mut names = HashMap::new();
/// while let Some(resp) = stream.message().await? {
///     if resp.created() {
///         names.insert(resp.watch_id(), names.len());
///     }
///     for ev in resp.events() {
///         println!("watch {} saw {:?}", resp.watch_id(), ev.kv().map(|kv| kv.key()));
///     }
/// }
/// # Ok(()) }
/// ```
pub struct WatchStream {
    sender: WatchRequestSender,
    responses: WatchResponseStream,
}

impl std::fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStream")
            .field("responses", &self.responses)
            .finish_non_exhaustive()
    }
}

impl WatchStream {
    /// An empty stream on `shared`, counting its watches against `scope`.
    pub(crate) fn empty(shared: Arc<Shared>, scope: Option<Arc<Scope>>) -> WatchStream {
        let control = Arc::new(Control {
            shared,
            scope,
            inner: Mutex::default(),
            dirty: AtomicBool::new(false),
            sender_gone: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        });
        WatchStream {
            sender: WatchRequestSender {
                control: control.clone(),
            },
            responses: WatchResponseStream {
                control,
                solo: None,
                multi: None,
                solo_first: false,
                end_when_empty: true,
                reported: 0,
                progress: None,
                first_reply: None,
                close_wait: None,
                sender_gone: false,
            },
        }
    }

    /// Adds a watch to this stream. As [`WatchRequestSender::watch`].
    ///
    /// # Errors
    /// As [`WatchRequestSender::watch`].
    pub async fn watch(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> Result<()> {
        // Both halves are here: hand the watch to the response half directly, after the
        // cancels before it.
        let added = self.sender.add(key.into(), options).await?;
        self.responses.take_news();
        self.responses.take_request(added);
        Ok(())
    }

    /// Adds a watch and waits until it is open (for a watch from now, until the
    /// cluster's revision is known), as `etcd_client::Client::watch` returns a stream
    /// whose watch etcd has created: a write made after this returns is delivered.
    pub(crate) async fn watch_open(
        &mut self,
        key: impl Into<Vec<u8>>,
        options: Option<WatchOptions>,
    ) -> Result<()> {
        let (sub, created) = self.sender.register(key.into(), options).await?;
        self.responses.take_news();
        self.responses.take_request(Incoming::Watch(sub, created));
        Ok(())
    }

    /// Cancels the watch `watch_id`. As [`WatchRequestSender::cancel`].
    ///
    /// # Errors
    /// None today; the `Result` mirrors etcd-client.
    pub async fn cancel(&mut self, watch_id: i64) -> Result<()> {
        self.sender.cancel(watch_id).await
    }

    /// Asks for a progress response for every watch on the stream. As
    /// [`WatchRequestSender::request_progress`].
    ///
    /// # Errors
    /// None today; the `Result` mirrors etcd-client.
    pub async fn request_progress(&mut self) -> Result<()> {
        self.sender.request_progress().await
    }

    /// The next response; `Ok(None)` once no watch is left on the stream. As
    /// `etcd_client::WatchStream::message`.
    ///
    /// # Errors
    /// [`Error::Failed`] once, if the cache stopped on a permanent failure.
    ///
    /// # Cancel safety
    /// Cancel safe: a response is removed from the stream only when it is returned.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>> {
        self.responses.message().await
    }

    /// Everything ready now, up to `max` responses, waiting only for the first (a
    /// batch receive; see [`WatchResponseStream::messages`]). Appends to `out` and
    /// returns how many it added; 0 once the stream has ended.
    ///
    /// ```no_run
    /// # async fn f(cache: etcd_cache::Cache) -> etcd_cache::Result<()> {
    /// use etcd_cache::WatchOptions;
    ///
    /// let mut stream = cache.watch("/app/", Some(WatchOptions::new().with_prefix())).await?;
    /// let mut batch = Vec::new();
    /// while stream.messages(&mut batch, 256).await? > 0 {
    ///     for resp in batch.drain(..) {
    ///         println!("{} events at {}", resp.events().len(), resp.revision());
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Failed`] once, if the cache stopped on a permanent failure.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`message`](Self::message).
    pub async fn messages(&mut self, out: &mut Vec<WatchResponse>, max: usize) -> Result<usize> {
        self.responses.messages(out, max).await
    }

    /// Splits the stream into its request sender and its response stream, as
    /// etcd-client's: one task can add and cancel watches while another reads. The
    /// response stream then ends once no watch is left *and* the sender is dropped.
    pub fn split(self) -> (WatchRequestSender, WatchResponseStream) {
        let WatchStream {
            sender,
            mut responses,
        } = self;
        responses.end_when_empty = false;
        (sender, responses)
    }

    /// The id of the first watch of a stream made by `Cache::watch` (0 unless chosen
    /// with `with_watch_id`). Each response carries its own watch's id.
    pub fn watch_id(&self) -> i64 {
        self.responses
            .iter()
            .map(|w| w.watch_id)
            .chain(self.responses.pending_created())
            .chain(
                self.sender
                    .control
                    .inner
                    .lock()
                    .incoming
                    .iter()
                    .filter_map(Incoming::watch_id),
            )
            .min()
            .unwrap_or(0)
    }
}

impl Stream for WatchStream {
    type Item = Result<WatchResponse>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.get_mut().responses).poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::{Ids, Queued, Reply, WatchResponseStream};

    #[test]
    fn a_queued_reply_is_the_reply_in_16_bytes() {
        assert_eq!(std::mem::size_of::<Option<Queued>>(), 16);
        for reply in [
            Reply::Created {
                watch_id: 0,
                revision: 0,
            },
            Reply::Created {
                watch_id: -7,
                revision: i64::MAX - 1,
            },
            Reply::Canceled { watch_id: 0 },
            Reply::Canceled { watch_id: i64::MIN },
        ] {
            assert_eq!(Reply::from(Queued::from(reply)), reply);
        }
    }

    /// An idle one-watch stream's response half, its watch inline (issue 22's 512 B per
    /// idle subscriber counts it): a guard against a field that grows it unnoticed.
    #[test]
    fn a_one_watch_response_half_fits_in_128_bytes() {
        assert!(std::mem::size_of::<super::Subscription>() <= 64);
        assert!(std::mem::size_of::<WatchResponseStream>() <= 128);
    }

    #[test]
    fn ids_stay_right_when_the_short_list_turns_into_a_map() {
        let mut ids = Ids::default();
        for id in 0..40 {
            assert!(!ids.contains(id));
            ids.insert(id, 0);
            ids.insert(id, id as u64 + 100);
            assert!(matches!(ids, Ids::Many(_)) == (id >= Ids::FEW as i64));
        }
        for id in (0..40).step_by(3) {
            ids.remove(id);
        }
        for id in 0..40 {
            let expected = (id % 3 != 0).then_some(id as u64 + 100);
            assert_eq!(ids.get(id), expected, "watch id {id}");
        }
        let mut few = Ids::default();
        few.insert(7, 1);
        few.insert(9, 2);
        few.remove(7);
        assert_eq!((few.get(7), few.get(9)), (None, Some(2)));
        let mut one = Ids::default();
        one.insert(7, 1);
        one.insert(7, 3);
        one.remove(8);
        assert!(matches!(one, Ids::One(7, 3)));
        one.remove(7);
        assert!(matches!(one, Ids::None) && one.get(7).is_none());
    }
}
