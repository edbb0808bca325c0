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
                // Callers that gave up are dropped when the queue is full, before it would
                // grow: amortized O(1) a call. A scan at every call was O(n) with n callers
                // waiting, O(n^2) for a burst (a million watches from now registered at once
                // took minutes in benches/micro.rs).
                if st.waiting.len() == st.waiting.capacity() {
                    st.waiting.retain(|t| !t.is_closed());
                }
                st.waiting.push(tx);
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
