//! Stream-level progress (`WatchProgressRequest`) on a Watch stream whose watches are
//! served by two sides: the cache, and etcd for the forwarded ones. Each side answers for
//! its own watches; the client gets one answer (watch id -1) that must hold for every
//! watch on the stream, as etcd's does:
//!
//! - **bookmarkable**: every event at or below the answer's revision R has been sent on
//!   the stream before it, for every watch: both sides have proven R (each side's answer
//!   comes after everything it had up to its revision);
//! - **ordered**: no event above R has been sent before it, for any watch (a client that
//!   resumes from a progress revision would otherwise get that event twice, and one that
//!   checks order sees the revision go back).
//!
//! Both sides keep sending while they are asked, so the two conditions are kept by
//! holding back: from the request on, responses with events above the request's *floor*
//! (the cache's revision when the request came, and at least everything sent so far
//! and the start of every watch of the stream: no answer goes below a watch's start,
//! etcd#20221) are held. A side's answer counts for a request once it is at or above the
//! floor; when both sides have such an answer, the held events up to R = the lower of
//! the two answers are sent, then the answer, then the rest. Each side has at most one
//! request in flight, and its answer counts for the client requests made before that
//! request was sent (an answer made before a client's request must not count for it: a
//! watch created in between may still be replaying). etcd answers a `RequestProgress`
//! at once or never: `progressIfSync` (3.5, 3.6, 3.7) drops it while a watch on the
//! stream is unsynced or starts above the current revision. So a request to etcd that is
//! not answered within [`ASK_TIMEOUT`] counts as dropped and etcd is asked again (the
//! cache answers every request, if need be with the revision it can prove; but not
//! below the start of a watch from a revision it has not reached: then once it has.
//! A request with a watch from beyond etcd's own revision, which etcd drops, never gets
//! here: `ahead.rs` drops it first, so what waits for the cache here is a start etcd
//! has reached and the cache soon will.)
//! A side whose answer is below a request's floor is asked again too. A client request
//! that is not answered within [`HOLD_LIMIT`] (or while more than [`HELD_LIMIT`]
//! responses wait) is given up: the held responses go out and that request gets no
//! answer, as etcd gives none to a request it cannot answer.
//!
//! The answer holds for the watches that were on the stream when it was asked for; a
//! watch created after the request may still be replaying. A watch that moves between
//! the sides while requests wait (caught up from etcd, or back to the cache) was on the
//! stream: the side it moved to answers again for them, after the move
//! ([`Progress::moved_to`]).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::id_map::{IdMap, IdSet};
use super::wire::WireResponse;

/// How long responses may be held for one progress request.
pub(crate) const HOLD_LIMIT: Duration = Duration::from_secs(5);
/// How many responses may be held before the oldest request is given up.
pub(crate) const HELD_LIMIT: usize = 4096;
/// How many times one side is asked again before its request is given up.
const RETRIES: u32 = 8;
/// How long a request to a side may stay unanswered before it counts as dropped (etcd
/// answers at once or never).
pub(crate) const ASK_TIMEOUT: Duration = Duration::from_secs(1);

/// The two sides of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Cache = 0,
    Etcd = 1,
}

/// What the session sends, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Item {
    /// A response of a watch.
    Resp(WireResponse),
    /// The stream-level progress answer at this revision.
    Progress(i64),
}

/// What the session must do after an input: send these, and ask each side this many
/// more times.
#[derive(Debug, Default)]
pub(crate) struct Out {
    pub(crate) items: Vec<Item>,
    pub(crate) ask: [u32; 2],
}

#[derive(Debug)]
struct Pending {
    /// Its place in the order of requests.
    seq: u64,
    floor: i64,
    /// The highest answer of each side at or above the floor (`i64::MAX`: that side has
    /// no watches to answer for; `None`: no answer recent enough yet).
    proven: [Option<i64>; 2],
    retries: u32,
    deadline: Instant,
}

impl Pending {
    fn answered(&self) -> bool {
        self.proven.iter().all(Option::is_some)
    }
}

/// The progress requests of one stream and the responses held for them.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    pending: VecDeque<Pending>,
    next_seq: u64,
    /// Per side, the request in flight: it covers the client requests below this `seq`
    /// (those made before it was sent), and when it was sent.
    asked: [Option<(u64, Instant)>; 2],
    held: VecDeque<WireResponse>,
    /// Watch ids with held responses (their later responses queue behind them).
    held_ids: IdMap<usize>,
    /// The highest revision sent on the stream: of an event, or of an answer.
    sent_max: i64,
}

impl Progress {
    /// The highest revision sent on the stream: of an event, or of an answer.
    pub(crate) fn sent_max(&self) -> i64 {
        self.sent_max
    }

    /// The floor of the oldest request: responses with events above it are held.
    fn bound(&self) -> Option<i64> {
        self.pending.front().map(|p| p.floor)
    }

    /// When [`expire`](Self::expire) has something to do: the oldest request is given
    /// up, or a request to a side counts as dropped.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let give_up = self.pending.front().map(|p| p.deadline);
        let etcd = self.asked[Side::Etcd as usize].map(|(_, at)| at + ASK_TIMEOUT);
        give_up.into_iter().chain(etcd).min()
    }

    /// A client's request. `floor`: the cache's revision now, or the start of a watch of
    /// the stream beyond it (raised to what was sent);
    /// `etcd`: the stream has forwarded watches. Asks the cache, and etcd if needed.
    pub(crate) fn request(&mut self, floor: i64, etcd: bool, now: Instant) -> Out {
        // Never below an earlier request's: responses are held above the oldest one's
        // floor only, so one above a later, lower floor could go out before that
        // request's answer (a watch from beyond the cache, which raised the earlier
        // floor, may have been canceled since).
        let earlier = self.pending.back().map_or(0, |p| p.floor);
        let floor = floor.max(self.sent_max).max(earlier);
        let seq = self.next_seq;
        tracing::trace!(
            seq,
            floor,
            sent = self.sent_max,
            etcd,
            "progress: requested"
        );
        self.next_seq += 1;
        self.pending.push_back(Pending {
            seq,
            floor,
            proven: [None, if etcd { None } else { Some(i64::MAX) }],
            retries: 0,
            deadline: now + HOLD_LIMIT,
        });
        Out {
            items: Vec::new(),
            ask: self.ask_needed(),
        }
    }

    /// Asks each side that has no request in flight and that a request waits for.
    fn ask_needed(&mut self) -> [u32; 2] {
        let mut ask = [0; 2];
        for (s, a) in ask.iter_mut().enumerate() {
            if self.asked[s].is_none() && self.pending.iter().any(|p| p.proven[s].is_none()) {
                self.asked[s] = Some((self.next_seq, Instant::now()));
                *a = 1;
            }
        }
        ask
    }

    /// Asks etcd for the proxy's own use (whether its watches away from the cache have
    /// caught up), unless a request to etcd is in flight already: its answer counts for
    /// the client requests made before it, as any. False if one was in flight.
    pub(crate) fn ask_etcd(&mut self, now: Instant) -> bool {
        let asked = &mut self.asked[Side::Etcd as usize];
        if asked.is_some() {
            return false;
        }
        *asked = Some((self.next_seq, now));
        true
    }

    /// A forwarded watch was created: requests that did not ask etcd (the stream had no
    /// forwarded watch then) ask it now, so that their held responses wait for etcd too.
    pub(crate) fn forwarded_created(&mut self) -> Out {
        let e = Side::Etcd as usize;
        for p in self.pending.iter_mut() {
            if p.proven[e] == Some(i64::MAX) {
                p.proven[e] = None;
            }
        }
        Out {
            items: Vec::new(),
            ask: self.ask_needed(),
        }
    }

    /// A watch of the stream moved to `side` (caught up from etcd, or back to the
    /// cache) while requests wait: it was on the stream when they were made, and an
    /// answer that side made before the move does not cover it (its events from the
    /// move on may still be on their way). So each waiting request needs an answer of
    /// that side made after the move: what it had is forgotten, a request to that side
    /// in flight counts for none of them, and the side is asked (again).
    pub(crate) fn moved_to(&mut self, side: Side) -> Out {
        let s = side as usize;
        let Some(oldest) = self.pending.front().map(|p| p.seq) else {
            return Out::default();
        };
        for p in self.pending.iter_mut() {
            p.proven[s] = None;
        }
        if let Some((covered, _)) = self.asked[s].as_mut() {
            // It covers the requests below `covered`: none of those waiting now.
            *covered = oldest;
        }
        Out {
            items: Vec::new(),
            ask: self.ask_needed(),
        }
    }

    /// The stream has no watch left on `side` (its last forwarded watch is gone): the
    /// waiting requests need no answer of it, and get the other side's.
    pub(crate) fn vacated(&mut self, side: Side) -> Out {
        let s = side as usize;
        for p in self.pending.iter_mut() {
            p.proven[s].get_or_insert(i64::MAX);
        }
        self.settle()
    }

    /// A side's answer (a stream-level progress response from the cache or from etcd).
    pub(crate) fn answer(&mut self, side: Side, revision: i64) -> Out {
        let s = side as usize;
        // Not asked for (e.g. the answer to a request given up after the side was asked
        // again): nothing waits for it.
        if let Some((covered, _)) = self.asked[s].take() {
            self.pending.retain_mut(|p| {
                if p.seq >= covered || p.proven[s].is_some() {
                    return true;
                }
                if revision >= p.floor {
                    p.proven[s] = Some(revision);
                    return true;
                }
                // Below the floor (the side could not prove more): asked again, a few
                // times.
                p.retries += 1;
                if p.retries > RETRIES {
                    tracing::debug!(
                        floor = p.floor,
                        ?side,
                        revision,
                        "progress request given up: answers stay below its floor"
                    );
                    return false;
                }
                true
            });
        }
        self.settle()
    }

    /// Whether response `r` goes out at once, as it does while no progress request
    /// waits (then it is counted as sent); otherwise it goes through
    /// [`push`](Self::push). Saves the per-response [`Out`] on the common path.
    pub(crate) fn sends_now(&mut self, r: &WireResponse) -> bool {
        if self.bound().is_some() {
            return false;
        }
        debug_assert!(self.held.is_empty());
        self.sent_max = self.sent_max.max(r.last_revision());
        true
    }

    /// A response of a watch: sent now, or held (and sent later, in order).
    pub(crate) fn push(&mut self, r: WireResponse) -> Out {
        let mut out = Out::default();
        let Some(bound) = self.bound() else {
            debug_assert!(self.held.is_empty());
            self.emit(&mut out, r);
            return out;
        };
        if self.held_ids.contains_key(&r.watch_id()) {
            self.hold(r);
        } else {
            let (low, high) = r.split(bound);
            if let Some(low) = low {
                self.emit(&mut out, low);
            }
            if let Some(high) = high {
                self.hold(high);
            }
        }
        if self.held.len() > HELD_LIMIT {
            tracing::debug!("progress request given up: too many responses held");
            self.pending.pop_front();
            let settled = self.settle();
            out.items.extend(settled.items);
            out.ask = settled.ask;
        }
        out
    }

    /// Gives up the requests whose time is over, and asks again a side whose request
    /// went unanswered (dropped).
    pub(crate) fn expire(&mut self, now: Instant) -> Out {
        while self.pending.front().is_some_and(|p| p.deadline <= now) {
            let p = self.pending.pop_front();
            tracing::debug!(?p, "progress request given up: not answered in time");
        }
        let etcd = &mut self.asked[Side::Etcd as usize];
        if etcd.is_some_and(|(_, at)| at + ASK_TIMEOUT <= now) {
            tracing::trace!("progress: no answer from etcd, asking again");
            *etcd = None;
        }
        self.settle()
    }

    fn hold(&mut self, r: WireResponse) {
        *self.held_ids.entry(r.watch_id()).or_default() += 1;
        self.held.push_back(r);
    }

    fn emit(&mut self, out: &mut Out, r: WireResponse) {
        self.sent_max = self.sent_max.max(r.last_revision());
        out.items.push(Item::Resp(r));
    }

    /// Answers the requests that can be answered, oldest first, sends the held
    /// responses the remaining ones allow, then asks each side they need.
    fn settle(&mut self) -> Out {
        let mut out = Out::default();
        while let Some(p) = self.pending.front().filter(|p| p.answered()) {
            let r = p.proven[0].unwrap_or(0).min(p.proven[1].unwrap_or(0));
            self.pending.pop_front();
            self.release(&mut out, Some(r));
            out.items.push(Item::Progress(r));
            self.sent_max = self.sent_max.max(r);
            self.raise_floors();
        }
        let bound = self.bound();
        self.release(&mut out, bound);
        out.ask = self.ask_needed();
        out
    }

    /// Raises the waiting requests' floors to what has been sent (an answer, and the
    /// events up to it, may have gone above a later request's floor): no answer goes
    /// back. A side's answer below a raised floor no longer counts (the side is asked
    /// again).
    fn raise_floors(&mut self) {
        let sent = self.sent_max;
        for p in self.pending.iter_mut().filter(|p| p.floor < sent) {
            p.floor = sent;
            for proven in &mut p.proven {
                if proven.is_some_and(|r| r < sent) {
                    *proven = None;
                }
            }
        }
    }

    /// Sends the held responses at or below `bound` (all with `None`), keeping each
    /// watch's responses in order.
    fn release(&mut self, out: &mut Out, bound: Option<i64>) {
        if self.held.is_empty() {
            return;
        }
        let mut keep = VecDeque::new();
        let mut blocked = IdSet::default();
        for r in std::mem::take(&mut self.held) {
            if blocked.contains(&r.watch_id()) {
                keep.push_back(r);
                continue;
            }
            let (low, high) = match bound {
                None => (Some(r), None),
                Some(b) => r.split(b),
            };
            if let Some(low) = low {
                self.emit(out, low);
            }
            if let Some(high) = high {
                blocked.insert(high.watch_id());
                keep.push_back(high);
            }
        }
        self.held_ids.clear();
        for r in &keep {
            *self.held_ids.entry(r.watch_id()).or_default() += 1;
        }
        self.held = keep;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::etcdserverpb::WatchResponse;
    use crate::pb::mvccpb::{Event, KeyValue};

    fn resp(watch_id: i64, revs: &[i64]) -> WireResponse {
        WireResponse::Message(WatchResponse {
            watch_id,
            events: revs
                .iter()
                .map(|&r| Event {
                    kv: Some(KeyValue {
                        key: bytes::Bytes::from(format!("k{r}")),
                        mod_revision: r,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
    }

    fn revs(items: &[Item]) -> Vec<(i64, Vec<i64>)> {
        items
            .iter()
            .map(|i| match i {
                Item::Resp(WireResponse::Message(r)) => (
                    r.watch_id,
                    r.events
                        .iter()
                        .map(|e| e.kv.as_ref().unwrap().mod_revision)
                        .collect(),
                ),
                Item::Resp(WireResponse::Events(_)) => unreachable!("messages only here"),
                Item::Progress(p) => (-1, vec![*p]),
            })
            .collect()
    }

    #[test]
    fn without_requests_a_response_goes_at_once() {
        let mut p = Progress::default();
        assert!(p.sends_now(&resp(1, &[5, 6])));
        assert_eq!(p.sent_max(), 6);
        p.request(6, false, Instant::now());
        assert!(
            !p.sends_now(&resp(1, &[7])),
            "a request waits: through push"
        );
        assert_eq!(p.sent_max(), 6);
    }

    #[test]
    fn without_requests_everything_passes() {
        let mut p = Progress::default();
        let out = p.push(resp(1, &[5, 6]));
        assert_eq!(revs(&out.items), [(1, vec![5, 6])]);
        assert_eq!(p.sent_max(), 6);
    }

    #[test]
    fn events_above_the_floor_wait_for_the_answer() {
        let mut p = Progress::default();
        let now = Instant::now();
        p.push(resp(1, &[10]));
        // Asked at etcd revision 12, with a forwarded watch.
        let out = p.request(12, true, now);
        assert_eq!(out.ask, [1, 1]);
        // The cache answers 12, then sends 13 for watch 1: held.
        assert!(p.answer(Side::Cache, 12).items.is_empty());
        assert!(p.push(resp(1, &[13])).items.is_empty());
        // etcd sends a batch 11..14 for watch 2: 11 and 12 go now, the rest waits.
        assert_eq!(
            revs(&p.push(resp(2, &[11, 12, 14])).items),
            [(2, vec![11, 12])]
        );
        // etcd answers 14: the answer is the lower, 12; then the held events follow.
        let out = p.answer(Side::Etcd, 14);
        assert_eq!(
            revs(&out.items),
            [(-1, vec![12]), (1, vec![13]), (2, vec![14])]
        );
    }

    #[test]
    fn a_side_that_answers_below_what_was_sent_is_asked_again() {
        let mut p = Progress::default();
        let now = Instant::now();
        p.push(resp(2, &[20]));
        // A floor below what was sent is raised to it.
        p.request(15, true, now);
        assert!(p.answer(Side::Etcd, 21).items.is_empty());
        // The cache proves only 18 (< 20 sent): asked again, nothing answered yet.
        let out = p.answer(Side::Cache, 18);
        assert!(out.items.is_empty());
        assert_eq!(out.ask, [1, 0]);
        let out = p.answer(Side::Cache, 21);
        assert_eq!(revs(&out.items), [(-1, vec![21])]);
    }

    /// The floor is the start of a watch of the stream beyond the cache (21, cache at
    /// 15): etcd's answer for the forwarded watches below it (a proxy upstream whose
    /// cache is behind) is not taken as the lower of the two, which would tell that
    /// watch a revision below its start (etcd#20221); etcd is asked again.
    #[test]
    fn an_answer_below_a_watchs_start_does_not_count() {
        let mut p = Progress::default();
        let now = Instant::now();
        assert_eq!(p.request(21, true, now).ask, [1, 1]);
        let out = p.answer(Side::Etcd, 18);
        assert!(out.items.is_empty());
        assert_eq!(out.ask, [0, 1], "etcd asked again");
        // Events up to the start are not held back.
        assert_eq!(revs(&p.push(resp(2, &[16, 21])).items), [(2, vec![16, 21])]);
        assert!(p.answer(Side::Cache, 21).items.is_empty());
        assert_eq!(revs(&p.answer(Side::Etcd, 22).items), [(-1, vec![21])]);
    }

    /// The proxy's own request to etcd takes the one slot: a client request made while
    /// it is in flight is not answered by it (its answer was made before that request),
    /// but asked again once it comes.
    #[test]
    fn the_proxys_own_ask_answers_no_later_client_request() {
        let mut p = Progress::default();
        let now = Instant::now();
        assert!(p.ask_etcd(now));
        assert!(!p.ask_etcd(now), "one in flight");
        assert_eq!(p.request(5, true, now).ask, [1, 0], "etcd's slot is taken");
        p.answer(Side::Cache, 5);
        let out = p.answer(Side::Etcd, 9);
        assert!(out.items.is_empty(), "made before the request");
        assert_eq!(out.ask, [0, 1]);
        assert_eq!(revs(&p.answer(Side::Etcd, 9).items), [(-1, vec![5])]);
        // With nothing pending, the answer is the proxy's alone.
        assert!(p.ask_etcd(now));
        let out = p.answer(Side::Etcd, 10);
        assert!(out.items.is_empty() && out.ask == [0, 0]);
    }

    #[test]
    fn a_forwarded_watch_created_meanwhile_makes_etcd_answer_too() {
        let mut p = Progress::default();
        let now = Instant::now();
        assert_eq!(p.request(5, false, now).ask, [1, 0]);
        assert_eq!(p.forwarded_created().ask, [0, 1]);
        assert!(p.answer(Side::Cache, 5).items.is_empty());
        assert_eq!(revs(&p.answer(Side::Etcd, 6).items), [(-1, vec![5])]);
    }

    /// A watch moved to the cache after the cache answered: that answer does not
    /// cover it, the cache is asked again, and the request is answered with the later
    /// answer.
    #[test]
    fn a_watch_moved_after_its_sides_answer_needs_a_later_one() {
        let mut p = Progress::default();
        let now = Instant::now();
        assert_eq!(p.request(10, true, now).ask, [1, 1]);
        assert!(p.answer(Side::Cache, 12).items.is_empty());
        assert_eq!(p.moved_to(Side::Cache).ask, [1, 0], "the cache asked again");
        assert!(
            p.answer(Side::Etcd, 15).items.is_empty(),
            "the cache's is missing"
        );
        assert_eq!(revs(&p.answer(Side::Cache, 13).items), [(-1, vec![13])]);
        // Nothing waits: a move asks nothing.
        assert_eq!(p.moved_to(Side::Etcd).ask, [0, 0]);
    }

    /// A watch moved to etcd while a request to etcd is in flight (sent before the
    /// move): its answer counts for none of the requests waiting then; etcd is asked
    /// again.
    #[test]
    fn a_request_in_flight_before_a_move_counts_for_none() {
        let mut p = Progress::default();
        let now = Instant::now();
        assert_eq!(p.request(10, true, now).ask, [1, 1]);
        assert_eq!(p.moved_to(Side::Etcd).ask, [0, 0], "one in flight already");
        assert!(p.answer(Side::Cache, 11).items.is_empty());
        let out = p.answer(Side::Etcd, 14);
        assert!(out.items.is_empty(), "made before the move");
        assert_eq!(out.ask, [0, 1]);
        assert_eq!(revs(&p.answer(Side::Etcd, 16).items), [(-1, vec![11])]);
    }

    /// The stream's last forwarded watch goes (back to the cache) while a request waits
    /// for etcd, which answers through a watch of its stream: the cache's answer is
    /// the answer.
    #[test]
    fn a_request_needs_no_answer_of_a_side_left_without_watches() {
        let mut p = Progress::default();
        let now = Instant::now();
        assert_eq!(p.request(10, true, now).ask, [1, 1]);
        assert!(p.answer(Side::Cache, 12).items.is_empty());
        assert_eq!(revs(&p.vacated(Side::Etcd).items), [(-1, vec![12])]);
        // Nothing waits: nothing to do.
        assert!(p.vacated(Side::Etcd).items.is_empty());
    }

    /// A later request's floor is never below an earlier one's: the first (a watch from
    /// 1014, beyond the cache's 983) lets events up to 1014 through while it waits;
    /// that watch canceled, the second's floor would be the cache's 983, and once the
    /// first is given up the second would be answered at 983 after an event at 985.
    #[test]
    fn a_later_request_never_gets_a_lower_floor() {
        let mut p = Progress::default();
        let now = Instant::now();
        let mut items = p.request(1014, true, now).items;
        items.extend(p.request(983, true, now).items);
        items.extend(p.push(resp(1, &[985])).items);
        for _ in 0..=RETRIES {
            items.extend(p.answer(Side::Cache, 983).items);
            items.extend(p.answer(Side::Etcd, 984).items);
        }
        assert_eq!(revs(&items), [(1, vec![985])], "no answer below the floor");
        assert_eq!(p.pending.len(), 0, "both given up");
    }

    /// An answer and the events up to it may go above a later request's floor: that
    /// floor is raised, and a side's answer below it no longer counts (here etcd's 11,
    /// which an upstream proxy may give after its 15: answers of different requests).
    #[test]
    fn no_answer_goes_back() {
        let mut p = Progress::default();
        let now = Instant::now();
        assert_eq!(p.request(10, true, now).ask, [1, 1]);
        assert_eq!(p.request(10, true, now).ask, [0, 0]);
        assert!(p.push(resp(1, &[12])).items.is_empty(), "held");
        assert_eq!(
            p.answer(Side::Etcd, 15).ask,
            [0, 1],
            "the second not covered"
        );
        assert!(p.answer(Side::Etcd, 11).items.is_empty());
        let out = p.answer(Side::Cache, 12);
        assert_eq!(revs(&out.items), [(1, vec![12]), (-1, vec![12])]);
        assert_eq!(
            out.ask,
            [1, 1],
            "the second asks both again: 11 is below 12 now"
        );
        assert!(p.answer(Side::Cache, 13).items.is_empty());
        assert_eq!(revs(&p.answer(Side::Etcd, 14).items), [(-1, vec![13])]);
    }

    #[test]
    fn an_unanswered_request_is_given_up_and_the_held_responses_go() {
        let mut p = Progress::default();
        let now = Instant::now();
        p.request(5, true, now);
        p.answer(Side::Cache, 5);
        assert!(p.push(resp(1, &[6])).items.is_empty());
        // A cancel of the same watch waits behind its events.
        let mut cancel = resp(1, &[]);
        if let WireResponse::Message(m) = &mut cancel {
            m.canceled = true;
        }
        assert!(p.push(cancel).items.is_empty());
        // The first deadline: etcd's request counts as dropped (and is asked again).
        assert!(p.deadline().unwrap() < now + HOLD_LIMIT);
        let out = p.expire(now + HOLD_LIMIT);
        assert_eq!(revs(&out.items), [(1, vec![6]), (1, vec![])]);
        assert_eq!(p.deadline(), None);
        // etcd's late answer is consumed, not sent.
        let out = p.answer(Side::Etcd, 9);
        assert!(out.items.is_empty());
        assert_eq!(out.ask, [0, 0]);
        assert!(p.pending.is_empty());
        // An answer nobody asked for is dropped.
        assert!(p.answer(Side::Cache, 9).items.is_empty());
        // A later request works as usual.
        p.request(9, false, now);
        assert_eq!(revs(&p.answer(Side::Cache, 9).items), [(-1, vec![9])]);
    }

    #[test]
    fn a_side_that_drops_the_request_is_asked_again() {
        let mut p = Progress::default();
        let now = Instant::now();
        assert_eq!(p.request(5, true, now).ask, [1, 1]);
        p.answer(Side::Cache, 5);
        // etcd dropped it (a watch that starts in the future): asked again after a while.
        let later = p.deadline().unwrap();
        assert!(later <= Instant::now() + ASK_TIMEOUT);
        let out = p.expire(later);
        assert_eq!(out.ask, [0, 1]);
        assert!(out.items.is_empty());
        assert_eq!(revs(&p.answer(Side::Etcd, 7).items), [(-1, vec![5])]);
        assert_eq!(p.deadline(), None);
    }

    #[test]
    fn requests_are_answered_in_order() {
        let mut p = Progress::default();
        let now = Instant::now();
        assert_eq!(p.request(5, false, now).ask, [1, 0]);
        // One request per side in flight: the second waits for the first answer.
        assert_eq!(p.request(7, false, now).ask, [0, 0]);
        let out = p.answer(Side::Cache, 5);
        assert_eq!(revs(&out.items), [(-1, vec![5])]);
        // That answer was made before the second request: the cache is asked again.
        assert_eq!(out.ask, [1, 0]);
        // Held against the second floor now.
        assert_eq!(revs(&p.push(resp(1, &[6, 8])).items), [(1, vec![6])]);
        assert_eq!(
            revs(&p.answer(Side::Cache, 8).items),
            [(1, vec![8]), (-1, vec![8])]
        );
    }
}
