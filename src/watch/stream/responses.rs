//! The response half of a stream: every watch's responses, the replies in the order of
//! the requests, and the stream-wide progress answers.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_core::Stream;
use futures_util::stream::StreamExt;
use tokio::time::{Instant, Sleep};

use super::control::{Control, Incoming, Queued, Reply, UnansweredRequest, STREAM_WATCH_ID};
use crate::error::{Error, Result};
use crate::progress::ProgressWait;
use crate::shared::Shared;
use crate::subscribers::SubId;
use crate::view::Changed;
use crate::watch::ready_set::ReadySet;
use crate::watch::response::WatchResponse;
use crate::watch::subscription::{Item, Subscription, Tagged};

/// The response half of a [`WatchStream`](crate::WatchStream) (from
/// [`WatchStream::split`](crate::WatchStream::split)), as
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
    pub(super) end_when_empty: bool,
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

    pub(super) fn iter(&self) -> impl Iterator<Item = &Subscription> + '_ {
        let others = self.multi.iter().flat_map(|m| m.watches.iter());
        self.solo.iter().chain(others)
    }

    /// Ids of the watches whose `created` response has not been sent yet.
    pub(super) fn pending_created(&self) -> impl Iterator<Item = i64> + '_ {
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
    pub(super) fn take_news(&mut self) {
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
    pub(super) fn take_request(&mut self, item: Incoming) {
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
            release_drained(&mut multi.held, 0);
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
            .or_else(|| {
                let replies = &mut self.multi.as_mut()?.replies;
                let next = replies.pop_front();
                release_drained(replies, KEPT_ROOM);
                next
            })
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
            self.control.shared.view().revision()
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
                let h = self.header(self.control.shared.view().revision());
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
                let h = self.header(self.control.shared.view().revision());
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
                    shared.metrics().progress_response();
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
                                asking: (!due).then(|| shared.progress().wait()),
                                changed: shared.view().changed(),
                                deadline: (!due)
                                    .then(|| Box::pin(tokio::time::sleep_until(request.deadline))),
                            })
                        }
                    };
                    if wait.changed.as_mut().poll(cx).is_ready() {
                        wait.changed = shared.view().changed();
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
            if self.end_when_empty || sender_gone || shared.view().is_closed() {
                return Poll::Ready(None);
            }
            let wait = self
                .close_wait
                .get_or_insert_with(|| Box::new(shared.view().changed()));
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

impl WatchResponseStream {
    /// The response half of the stream of `control`, with no watch yet; an unsplit
    /// stream's until [`WatchStream::split`](crate::WatchStream::split).
    pub(super) fn new(control: Arc<Control>) -> WatchResponseStream {
        WatchResponseStream {
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
        }
    }
}

/// The room the drained queue of replies keeps (see [`release_drained`]).
const KEPT_ROOM: usize = 8;

/// Gives back the room a queue grew to in a burst once it is empty, but `keep`: a caller
/// that adds many watches at once grows the stream's queues to their number, and a
/// `VecDeque` never shrinks by itself, so an idle stream kept that high-water mark for
/// life. The queue of held requests keeps none (it holds only while a watch from now
/// learns its start: 8 requests of room were 58 B of every watch in streams of 10).
fn release_drained<T>(queue: &mut VecDeque<T>, keep: usize) {
    if queue.is_empty() && queue.capacity() > keep {
        queue.shrink_to(keep);
    }
}

#[cfg(test)]
mod tests {
    use super::WatchResponseStream;

    /// An idle one-watch stream's response half, its watch inline (issue 22's 512 B per
    /// idle subscriber counts it): a guard against a field that grows it unnoticed.
    #[test]
    fn a_one_watch_response_half_fits_in_128_bytes() {
        assert!(std::mem::size_of::<super::Subscription>() <= 64);
        assert!(std::mem::size_of::<WatchResponseStream>() <= 128);
    }
}
