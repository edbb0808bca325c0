//! One watch on a stream: its `created` response, its deliveries from the mailbox, its
//! periodic progress, and its last response (canceled, compacted, failed).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_core::Stream;
use tokio::time::{Instant, Sleep};

use super::register::Registration;
use crate::error::Error;
use crate::events::SharedEvents;
use crate::metrics::EndReason;
use crate::shared::Shared;
use crate::subscribers::mailbox::{End, Mailbox, Polled};
use crate::subscribers::{Registered, Slot, SubId};

/// What one watch yields, before its stream turns it into a response.
#[derive(Debug)]
pub(super) enum Item {
    Events {
        revision: i64,
        events: SharedEvents,
    },
    /// A periodic progress notification: every matching event up to `revision`
    /// has been delivered.
    Progress {
        revision: i64,
    },
    /// The watch ended: cancelled (`compact_revision == 0`) or behind the window.
    Canceled {
        compact_revision: i64,
    },
    /// The cache stopped on this error.
    Failed(Arc<Error>),
}

impl Item {
    /// True for a watch's last item: after it the watch has ended and its id may be
    /// freed.
    #[inline]
    pub(super) fn is_last(&self) -> bool {
        matches!(self, Item::Canceled { .. } | Item::Failed(_))
    }
}

/// An item with the ids of the watch it belongs to (its stream frees the ids after a
/// last item).
pub(super) struct Tagged {
    pub(super) watch_id: i64,
    pub(super) sub_id: SubId,
    pub(super) item: Item,
}

/// One watch and the items it still owes; a `Stream` that ends after its last item.
pub(super) struct Subscription {
    shared: Arc<Shared>,
    /// Its id on the stream.
    pub(super) watch_id: i64,
    /// Its id in the cache's registry (0 for a watch compacted at creation).
    pub(super) sub_id: SubId,
    /// Where its items come from, until it ends.
    source: Source,
    /// Freed as soon as the watch ends, not when the stream is dropped.
    slot: Option<Slot>,
    /// No progress is told below it: the revision its `created` reported (every
    /// matching event up to it was delivered once the mailbox is drained), or, for a
    /// watch that starts [`ahead`](Source::Live) of the cache, the revision before its
    /// start.
    floor: i64,
    progress_timer: Option<Pin<Box<Sleep>>>,
}

/// Where a watch's items come from, and its state (one field of 16 bytes, so that an
/// idle watch's stream stays small).
enum Source {
    /// Registered: its deliveries arrive in the mailbox; `progress_due` once its
    /// periodic progress timer has fired and the progress is not sent yet; `ahead` for
    /// a watch from a start revision the cache had not reached when it was created
    /// (see [`progress_at`]).
    Live {
        mailbox: Arc<Mailbox>,
        progress_due: bool,
        ahead: bool,
    },
    /// Its start is below the history window: it yields the compaction signal with
    /// this compact revision, then ends.
    Compacted(i64),
    /// Out of the index, its slot freed (its stream frees its id when it takes the last
    /// item: see [`Item::is_last`]).
    Ended,
}

/// The revision a live watch's progress may be told at, with the cache at `revision`
/// and nothing queued for the watch: never below its `floor`; and for a watch that
/// starts `ahead` of the cache (a client resuming from what it saw through another
/// proxy or member, or a future revision), nothing until the cache reaches its start
/// (`floor + 1`), as etcd >= 3.4.38 / 3.5.22 / 3.6.2 (`rev < w.startRev`, etcd#20221):
/// a revision below it would move that client's revision backwards, and a client
/// resuming from it would be sent events again.
fn progress_at(floor: i64, ahead: bool, revision: i64) -> Option<i64> {
    (!ahead || revision > floor).then_some(revision.max(floor))
}

impl Subscription {
    /// The watch, and the revision its `created` response reports.
    pub(super) fn new(
        shared: Arc<Shared>,
        registration: Registration,
        watch_id: i64,
    ) -> (Self, i64) {
        let Registration {
            start_revision,
            progress_notify,
            registered,
            slot,
            revision,
        } = registration;
        let (sub_id, source, created, floor) = match registered {
            Registered::Live {
                id,
                mailbox,
                position,
            } => {
                // A watch from now is current at the revision it starts after, which
                // may be ahead of the cache's. A watch from a start revision (its
                // position just below it) reports the cache's revision, and is `ahead`
                // while the cache is below its start.
                let (created, ahead) = if start_revision == 0 {
                    (position.max(revision), false)
                } else {
                    (revision, revision <= position)
                };
                let source = Source::Live {
                    mailbox,
                    progress_due: false,
                    ahead,
                };
                let floor = if ahead { position } else { created };
                (id, source, created, floor)
            }
            Registered::Compacted { floor } => (0, Source::Compacted(floor), revision, revision),
        };
        let progress_timer = (progress_notify && matches!(source, Source::Live { .. }))
            .then(|| Box::pin(tokio::time::sleep(shared.config().progress_notify_interval)));
        let subscription = Subscription {
            shared,
            watch_id,
            sub_id,
            source,
            slot: Some(slot),
            floor,
            progress_timer,
        };
        (subscription, created)
    }

    /// The revision up to which every matching event has been delivered to this watch
    /// now, if it has nothing queued and is not catching up.
    pub(super) fn provable(&self) -> Option<i64> {
        let &Source::Live {
            ref mailbox, ahead, ..
        } = &self.source
        else {
            return None;
        };
        let revision = mailbox.idle_revision(|| self.shared.view().revision())?;
        progress_at(self.floor, ahead, revision)
    }

    /// The next delivery queued for this live watch, if there is one: its stream's
    /// fast path, which skips the item and its tags (what `poll_next` would yield
    /// first; `None` sends the stream to `poll_next`).
    #[inline]
    pub(super) fn queued(&self) -> Option<(i64, SharedEvents)> {
        let Source::Live { mailbox, .. } = &self.source else {
            return None;
        };
        let delivery = mailbox.pop()?;
        // What catch-ups queued is counted by the polls that take deliveries, as in
        // `poll_next` (a plain load when there is nothing to count).
        let shared = &self.shared;
        shared.metrics().replayed(shared.subscribers().lag());
        Some((delivery.revision, delivery.events))
    }

    /// Up to `max` deliveries queued for this live watch, in order, for its stream's
    /// batch receive: [`queued`](Self::queued) as many times, under one lock of the
    /// mailbox. Returns how many `take` was given (0 when the watch is not live).
    #[inline]
    pub(super) fn queued_up_to(
        &self,
        max: usize,
        mut take: impl FnMut(i64, SharedEvents),
    ) -> usize {
        let Source::Live { mailbox, .. } = &self.source else {
            return 0;
        };
        let n = mailbox.pop_up_to(max, |d| take(d.revision, d.events));
        if n > 0 {
            let shared = &self.shared;
            shared.metrics().replayed(shared.subscribers().lag());
        }
        n
    }

    /// Ends the watch: out of the index, its slot freed.
    fn finish(&mut self, reason: EndReason) {
        let source = std::mem::replace(&mut self.source, Source::Ended);
        if matches!(source, Source::Ended) {
            return;
        }
        self.shared.metrics().watch_ended(reason);
        tracing::debug!(watch_id = self.watch_id, ?reason, "watch ended");
        if let Source::Live { mailbox, .. } = source {
            self.shared
                .subscribers()
                .unsubscribe(self.sub_id, &mailbox, End::Cancelled);
        }
        if let Some(slot) = self.slot.take() {
            slot.forget(self.sub_id);
        }
        self.progress_timer = None;
    }

    /// Ends the watch for a cancel: what its mailbox still holds is not sent (etcd
    /// sends nothing of a canceled watch after its `canceled`), and it yields nothing
    /// more (its stream sends the `canceled`). False if it had ended already (its last
    /// response, a compaction's, went out before the cancel was taken).
    pub(super) fn cancel(&mut self) -> bool {
        let live = !matches!(self.source, Source::Ended);
        self.finish(EndReason::Canceled);
        live
    }
}

impl Stream for Subscription {
    /// The watch's next item, with its ids.
    type Item = Tagged;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Tagged>> {
        let this = self.get_mut();
        let (watch_id, sub_id) = (this.watch_id, this.sub_id);
        this.poll_item(cx).map(|item| {
            item.map(|item| Tagged {
                watch_id,
                sub_id,
                item,
            })
        })
    }
}

impl Subscription {
    fn poll_item(&mut self, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        let this = self;
        let (mailbox, progress_due, ahead) = match &mut this.source {
            Source::Live {
                mailbox,
                progress_due,
                ahead,
            } => (&*mailbox, progress_due, *ahead),
            Source::Ended => return Poll::Ready(None),
            &mut Source::Compacted(compact_revision) => {
                this.finish(EndReason::Compacted);
                return Poll::Ready(Some(Item::Canceled { compact_revision }));
            }
        };
        let shared = &this.shared;
        loop {
            let polled = mailbox.poll(
                cx.waker(),
                shared.history(),
                shared.subscribers().lag(),
                || shared.view().revision(),
            );
            shared.metrics().replayed(shared.subscribers().lag());
            let item = match polled {
                Polled::Delivery(d) => Item::Events {
                    revision: d.revision,
                    events: d.events,
                },
                Polled::Ended(End::Closed) => {
                    this.finish(EndReason::Closed);
                    return Poll::Ready(None);
                }
                Polled::Ended(End::Cancelled) => {
                    // Only its stream's sender cancels a live watch (its own end goes
                    // through `finish`), and the stream sends the `canceled` when it
                    // takes that cancel, in the order of the requests (after the
                    // `created` of a watch still opening before it): nothing from here.
                    return Poll::Pending;
                }
                Polled::Ended(End::Compacted(compact_revision)) => {
                    tracing::debug!(
                        watch_id = this.watch_id,
                        compact_revision,
                        "a watch fell behind the history window; it is canceled as compacted"
                    );
                    Item::Canceled { compact_revision }
                }
                Polled::Ended(End::Failed(error)) => Item::Failed(error),
                Polled::Idle { revision } => {
                    let due = progress_at(this.floor, ahead, revision).filter(|_| *progress_due);
                    if let Some(revision) = due {
                        *progress_due = false;
                        shared.metrics().progress_response();
                        return Poll::Ready(Some(Item::Progress { revision }));
                    }
                    if let Some(timer) = this.progress_timer.as_mut() {
                        if timer.as_mut().poll(cx).is_ready() {
                            let next = Instant::now() + shared.config().progress_notify_interval;
                            timer.as_mut().reset(next);
                            *progress_due = true;
                            continue;
                        }
                    }
                    return Poll::Pending;
                }
            };
            match &item {
                Item::Canceled {
                    compact_revision: 0,
                    ..
                } => this.finish(EndReason::Canceled),
                Item::Canceled { .. } => this.finish(EndReason::Compacted),
                Item::Failed(_) => this.finish(EndReason::Failed),
                _ => {}
            }
            return Poll::Ready(Some(item));
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.finish(EndReason::Dropped);
    }
}
