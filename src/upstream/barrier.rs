//! The revision barrier: one linearizable round trip that learns the cluster's current
//! revision, shared by every caller that is waiting for one (group commit).
//!
//! A barrier read answers for a caller only if it was *sent after the caller asked*: then its
//! revision is at least that of every write that completed before the call. So callers
//! queue; a reader task takes the whole queue, sends one barrier read, answers everyone in it,
//! and repeats while callers keep arriving. Many concurrent consistent reads or
//! `watch()` calls cost etcd one barrier read per round trip instead of one each.
//!
//! A barrier read that hangs (a half-open connection to one endpoint) must not hold anyone
//! up: each barrier read is bounded by the caller's limit, and a caller whose barrier read has not
//! answered within [`HEDGE`] asks again, with a new barrier read sent at once beside the slow
//! one (which the client may send to another endpoint).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::Upstream;
use crate::error::{Error, Result};
use crate::key_range::KeyRange;

/// How long a barrier read may be outstanding before a caller stops waiting for it and
/// a new barrier read is sent.
pub(crate) const HEDGE: Duration = Duration::from_millis(250);

/// Callers waiting for the next barrier read, and the barrier reads in flight.
#[derive(Default)]
pub(crate) struct RevisionBarrier {
    state: Mutex<BarrierState>,
}

#[derive(Default)]
struct BarrierState {
    waiting: Vec<oneshot::Sender<Option<i64>>>,
    /// Prober tasks running.
    readers: usize,
    /// When the newest barrier read was sent.
    newest: Option<Instant>,
}

impl RevisionBarrier {
    /// The cluster's current revision, from a barrier read sent after this call, within
    /// `limit`.
    ///
    /// # Errors
    /// [`Error::Timeout`] after `limit`; etcd's own error if the barrier read fails.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped caller's answer is discarded.
    pub(crate) async fn current(
        self: &Arc<Self>,
        upstream: &Arc<dyn Upstream>,
        range: &KeyRange,
        limit: Duration,
    ) -> Result<i64> {
        let deadline = Instant::now() + limit;
        loop {
            let (tx, rx) = oneshot::channel();
            let start = {
                let mut st = self.state.lock();
                enqueue(&mut st.waiting, tx);
                let stale = st.newest.map_or(true, |t| t.elapsed() >= HEDGE);
                if st.readers == 0 || stale {
                    st.readers += 1;
                    st.newest = Some(Instant::now());
                    true
                } else {
                    false
                }
            };
            if start {
                tokio::spawn(self.clone().run(upstream.clone(), range.clone(), limit));
            }
            let wait_until = deadline.min(Instant::now() + HEDGE);
            match tokio::time::timeout_at(wait_until, rx).await {
                Ok(Ok(Some(revision))) => return Ok(revision),
                // The shared barrier read failed: ask on our own, so that the caller gets
                // etcd's own error.
                Ok(Ok(None)) | Ok(Err(_)) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    return tokio::time::timeout(left, upstream.current_revision(range.clone()))
                        .await
                        .map_err(|_| Error::timeout("etcd to report its revision", limit))?;
                }
                Err(_) if Instant::now() >= deadline => {
                    return Err(Error::timeout("etcd to report its revision", limit))
                }
                // Slow: ask again, with a fresh barrier read.
                Err(_) => {}
            }
        }
    }

    async fn run(self: Arc<Self>, upstream: Arc<dyn Upstream>, range: KeyRange, limit: Duration) {
        loop {
            let batch = {
                let mut st = self.state.lock();
                st.waiting.retain(|t| !t.is_closed());
                if st.waiting.is_empty() {
                    st.readers -= 1;
                    return;
                }
                st.newest = Some(Instant::now());
                std::mem::take(&mut st.waiting)
            };
            // Sent after every caller in `batch` asked; bounded, so a hung call ends.
            let answer = tokio::time::timeout(limit, upstream.current_revision(range.clone()))
                .await
                .ok()
                .and_then(|r| r.ok());
            for tx in batch {
                let _ = tx.send(answer);
            }
        }
    }
}

/// Queues a caller. Callers that gave up are dropped when the queue is full, before it
/// would grow, and the queue is then left at most half full, so that the next scan is as
/// many calls away as it holds: amortized O(1) a call. A scan at every call was O(n) with
/// n callers waiting, O(n^2) for a burst (a million watches from now registered at once
/// took minutes in benches/micro.rs). True when it scanned.
fn enqueue(
    waiting: &mut Vec<oneshot::Sender<Option<i64>>>,
    tx: oneshot::Sender<Option<i64>>,
) -> bool {
    let scan = waiting.len() == waiting.capacity();
    if scan {
        waiting.retain(|t| !t.is_closed());
        let live = waiting.len();
        waiting.reserve(live);
    }
    waiting.push(tx);
    scan
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst of callers costs a scan per doubling of the queue, not one per caller; and
    /// callers that gave up do not pile up.
    #[test]
    fn the_queue_is_scanned_once_per_doubling_and_drops_callers_that_gave_up() {
        let mut waiting = Vec::new();
        let mut receivers = Vec::new();
        let mut scans = 0;
        for _ in 0..100_000 {
            let (tx, rx) = oneshot::channel();
            receivers.push(rx);
            scans += usize::from(enqueue(&mut waiting, tx));
        }
        assert!(scans <= 20, "{scans} scans for 100,000 callers");
        // Every one of them gives up; the next burst reuses their room.
        drop(receivers);
        let cap = waiting.capacity();
        let mut live = Vec::new();
        for _ in 0..2 * cap {
            let (tx, rx) = oneshot::channel();
            live.push(rx);
            enqueue(&mut waiting, tx);
        }
        assert_eq!(
            waiting.len(),
            live.len(),
            "the callers that gave up were dropped"
        );
        assert!(
            waiting.capacity() <= 4 * cap,
            "{} > 4 x {cap}",
            waiting.capacity()
        );
    }
}
