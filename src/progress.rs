//! The progress requestor: while (and only while) a read waits for the cache to reach a
//! revision, the follower sends `RequestProgress` upstream. One request serves every
//! read that was waiting when it was sent; nothing is sent when nothing waits.
//!
//! The readers' side is [`ProgressRequestor`] (shared; a read registers with a
//! [`ProgressWait`] for as long as it waits); the follower's is [`RequestSchedule`], which
//! decides when the next request goes out:
//! - at once, when a read started waiting since the last request was sent (it is
//!   *fresh*) and no request is outstanding: that read needs an answer sent after it
//!   asked, and one round trip gives it;
//! - otherwise at most once per `progress_request_interval`: a read that is still
//!   waiting after an answer needs events that have not happened yet (no answer can
//!   help it sooner), and an unanswered request may have been lost (etcd#17507).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Shared between readers (who register) and the follower (who sends).
#[derive(Debug, Default)]
pub(crate) struct ProgressRequestor {
    waiting: AtomicUsize,
    /// A read started waiting since the last request was sent.
    fresh: AtomicBool,
    /// Wakes the follower when a read starts waiting.
    pub(crate) wake: Notify,
    sent: AtomicU64,
}

impl ProgressRequestor {
    /// Registers a waiting read until the [`ProgressWait`] is dropped.
    pub(crate) fn wait(self: &Arc<Self>) -> ProgressWait {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        self.fresh.store(true, Ordering::Release);
        self.wake.notify_one();
        ProgressWait(self.clone())
    }

    /// Number of reads waiting.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// True if a read started waiting since the last request was sent.
    pub(crate) fn fresh(&self) -> bool {
        self.fresh.load(Ordering::Acquire)
    }

    /// Counts one `RequestProgress` about to be sent: it serves every read waiting now.
    pub(crate) fn record_sent(&self) {
        self.fresh.store(false, Ordering::Release);
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// `RequestProgress` messages sent so far.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

/// A registered waiting read (a read, a watch from now, a stream-wide progress
/// request): the follower asks etcd for progress while any is registered.
pub(crate) struct ProgressWait(Arc<ProgressRequestor>);

impl Drop for ProgressWait {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The follower's side: when it last sent a `RequestProgress` and whether that one is
/// still unanswered, from which [`next`](Self::next) tells when the next may go out.
#[derive(Debug, Default)]
pub(crate) struct RequestSchedule {
    last_sent: Option<Instant>,
    outstanding: bool,
}

impl RequestSchedule {
    /// When the next `RequestProgress` may go out, if one is wanted: at once for a
    /// fresh read with nothing outstanding, else one `interval` after the last. None
    /// while no read waits or while progress answers are not `trusted`.
    pub(crate) fn next(
        &self,
        requestor: &ProgressRequestor,
        trusted: bool,
        interval: Duration,
    ) -> Option<Instant> {
        if requestor.waiting() == 0 || !trusted {
            return None;
        }
        match self.last_sent {
            None => Some(Instant::now()),
            Some(_) if requestor.fresh() && !self.outstanding => Some(Instant::now()),
            Some(sent) => Some(sent + interval),
        }
    }

    /// One was sent just now.
    pub(crate) fn sent(&mut self) {
        self.last_sent = Some(Instant::now());
        self.outstanding = true;
    }

    /// The answer came, or the stream it was sent on is gone.
    pub(crate) fn answered(&mut self) {
        self.outstanding = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_count_waiters_and_sends_clear_freshness() {
        let p = Arc::new(ProgressRequestor::default());
        assert_eq!(p.waiting(), 0);
        assert!(!p.fresh());
        let a = p.wait();
        let b = p.wait();
        assert_eq!(p.waiting(), 2);
        assert!(p.fresh());
        p.record_sent();
        assert!(!p.fresh(), "the request serves both");
        let c = p.wait();
        assert!(p.fresh(), "a later read needs a later request");
        drop((a, b, c));
        assert_eq!(p.waiting(), 0);
        assert_eq!(p.sent(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_schedule_sends_at_once_for_a_fresh_read_and_else_once_an_interval() {
        let p = Arc::new(ProgressRequestor::default());
        let mut s = RequestSchedule::default();
        let interval = Duration::from_millis(100);
        assert_eq!(s.next(&p, true, interval), None, "nothing waits");
        let a = p.wait();
        assert_eq!(s.next(&p, false, interval), None, "answers not trusted");
        assert_eq!(s.next(&p, true, interval), Some(Instant::now()), "first");
        p.record_sent();
        s.sent();
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(
            s.next(&p, true, interval),
            Some(sent + interval),
            "answered by it"
        );
        let b = p.wait();
        assert_eq!(
            s.next(&p, true, interval),
            Some(sent + interval),
            "a fresh read waits for the outstanding one"
        );
        s.answered();
        assert_eq!(
            s.next(&p, true, interval),
            Some(Instant::now()),
            "fresh, answered"
        );
        drop((a, b));
        assert_eq!(s.next(&p, true, interval), None);
    }
}
