//! Stream-level progress requests on a stream with a watch from a revision the proxy
//! has not reached. Fixed etcd (3.4.38, 3.5.22, 3.6.2 and later: `progressIfSync`,
//! etcd#20221) drops such a request while its own revision is below a watch's start;
//! 3.4.23 answers it below the start, which a client resuming from the answer takes as
//! a license to go back. Through the proxy it must be neither: the cache would answer
//! it only once it reached the start, and the session would hold the stream's other
//! responses meanwhile (`progress.rs`, up to its `HOLD_LIMIT`).
//!
//! So before such a request is taken, etcd's revision is asked for (one `Status`, the
//! member's revision, as the member that serves a watch decides by its own); a request
//! with a watch from beyond it is dropped at once, as fixed etcd drops it, and one
//! that etcd would answer is taken as any other. [`AheadChecks`] keeps at most one
//! such question in flight per stream: the requests that come while it is asked wait
//! for the next one (an answer read before a request must not decide it), so a client
//! that sends progress requests in a loop costs etcd one `Status` per round trip, not
//! one per request.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use super::id_map::IdMap;

/// Asks etcd's revision (`None` if it could not be learned).
pub(crate) type Ask = Arc<dyn Fn() -> BoxFuture<'static, Option<i64>> + Send + Sync>;

/// How many requests may wait for a check; more are dropped (a request etcd could not
/// answer at once gets no answer either).
pub(crate) const WAITING_LIMIT: usize = 4096;

/// How long the question may take before the requests it covers are taken as any
/// other (their answer then waits for the sides, as before this check).
pub(crate) const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// A stream's watches from a revision the proxy had not reached when they were created,
/// and the progress requests that wait for etcd's revision because of them.
#[derive(Default)]
pub(crate) struct Ahead {
    /// Their start revisions, by id (pruned once reached, or once the id names no watch).
    starts: IdMap<i64>,
    /// The requests waiting for etcd's revision (made on first use).
    checks: Option<AheadChecks>,
}

impl Ahead {
    /// A create (of either side) was taken under `id`, from `start`, while the proxy
    /// was at `revision`.
    pub(crate) fn created(&mut self, id: i64, start: i64, revision: i64) {
        if start > revision {
            self.starts.insert(id, start);
        } else {
            self.starts.remove(&id);
        }
    }

    /// The highest start of a watch of the stream from beyond `revision` (the proxy's
    /// now), if there is one. Forgets the starts reached and those of ids that name no
    /// watch (`in_use`).
    pub(crate) fn highest(&mut self, revision: i64, in_use: impl Fn(i64) -> bool) -> Option<i64> {
        if self.starts.is_empty() {
            return None;
        }
        self.starts
            .retain(|&id, &mut start| start > revision && in_use(id));
        self.starts.values().copied().max()
    }

    /// A progress request with a watch from `start`: etcd's revision is asked (`ask`
    /// makes the question on first use). False if too many wait already.
    pub(crate) fn check(&mut self, start: i64, ask: impl FnOnce() -> Ask) -> bool {
        self.checks
            .get_or_insert_with(|| AheadChecks::new(ask()))
            .add(start)
    }

    /// Whether a question is in flight.
    pub(crate) fn busy(&self) -> bool {
        self.checks.as_ref().is_some_and(AheadChecks::busy)
    }

    /// See [`AheadChecks::next`]; pending forever when nothing is asked.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub(crate) async fn next(&mut self) -> Checked {
        match self.checks.as_mut() {
            Some(checks) => checks.next().await,
            None => futures::future::pending().await,
        }
    }
}

/// The stream's progress requests that wait for etcd's revision, each with the highest
/// start of a watch of the stream the proxy had not reached when it came.
pub(crate) struct AheadChecks {
    ask: Ask,
    in_flight: Option<BoxFuture<'static, Option<i64>>>,
    /// The requests the question in flight decides.
    covered: Vec<i64>,
    /// The requests that came after it was asked.
    queued: Vec<i64>,
}

/// What a check decided: the requests it covered (their starts) and etcd's revision.
#[derive(Debug, PartialEq)]
pub(crate) struct Checked {
    pub(crate) starts: Vec<i64>,
    pub(crate) revision: Option<i64>,
}

impl Checked {
    /// Whether etcd drops a request with a watch from `start`, at the revision learned
    /// (never below `known`, a revision the cache has seen): fixed etcd's
    /// `rev < w.startRev`. Unknown: not dropped here.
    pub(crate) fn dropped(&self, start: i64, known: i64) -> bool {
        self.revision.is_some_and(|r| start > r.max(known))
    }
}

impl AheadChecks {
    pub(crate) fn new(ask: Ask) -> Self {
        AheadChecks {
            ask,
            in_flight: None,
            covered: Vec::new(),
            queued: Vec::new(),
        }
    }

    /// A request with a watch from `start`: asked now, or with the next question.
    /// False if too many wait already (the request is dropped).
    pub(crate) fn add(&mut self, start: i64) -> bool {
        if self.covered.len() + self.queued.len() >= WAITING_LIMIT {
            return false;
        }
        if self.in_flight.is_none() {
            self.covered.push(start);
            self.in_flight = Some((self.ask)());
        } else {
            self.queued.push(start);
        }
        true
    }

    /// Whether a question is in flight ([`next`](Self::next) has something to wait for).
    pub(crate) fn busy(&self) -> bool {
        self.in_flight.is_some()
    }

    /// The answer to the question in flight, for the requests it covers; the requests
    /// queued since are asked next. Pending forever when nothing is asked.
    ///
    /// # Cancel safety
    /// Cancel safe: the question stays in flight until it is answered.
    pub(crate) async fn next(&mut self) -> Checked {
        let Some(question) = self.in_flight.as_mut() else {
            return futures::future::pending().await;
        };
        let revision = question.await;
        self.in_flight = None;
        let starts = std::mem::replace(&mut self.covered, std::mem::take(&mut self.queued));
        if !self.covered.is_empty() {
            self.in_flight = Some((self.ask)());
        }
        Checked { starts, revision }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::mpsc;

    /// Questions answered from a channel, counted.
    fn scripted() -> (Ask, mpsc::UnboundedSender<Option<i64>>, Arc<AtomicUsize>) {
        let (tx, rx) = mpsc::unbounded_channel::<Option<i64>>();
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let asked = Arc::new(AtomicUsize::new(0));
        let count = asked.clone();
        let ask: Ask = Arc::new(move || {
            count.fetch_add(1, Ordering::SeqCst);
            let rx = rx.clone();
            async move { rx.lock().await.recv().await.flatten() }.boxed()
        });
        (ask, tx, asked)
    }

    #[tokio::test]
    async fn requests_during_a_question_wait_for_the_next_one() {
        let (ask, answer, asked) = scripted();
        let mut checks = AheadChecks::new(ask);
        assert!(!checks.busy());
        assert!(checks.next().now_or_never().is_none(), "nothing asked");
        assert!(checks.add(12));
        assert!(checks.add(14));
        assert!(checks.add(13));
        assert_eq!(asked.load(Ordering::SeqCst), 1, "one question in flight");
        // Not answered yet: pending, and still in flight after being polled.
        assert!(checks.next().now_or_never().is_none());
        assert!(checks.busy());
        answer.send(Some(12)).unwrap();
        let first = checks.next().await;
        assert_eq!(
            first,
            Checked {
                starts: vec![12],
                revision: Some(12)
            }
        );
        assert!(!first.dropped(12, 0), "etcd is at the start: answered");
        assert_eq!(
            asked.load(Ordering::SeqCst),
            2,
            "the queued ones asked anew"
        );
        answer.send(Some(13)).unwrap();
        let second = checks.next().await;
        assert_eq!(second.starts, vec![14, 13]);
        assert!(second.dropped(14, 0), "etcd below 14: dropped");
        assert!(!second.dropped(13, 0));
        assert!(!second.dropped(14, 14), "the cache has seen 14");
        assert!(!checks.busy());
        assert_eq!(asked.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_unknown_revision_drops_nothing_and_the_wait_is_bounded() {
        let (ask, answer, _) = scripted();
        let mut checks = AheadChecks::new(ask);
        assert!(checks.add(50));
        answer.send(None).unwrap();
        let checked = checks.next().await;
        assert!(!checked.dropped(50, 0), "etcd's revision unknown");
        for i in 0..WAITING_LIMIT {
            assert!(checks.add(i as i64 + 100), "request {i}");
        }
        assert!(!checks.add(1), "over the limit: dropped");
    }
}
