//! The progress requestor: while (and only while) a read waits for the cache to reach a
//! revision, the upstream task sends `RequestProgress` at a fixed interval. One request
//! serves every waiting read; nothing is sent when nothing waits.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::Notify;

/// Shared between readers (who register) and the upstream task (who sends).
#[derive(Debug, Default)]
pub(crate) struct ProgressRequestor {
    waiting: AtomicUsize,
    pub(crate) wake: Notify,
    sent: AtomicU64,
}

impl ProgressRequestor {
    /// Registers a waiting read until the guard is dropped.
    pub(crate) fn wait(&self) -> WaitGuard<'_> {
        if self.waiting.fetch_add(1, Ordering::AcqRel) == 0 {
            self.wake.notify_one();
        }
        WaitGuard(self)
    }

    /// Number of reads waiting.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Counts one `RequestProgress` sent.
    pub(crate) fn record_sent(&self) {
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
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_count_waiters() {
        let p = ProgressRequestor::default();
        assert_eq!(p.waiting(), 0);
        let a = p.wait();
        let b = p.wait();
        assert_eq!(p.waiting(), 2);
        drop(a);
        drop(b);
        assert_eq!(p.waiting(), 0);
    }
}
