//! The progress requestor: while (and only while) a read waits for the cache to reach a
//! revision, the follower sends `RequestProgress` upstream. One request serves every
//! read that was waiting when it was sent; nothing is sent when nothing waits.
//!
//! When to send, decided by the follower from what is recorded here:
//! - at once, when a read started waiting since the last request was sent (it is
//!   *fresh*) and no request is outstanding: that read needs an answer sent after it
//!   asked, and one round trip gives it;
//! - otherwise at most once per `progress_request_interval`: a read that is still
//!   waiting after an answer needs events that have not happened yet (no answer can
//!   help it sooner), and an unanswered request may have been lost (etcd#17507).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use tokio::sync::Notify;

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
    /// Registers a waiting read until the guard is dropped.
    pub(crate) fn wait(&self) -> WaitGuard<'_> {
        self.enter();
        WaitGuard(self)
    }

    /// Registers a waiting read; [`leave`](Self::leave) unregisters it.
    pub(crate) fn enter(&self) {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        self.fresh.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Unregisters a read registered with [`enter`](Self::enter).
    pub(crate) fn leave(&self) {
        self.waiting.fetch_sub(1, Ordering::AcqRel);
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

/// A registered waiting read.
pub(crate) struct WaitGuard<'a>(&'a ProgressRequestor);

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_count_waiters_and_sends_clear_freshness() {
        let p = ProgressRequestor::default();
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
}
