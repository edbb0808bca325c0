//! The order of the replies to creates and cancels on a stream served by two sides.
//!
//! etcd answers a stream's creates and cancels in the order it reads them. Here each side
//! answers its own in order (the cache, and etcd for the forwarded watches), but not in
//! step with the other, so the session keeps the order itself: one side at a time has
//! creates or cancels in flight (a request for the other side waits, [`Deferred`], with
//! everything after it), and a refusal the proxy gives at once waits behind the replies
//! to the creates before it.

use std::collections::VecDeque;

use super::id_map::release_drained;

use super::progress::Side;
use crate::pb::etcdserverpb::{WatchCreateRequest, WatchResponse};

/// A create or cancel of either side not answered yet, in the order of the requests,
/// with the refusals of the creates that came after it: they are sent after its reply,
/// so replies keep the order of the requests, as on etcd.
struct Unanswered {
    side: Side,
    then: Vec<WatchResponse>,
}

/// A request that waits until the other side has answered.
pub(crate) enum Deferred {
    Create(WatchCreateRequest),
    Cancel(i64),
    /// A progress request behind them: whether the stream has watches when etcd would
    /// read it is known only once they are made.
    Progress,
}

/// The unanswered requests of a stream, and the requests waiting behind them.
#[derive(Default)]
pub(crate) struct ReplyOrder {
    /// Every create and cancel not answered yet, of both sides, in order.
    unanswered: VecDeque<Unanswered>,
    /// Requests waiting until the other side has answered its own (each side answers
    /// its own in order; one side at a time keeps the replies in the requests' order).
    deferred: VecDeque<Deferred>,
}

impl ReplyOrder {
    /// A create or cancel was sent to `side`; its reply is awaited.
    pub(crate) fn sent(&mut self, side: Side) {
        self.unanswered.push_back(Unanswered {
            side,
            then: Vec::new(),
        });
    }

    /// Whether a request for `side` must wait: the other side has requests unanswered.
    pub(crate) fn must_wait(&self, side: Side) -> bool {
        self.unanswered.iter().any(|u| u.side != side)
    }

    /// A refusal to send after the replies to the requests before it: `Some` if it can
    /// go now, else it is kept until they are answered.
    pub(crate) fn after_earlier(&mut self, refusal: WatchResponse) -> Option<WatchResponse> {
        match self.unanswered.back_mut() {
            Some(u) => {
                u.then.push(refusal);
                None
            }
            None => Some(refusal),
        }
    }

    /// The first unanswered request of `side` was answered: the refusals that wait for
    /// it, if no earlier request is still unanswered (else they wait for that one).
    pub(crate) fn answered(&mut self, side: Side) -> Vec<WatchResponse> {
        let Some(at) = self.unanswered.iter().position(|u| u.side == side) else {
            return Vec::new();
        };
        let done = self.unanswered.remove(at).expect("found above");
        release_drained(&mut self.unanswered);
        match at.checked_sub(1).and_then(|i| self.unanswered.get_mut(i)) {
            Some(earlier) => {
                earlier.then.extend(done.then);
                Vec::new()
            }
            None => done.then,
        }
    }

    /// Whether requests wait (a new one queues behind them).
    pub(crate) fn waiting(&self) -> bool {
        !self.deferred.is_empty()
    }

    /// How many requests wait.
    pub(crate) fn waiting_len(&self) -> usize {
        self.deferred.len()
    }

    /// A request queues behind those waiting.
    pub(crate) fn defer(&mut self, request: Deferred) {
        self.deferred.push_back(request);
    }

    /// A request that must wait ahead of those waiting: the first to wait, or one taken
    /// from the queue that has to wait again (it goes back to the front).
    pub(crate) fn defer_again(&mut self, request: Deferred) {
        self.deferred.push_front(request);
    }

    /// The oldest waiting request.
    pub(crate) fn next_deferred(&mut self) -> Option<Deferred> {
        let next = self.deferred.pop_front();
        release_drained(&mut self.deferred);
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(reason: &str) -> WatchResponse {
        WatchResponse {
            cancel_reason: reason.into(),
            ..Default::default()
        }
    }

    fn reasons(resps: &[WatchResponse]) -> Vec<&str> {
        resps.iter().map(|r| r.cancel_reason.as_str()).collect()
    }

    #[test]
    fn a_refusal_waits_for_the_replies_before_it() {
        let mut order = ReplyOrder::default();
        // Nothing unanswered: a refusal goes at once.
        assert!(order.after_earlier(refusal("now")).is_some());
        order.sent(Side::Cache);
        order.sent(Side::Etcd);
        assert!(order.must_wait(Side::Cache) && order.must_wait(Side::Etcd));
        assert!(order.after_earlier(refusal("after etcd")).is_none());
        // etcd answers first: its refusals move behind the cache's create, still
        // unanswered.
        assert!(order.answered(Side::Etcd).is_empty());
        assert!(!order.must_wait(Side::Cache));
        assert_eq!(reasons(&order.answered(Side::Cache)), ["after etcd"]);
        assert!(order.answered(Side::Cache).is_empty());
    }

    #[test]
    fn deferred_requests_keep_their_order() {
        let mut order = ReplyOrder::default();
        assert!(!order.waiting());
        order.defer(Deferred::Cancel(1));
        order.defer(Deferred::Progress);
        let first = order.next_deferred().unwrap();
        assert!(matches!(first, Deferred::Cancel(1)));
        order.defer_again(first);
        assert_eq!(order.waiting_len(), 2);
        assert!(matches!(order.next_deferred(), Some(Deferred::Cancel(1))));
        assert!(matches!(order.next_deferred(), Some(Deferred::Progress)));
        assert!(order.next_deferred().is_none());
    }
}
