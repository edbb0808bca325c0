//! etcd's compaction, as the cache follows it (`CacheBuilder::follow_etcd_compaction`).
//!
//! The cache's window is its own: an etcd compaction does not shrink it, and etcd's
//! watch does not report one. But a caller must get what etcd would give it, so a read
//! or a watch at a revision etcd compacted is refused as etcd refuses it, with etcd's
//! compact revision. The cache asks ([`Compaction::check`]): one count-only read at the
//! revision (etcd refuses it when compacted), sent after the caller asked and shared
//! by every caller waiting meanwhile. A batch is checked at its lowest revision: if that
//! one is not compacted none is; if it is, a watch from it learns etcd's compact
//! revision, which answers each caller. What is learned raises the known floor
//! ([`Compaction::known_below`]), which serializable reads use without a round trip;
//! The follower's `keep_compaction_current` checks every [`CHECK_INTERVAL`] so that it is never older than
//! that, and a resume etcd refused as compacted raises it too.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::history::SharedHistory;
use crate::key_range::KeyRange;
use crate::upstream::Upstream;

/// How often the known floor is brought up to date in the background.
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// The highest revision etcd is known to have compacted, and the checks under way.
#[derive(Default)]
pub(crate) struct Compaction {
    floor: AtomicI64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Callers waiting for the next check, with their revisions.
    waiting: Vec<(i64, oneshot::Sender<Outcome>)>,
    /// A checker task is running.
    running: bool,
}

/// How a check ended: etcd answered (the floor was raised if it said compacted; etcd's
/// revision when it said readable, else 0), or why it did not.
type Outcome = std::result::Result<i64, Arc<Error>>;

/// What etcd says of a revision ([`Cache::check_compaction`](crate::Cache::check_compaction)).
///
/// ```
/// use etcd_cache::CompactionCheck;
/// let c = CompactionCheck::Readable { etcd_revision: 57 };
/// assert_eq!(c.compacted(), None);
/// assert_eq!(CompactionCheck::Compacted(49).compacted(), Some(49));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompactionCheck {
    /// etcd compacted it; the oldest revision etcd serves.
    Compacted(i64),
    /// etcd serves it. `etcd_revision` is etcd's revision when it said so (a
    /// linearizable read sent after the call, so at least every revision committed
    /// before it); 0 when it was not asked (revision 0, or beyond etcd's revision). A
    /// read at the revision answered with this header revision is one etcd could have
    /// given at that moment: a compaction that finishes later does not make it stale.
    Readable {
        /// etcd's revision when it answered (0: not asked).
        etcd_revision: i64,
    },
}

impl CompactionCheck {
    /// The compact revision when compacted.
    pub fn compacted(&self) -> Option<i64> {
        match self {
            CompactionCheck::Compacted(floor) => Some(*floor),
            CompactionCheck::Readable { .. } => None,
        }
    }
}

impl Compaction {
    /// `Some(compact revision)` when `revision` is below what etcd is known to have
    /// compacted (compaction never goes back, so this needs no round trip).
    pub(crate) fn known_below(&self, revision: i64) -> Option<i64> {
        let floor = self.floor.load(Ordering::Acquire);
        (revision > 0 && revision < floor).then_some(floor)
    }

    /// The compact revision known (0: none).
    pub(crate) fn known(&self) -> i64 {
        self.floor.load(Ordering::Acquire)
    }

    /// etcd compacted up to `revision`.
    pub(crate) fn raise(&self, revision: i64) {
        let old = self.floor.fetch_max(revision, Ordering::AcqRel);
        if revision > old {
            tracing::debug!(revision, "etcd's compaction floor");
        }
    }

    /// Whether etcd has compacted `revision`, asked after this call: `Some(etcd's
    /// compact revision)` if so. Shared with the callers waiting meanwhile.
    ///
    /// # Errors
    /// [`Error::Timeout`] after `limit`; [`Error::Transport`] naming etcd's error when
    /// the check failed.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped caller is left out of the next check.
    pub(crate) async fn check(
        self: &Arc<Self>,
        upstream: &Arc<dyn Upstream>,
        range: &KeyRange,
        revision: i64,
        limit: Duration,
    ) -> Result<Option<i64>> {
        Ok(self
            .check_at(upstream, range, revision, limit)
            .await?
            .compacted())
    }

    /// [`check`](Self::check), with etcd's revision when it said readable.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped caller is left out of the next check.
    pub(crate) async fn check_at(
        self: &Arc<Self>,
        upstream: &Arc<dyn Upstream>,
        range: &KeyRange,
        revision: i64,
        limit: Duration,
    ) -> Result<CompactionCheck> {
        if revision <= 0 {
            return Ok(CompactionCheck::Readable { etcd_revision: 0 });
        }
        if let Some(floor) = self.known_below(revision) {
            return Ok(CompactionCheck::Compacted(floor));
        }
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut st = self.state.lock();
            st.waiting.retain(|(_, t)| !t.is_closed());
            st.waiting.push((revision, tx));
            !std::mem::replace(&mut st.running, true)
        };
        if start {
            tokio::spawn(self.clone().run(upstream.clone(), range.clone(), limit));
        }
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(Ok(etcd_revision))) => Ok(match self.known_below(revision) {
                Some(floor) => CompactionCheck::Compacted(floor),
                None => CompactionCheck::Readable { etcd_revision },
            }),
            Ok(Ok(Err(e))) => Err(Error::Transport {
                reason: format!("etcd's compaction could not be checked: {e}"),
                source: None,
            }),
            // The checker was stopped: the runtime is shutting down.
            Ok(Err(_)) => Err(Error::Closed),
            Err(_) => Err(Error::timeout("etcd to answer a compaction check", limit)),
        }
    }

    async fn run(self: Arc<Self>, upstream: Arc<dyn Upstream>, range: KeyRange, limit: Duration) {
        loop {
            let batch = {
                let mut st = self.state.lock();
                st.waiting.retain(|(_, t)| !t.is_closed());
                if st.waiting.is_empty() {
                    st.running = false;
                    return;
                }
                std::mem::take(&mut st.waiting)
            };
            let lowest = batch.iter().map(|(r, _)| *r).min().unwrap_or(1);
            // Sent after every caller in `batch` asked; bounded, so a hung call ends.
            let outcome =
                match tokio::time::timeout(limit, upstream.compacted_at(range.clone(), lowest))
                    .await
                {
                    Ok(Ok(CompactionCheck::Compacted(floor))) => {
                        self.raise(floor);
                        // Below the floor: compacted (`check_at` sees the floor). At or
                        // above it, etcd was not asked about that revision: asked again
                        // in the next round, so that a readable answer carries etcd's
                        // revision (a read answered with a later header could be a state
                        // after a compaction that covers its revision).
                        let mut again = Vec::new();
                        for (r, tx) in batch {
                            if r < floor {
                                let _ = tx.send(Ok(0));
                            } else {
                                again.push((r, tx));
                            }
                        }
                        self.state.lock().waiting.extend(again);
                        continue;
                    }
                    Ok(Ok(CompactionCheck::Readable { etcd_revision })) => Ok(etcd_revision),
                    Ok(Err(e)) => Err(Arc::new(e)),
                    Err(_) => Err(Arc::new(Error::timeout(
                        "etcd to answer a compaction check",
                        limit,
                    ))),
                };
            for (_, tx) in batch {
                let _ = tx.send(outcome.clone());
            }
        }
    }
}

/// The compact revision a refusal below etcd's compaction at `floor` reports: the lowest
/// revision both etcd and the cache's window serve (the window's floor where that is
/// higher, for a revision below both).
pub(crate) fn reported(floor: i64, history: &SharedHistory) -> i64 {
    floor.max(history.read().floor())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::fake::FakeUpstream;
    use std::sync::atomic::Ordering::SeqCst;

    fn setup() -> (
        Arc<FakeUpstream>,
        Arc<dyn Upstream>,
        Arc<Compaction>,
        KeyRange,
    ) {
        let (fake, _watches) = FakeUpstream::new(&["3.6.0"], &[], 1);
        let up: Arc<dyn Upstream> = fake.clone();
        (fake, up, Arc::default(), KeyRange::for_prefix(b"/a/"))
    }

    #[tokio::test]
    async fn a_compacted_revision_is_refused_with_etcds_compact_revision() {
        let (fake, up, c, range) = setup();
        let limit = Duration::from_secs(1);
        assert_eq!(c.check(&up, &range, 3, limit).await.unwrap(), None);
        fake.compact(5);
        assert_eq!(c.check(&up, &range, 3, limit).await.unwrap(), Some(5));
        // At the compact revision and above etcd still answers.
        assert_eq!(c.check(&up, &range, 5, limit).await.unwrap(), None);
        assert_eq!(c.known(), 5);
        // Below what is known needs no round trip.
        let asked = fake.compaction_checks.load(SeqCst);
        assert_eq!(c.check(&up, &range, 4, limit).await.unwrap(), Some(5));
        assert_eq!(fake.compaction_checks.load(SeqCst), asked);
        assert_eq!(c.check(&up, &range, 0, limit).await.unwrap(), None);
    }

    /// A batch whose lowest revision etcd compacted: the waiters at or above etcd's
    /// floor are asked about again, so their readable answer carries etcd's revision
    /// (not 0, after which a reader would take a later header: robustness finding R2).
    #[tokio::test]
    async fn a_compacted_lowest_revision_does_not_answer_the_others_without_etcds_revision() {
        let (fake, up, c, range) = setup();
        fake.compact(10);
        fake.set_current_revision(50);
        let limit = Duration::from_secs(1);
        // Asked together, they share a batch whose lowest revision (3) is compacted.
        let (first, batch) = tokio::join!(
            c.check_at(&up, &range, 30, limit),
            futures_util::future::join_all([3, 12, 40].map(|r| {
                let (c, up, range) = (c.clone(), up.clone(), range.clone());
                async move { c.check_at(&up, &range, r, limit).await.unwrap() }
            }))
        );
        assert_eq!(
            first.unwrap(),
            CompactionCheck::Readable { etcd_revision: 50 }
        );
        assert_eq!(
            batch,
            [
                CompactionCheck::Compacted(10),
                CompactionCheck::Readable { etcd_revision: 50 },
                CompactionCheck::Readable { etcd_revision: 50 },
            ]
        );
    }

    #[tokio::test]
    async fn callers_waiting_together_share_one_check_at_their_lowest_revision() {
        let (fake, up, c, range) = setup();
        fake.compact(10);
        let limit = Duration::from_secs(1);
        let answers = futures_util::future::join_all([12, 3, 9, 10, 40].map(|r| {
            let (c, up, range) = (c.clone(), up.clone(), range.clone());
            async move { c.check(&up, &range, r, limit).await.unwrap() }
        }))
        .await;
        assert_eq!(answers, [None, Some(10), Some(10), None, None]);
        // The first caller's check went alone; the four that came while it ran shared one.
        assert!(
            fake.compaction_checks.load(SeqCst) <= 2,
            "{:?}",
            fake.compaction_checks
        );
    }
}
