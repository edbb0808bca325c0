//! [`ReadySet`]: the watches of a stream that carries more than one, polled as they are
//! woken, each taken up to [`BURST`] items in a row before the next.
//!
//! It replaces `futures::stream::SelectAll`, which re-queues a stream after every item
//! (a new task allocation, two reference counts and a wake-up per item: about a third
//! of the CPU of a stream of 100 busy watches). Here each watch gets one waker for its
//! whole life, whose wake puts the watch's slot on a ready list once until it is polled;
//! the set then takes up to [`BURST`] items of one watch in a row (so consecutive
//! revisions of one watch are taken together) before it turns to the next ready one.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_core::Stream;
use futures_util::task::AtomicWaker;
use parking_lot::Mutex;

/// Items one stream gives in a row before the set turns to the next ready one.
const BURST: usize = 256;

/// Pushes `item`, growing a full `v` by a quarter (at least one) instead of doubling it:
/// a stream's per-watch vectors are kept for the stream's life, and a doubled one leaves
/// up to half its room unused (a stream of 10 watches held room for 16). Growth stays
/// geometric, so a push is still amortized O(1).
pub(super) fn push_lean<T>(v: &mut Vec<T>, item: T) {
    if v.len() == v.capacity() {
        v.reserve_exact(v.len() / 4 + 1);
    }
    v.push(item);
}

/// The slots woken since the set last looked, and the set's own waker.
#[derive(Default)]
struct ReadyList {
    slots: Mutex<Vec<usize>>,
    parent: AtomicWaker,
}

/// The waker of one slot: its wake lists the slot (once until it is polled) and wakes
/// the set's task.
struct SlotWaker {
    slot: usize,
    listed: AtomicBool,
    list: Arc<ReadyList>,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.listed.swap(true, Ordering::AcqRel) {
            self.list.slots.lock().push(self.slot);
            self.list.parent.wake();
        }
    }
}

struct Entry<S> {
    stream: S,
    flag: Arc<SlotWaker>,
    /// `flag` as a `Waker`, made once: the same waker at every poll, so a mailbox keeps
    /// the one it has (`Waker::will_wake`).
    waker: Waker,
}

/// A set of streams polled as they are woken; a `Stream` of their items. It never ends
/// (it is pending while empty, unlike `SelectAll`): its owner tells by
/// [`len`](Self::len) whether any stream is left.
pub(super) struct ReadySet<S> {
    entries: Vec<Option<Entry<S>>>,
    free: Vec<usize>,
    len: usize,
    list: Arc<ReadyList>,
    /// The slots taken from the list, to poll in order.
    due: VecDeque<usize>,
    /// The slot that gave the last item, polled first next time, and the items it has
    /// given in a row.
    current: Option<(usize, usize)>,
}

impl<S> Default for ReadySet<S> {
    fn default() -> Self {
        ReadySet {
            entries: Vec::new(),
            free: Vec::new(),
            len: 0,
            list: Arc::default(),
            due: VecDeque::new(),
            current: None,
        }
    }
}

impl<S: Stream + Unpin> ReadySet<S> {
    /// Streams in the set (an ended one leaves when it is next polled).
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds a stream; it is polled in its turn, as if woken.
    pub(super) fn push(&mut self, stream: S) {
        let slot = self.free.pop().unwrap_or(self.entries.len());
        let flag = Arc::new(SlotWaker {
            slot,
            listed: AtomicBool::new(true),
            list: self.list.clone(),
        });
        let entry = Entry {
            stream,
            waker: Waker::from(flag.clone()),
            flag,
        };
        if slot == self.entries.len() {
            push_lean(&mut self.entries, Some(entry));
        } else {
            self.entries[slot] = Some(entry);
        }
        self.len += 1;
        self.due.push_back(slot);
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &S> + '_ {
        self.entries.iter().flatten().map(|e| &e.stream)
    }

    /// The first stream that `pred` picks, to be changed by the caller: it is listed as
    /// woken and polled in its turn, so a change that ends it (or gives it an item) is
    /// seen without a wake-up from the stream itself.
    pub(super) fn find_mut(&mut self, mut pred: impl FnMut(&S) -> bool) -> Option<&mut S> {
        let slot = self
            .entries
            .iter()
            .position(|e| e.as_ref().is_some_and(|e| pred(&e.stream)))?;
        let entry = self.entries[slot].as_mut()?;
        entry.flag.wake_by_ref();
        Some(&mut entry.stream)
    }

    /// The next item of a woken stream, if any: the current one's, up to [`BURST`] in a
    /// row, then the next ready one's.
    fn next_ready(&mut self) -> Option<S::Item> {
        if let Some((slot, given)) = self.current.take() {
            if given < BURST {
                if let Poll::Ready(Some(item)) = self.poll_slot(slot) {
                    self.current = Some((slot, given + 1));
                    return Some(item);
                }
            } else {
                // Its turn is over: to the back, after every watch woken before now
                // (those still on the shared list too, or a busy watch would be taken
                // again and again while `due` is never empty).
                self.due.extend(self.list.slots.lock().drain(..));
                self.due.push_back(slot);
            }
        }
        loop {
            if self.due.is_empty() {
                self.due.extend(self.list.slots.lock().drain(..));
            }
            let slot = self.due.pop_front()?;
            if let Poll::Ready(Some(item)) = self.poll_slot(slot) {
                self.current = Some((slot, 1));
                return Some(item);
            }
        }
    }

    /// Polls one slot with its own waker; removes its stream when it has ended.
    fn poll_slot(&mut self, slot: usize) -> Poll<Option<S::Item>> {
        let Some(entry) = self.entries.get_mut(slot).and_then(Option::as_mut) else {
            // Listed by a stream that has left since (its slot free or reused).
            return Poll::Pending;
        };
        // Cleared before the poll: a wake during or after it lists the slot again.
        entry.flag.listed.store(false, Ordering::Release);
        let polled = Pin::new(&mut entry.stream).poll_next(&mut Context::from_waker(&entry.waker));
        if let Poll::Ready(None) = polled {
            self.entries[slot] = None;
            self.free.push(slot);
            self.len -= 1;
        }
        polled
    }
}

impl<S: Stream + Unpin> Stream for ReadySet<S> {
    type Item = S::Item;

    /// The set's waker is registered only when it has nothing to give, and the ready
    /// list looked at once more after that: a slot woken between the first look and the
    /// registration woke the waker registered before. So a busy set does not swap
    /// wakers at every item (a batch receive polls with a no-op waker between).
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = self.get_mut();
        if let Some(item) = this.next_ready() {
            return Poll::Ready(Some(item));
        }
        this.list.parent.register(cx.waker());
        match this.next_ready() {
            Some(item) => Poll::Ready(Some(item)),
            None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    /// A vector pushed by `push_lean` keeps at most a quarter of room (10 items: room for
    /// 10, where doubling leaves 16), and still grows geometrically (100,000 items in at
    /// most 60 growths; one per push would be 100,000).
    #[test]
    fn push_lean_grows_by_a_quarter() {
        let mut v = Vec::new();
        for i in 0..10 {
            push_lean(&mut v, i);
        }
        assert!(v.capacity() <= 12, "room for {}", v.capacity());
        let mut v = Vec::new();
        let mut growths = 0;
        for i in 0..100_000 {
            let room = v.capacity();
            push_lean(&mut v, i);
            growths += usize::from(v.capacity() != room);
            assert!(v.capacity() <= v.len() + v.len() / 4 + 1);
        }
        assert!(growths <= 60, "{growths} growths");
    }

    /// Queued items, closed, the consumer's waker.
    type FeedState = (VecDeque<u32>, bool, Option<Waker>);

    /// A stream of the items pushed into it; ends when closed and empty.
    #[derive(Clone, Default)]
    struct Feed(Arc<Mutex<FeedState>>);

    impl Feed {
        fn send(&self, v: u32) {
            let mut s = self.0.lock();
            s.0.push_back(v);
            if let Some(w) = s.2.take() {
                w.wake();
            }
        }
        fn close(&self) {
            let mut s = self.0.lock();
            s.1 = true;
            if let Some(w) = s.2.take() {
                w.wake();
            }
        }
    }

    impl Stream for Feed {
        type Item = u32;
        fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<u32>> {
            let mut s = self.0.lock();
            if let Some(v) = s.0.pop_front() {
                return Poll::Ready(Some(v));
            }
            if s.1 {
                return Poll::Ready(None);
            }
            s.2 = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    fn ready(set: &mut ReadySet<Feed>) -> Vec<u32> {
        let mut got = Vec::new();
        let noop = Waker::noop();
        let mut cx = Context::from_waker(noop);
        while let Poll::Ready(Some(v)) = set.poll_next_unpin(&mut cx) {
            got.push(v);
        }
        got
    }

    #[test]
    fn each_stream_is_drained_in_order_and_woken_ones_are_polled() {
        let (a, b) = (Feed::default(), Feed::default());
        let mut set = ReadySet::default();
        set.push(a.clone());
        set.push(b.clone());
        assert!(ready(&mut set).is_empty());
        for v in 1..=3 {
            a.send(v);
        }
        b.send(10);
        assert_eq!(ready(&mut set), [1, 2, 3, 10]);
        b.send(11);
        assert_eq!(ready(&mut set), [11]);
        assert_eq!(set.len(), 2);
        a.close();
        assert!(ready(&mut set).is_empty());
        assert_eq!(set.len(), 1, "an ended stream leaves the set");
        // Its slot is reused; a stale listing of it polls the new stream harmlessly.
        let c = Feed::default();
        set.push(c.clone());
        c.send(20);
        a.send(99);
        assert_eq!(ready(&mut set), [20]);
        assert_eq!(set.len(), 2);
    }

    #[test]
    fn a_busy_stream_gives_way_after_a_burst() {
        let (a, b) = (Feed::default(), Feed::default());
        let mut set = ReadySet::default();
        set.push(a.clone());
        set.push(b.clone());
        assert!(ready(&mut set).is_empty());
        for v in 0..(BURST as u32 + 5) {
            a.send(v);
        }
        b.send(1000);
        let got = ready(&mut set);
        let at = got.iter().position(|&v| v == 1000).expect("b's item");
        assert_eq!(at, BURST, "b is served after one burst of a: {got:?}");
        assert_eq!(got.len(), BURST + 6);
    }

    /// A watch woken while another is in its run is served after that run, not after
    /// the other's whole backlog.
    #[test]
    fn a_stream_woken_during_a_burst_is_served_after_it() {
        let (a, b) = (Feed::default(), Feed::default());
        let mut set = ReadySet::default();
        set.push(a.clone());
        set.push(b.clone());
        assert!(ready(&mut set).is_empty());
        for v in 0..(3 * BURST as u32) {
            a.send(v);
        }
        let noop = Waker::noop();
        let mut cx = Context::from_waker(noop);
        assert_eq!(set.poll_next_unpin(&mut cx), Poll::Ready(Some(0)));
        // Woken after a's run began: on the shared list, not yet taken.
        b.send(1000);
        let mut got = vec![0];
        got.extend(ready(&mut set));
        let at = got.iter().position(|&v| v == 1000).expect("b's item");
        assert_eq!(at, BURST, "b is served after a's first burst: {got:?}");
        assert_eq!(got.len(), 3 * BURST + 1);
    }

    #[test]
    fn a_changed_stream_is_polled_again_without_a_wake() {
        let a = Feed::default();
        let mut set = ReadySet::default();
        set.push(a.clone());
        assert!(ready(&mut set).is_empty());
        // A change the stream's waker does not hear of (no wake): find_mut lists it.
        a.0.lock().0.push_back(7);
        assert!(ready(&mut set).is_empty(), "not woken: not polled");
        assert!(set.find_mut(|_| true).is_some());
        assert_eq!(ready(&mut set), [7]);
    }

    /// Counts its wakes.
    #[derive(Default)]
    struct Count(std::sync::atomic::AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The set registers its waker when it has nothing to give: a batch receive's polls
    /// with a no-op waker in between do not leave the no-op one registered for the next
    /// item.
    #[test]
    fn the_waker_of_the_poll_that_found_nothing_is_woken() {
        let a = Feed::default();
        let mut set = ReadySet::default();
        set.push(a.clone());
        let first = Arc::new(Count::default());
        let first_waker = Waker::from(first.clone());
        let mut cx = Context::from_waker(&first_waker);
        assert!(set.poll_next_unpin(&mut cx).is_pending());
        a.send(1);
        a.send(2);
        assert_eq!(first.0.load(Ordering::SeqCst), 1, "woken once for both");
        assert_eq!(ready(&mut set), [1, 2], "taken with a no-op waker");
        let second = Arc::new(Count::default());
        let second_waker = Waker::from(second.clone());
        let mut cx = Context::from_waker(&second_waker);
        assert!(set.poll_next_unpin(&mut cx).is_pending());
        a.send(3);
        assert_eq!(second.0.load(Ordering::SeqCst), 1, "the last poll's waker");
        assert_eq!(first.0.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_wake_wakes_the_task_that_polls_the_set() {
        let a = Feed::default();
        let mut set = ReadySet::default();
        set.push(a.clone());
        let sender = tokio::spawn(async move {
            tokio::task::yield_now().await;
            a.send(5);
        });
        assert_eq!(set.next().await, Some(5));
        sender.await.unwrap();
    }
}
