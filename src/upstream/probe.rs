//! The revision probe: one linearizable round trip that learns the cluster's current
//! revision, shared by every caller that is waiting for one (group commit).
//!
//! A probe answers for a caller only if it was *sent after the caller asked*: then its
//! revision is at least that of every write that completed before the call. So callers
//! queue; a prober task takes the whole queue, sends one probe, answers everyone in it,
//! and repeats while callers keep arriving. Many concurrent consistent reads or
//! `watch()` calls cost etcd one probe per round trip instead of one each.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::error::Result;
use crate::key_range::KeyRange;
use crate::upstream::Upstream;

/// Callers waiting for the next probe; `running` while a prober task exists.
#[derive(Default)]
pub(crate) struct RevisionProbe {
    state: Mutex<ProbeState>,
}

#[derive(Default)]
struct ProbeState {
    waiting: Vec<oneshot::Sender<Option<i64>>>,
    running: bool,
}

impl RevisionProbe {
    /// The cluster's current revision, from a probe sent after this call.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped caller's answer is discarded.
    pub(crate) async fn current(
        self: &Arc<Self>,
        upstream: &Arc<dyn Upstream>,
        range: &KeyRange,
    ) -> Result<i64> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut st = self.state.lock();
            st.waiting.push(tx);
            !std::mem::replace(&mut st.running, true)
        };
        if start {
            tokio::spawn(self.clone().run(upstream.clone(), range.clone()));
        }
        match rx.await {
            Ok(Some(revision)) => Ok(revision),
            // The shared probe failed (or its task is gone): ask on our own, so that the
            // caller gets etcd's own error.
            _ => upstream.current_revision(range.clone()).await,
        }
    }

    async fn run(self: Arc<Self>, upstream: Arc<dyn Upstream>, range: KeyRange) {
        loop {
            let batch = {
                let mut st = self.state.lock();
                if st.waiting.is_empty() {
                    st.running = false;
                    return;
                }
                std::mem::take(&mut st.waiting)
            };
            // Sent after every caller in `batch` asked.
            let answer = upstream.current_revision(range.clone()).await.ok();
            for tx in batch {
                let _ = tx.send(answer);
            }
        }
    }
}
