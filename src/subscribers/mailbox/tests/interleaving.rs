//! Every interleaving of the hand-over between the producer and a lagging consumer,
//! explored exhaustively over the real [`Subscribers`] registry, [`Mailbox`] and
//! [`History`] for small cases: the one place where a missed or doubled revision would
//! hide.
//!
//! ## The steps
//! Each step is one critical section of the production code, called as production
//! calls it:
//! - the producer (the follower's `Writer::apply`), per revision: *append* the batch to
//!   the history (`History::push`, under the history write lock, evicting beyond the
//!   window), then *dispatch* it (`LockedIndex::dispatch`: the filter's selection and
//!   `Mailbox::push`, under the mailbox lock; a full queue makes the subscriber
//!   lagging); after the last revision of a message, *publish* its revision;
//! - the registration (`Subscribers::register`, under the index lock, so between two
//!   messages, as the writer holds that lock for a whole message): from now, or from a
//!   start revision that is replayed from the history. Its first scan runs under the
//!   index lock and covers these small windows whole, so it is one step here; the
//!   scans a longer replay continues with after the lock are the consumer's scans,
//!   explored below with a bound of one batch;
//! - the consumer (`Mailbox::poll`, taken apart): *look* at the queue
//!   (`Mailbox::poll_queue`, under the mailbox lock: pop a delivery, see the end, or find
//!   it empty while lagging), and *scan* (`Mailbox::catch_up`, one bounded scan under
//!   the history read lock, the mailbox lock inside it), repeated while it says there
//!   is more, as `Mailbox::replay` repeats it. Scans of 1 batch and of 512 are both
//!   explored, so the bounded-scan path is covered although the windows are small.
//!
//! ## Why these are all the interleavings
//! Every access to the shared state (the history ring, the mailbox's queue, flag and
//! position, the lag count) happens inside one of these critical sections, and the
//! sections that touch the same state exclude each other: an append needs the history
//! write lock, which a scan excludes by holding the read lock for its whole length; a
//! dispatch and a look both need the mailbox lock; a scan takes the mailbox lock while
//! it holds the history read lock (the lock order: index, history, mailbox, so no
//! cycle). The lag count is changed only under the mailbox lock. The published
//! revision is one atomic value, written after a message's dispatches and read by a
//! look under the mailbox lock. Sections that touch disjoint state (an append and a
//! look) commute. So every real execution, on any
//! number of threads, is equivalent to a sequence of whole sections, and a search over
//! every order of the sections sees every behaviour. The gaps between sections, where
//! the real code holds no lock, are the points where the search lets the other side
//! move: between a look that found the queue empty and the scan it leads to, between
//! two scans, between an append and its dispatch.
//!
//! A look that finds nothing to do (empty queue, not lagging) changes nothing but the
//! waker, so the consumer is only moved when there is something to do; where it could
//! look and find nothing, its idle answer is checked instead (the published revision it
//! would claim). Two orders that reach the same state have the same futures, so each
//! state is expanded once and the number of distinct interleavings is counted on the
//! state graph.
//!
//! ## The cases and the checks
//! Capacity 1 and 2; 3-5 revisions (with revision gaps, some batches holding a
//! non-matching event beside the matching one), every subset of them matching the
//! filter; one revision per message or two; a window of 2 revisions (eviction, so
//! compaction) and, for 3 and 4 revisions, one that holds everything; scans of 1 batch
//! and of 512; the subscriber from now or from each of the first three revisions,
//! registered at every message boundary. In every interleaving the consumer must see
//! every revision it is owed exactly once, in order, with that revision's matching
//! events; an idle answer must claim only what it was delivered; it must end live (not
//! lagging, lag count 0) with nothing owed left, or compacted, and compacted only when
//! the next revision it was owed had left the window, or in the one case the mailbox
//! documents: the writer appended more than a whole scan between two scans of an
//! unfinished catch-up (found here with scans of one batch; it needs more than 512
//! appends in that gap in production).
//!
//! Run on 2,560 cases: 127,508 states, 9,414,220 distinct interleavings, in about 8 s
//! in a debug build. Each of these defects, put back, fails it: the producer keeping
//! the last queued revision as a lagging position; a catch-up stopping at the first
//! batch once full; no replay at registration; a push of a revision already queued; a
//! catch-up that goes live without covering the head.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::history::{Batch, History, SharedHistory};
use crate::key_range::{KeyRange, RangeSpec};
use crate::kv::{Event, EventType, KeyValue};
use crate::subscribers::filter::Filter;
use crate::subscribers::mailbox::{End, Mailbox, Polled, State};
use crate::subscribers::{Registered, Slot, SubId, Subscribers};

/// The revisions of a case: not consecutive (revisions outside the cache's prefix).
const REVISIONS: [i64; 5] = [11, 12, 14, 15, 17];
/// The history's revision before the first of them.
const BASE: i64 = 10;

fn event(key: &str, rev: i64) -> Event {
    Event::new(
        EventType::Put,
        KeyValue::new(key.to_owned(), format!("{key}{rev}"), rev, rev, 1, 0),
        None,
    )
}

fn filter() -> Filter {
    Filter::range(KeyRange::new(b"a", &RangeSpec::Prefix).unwrap())
}

/// One case.
struct Case {
    cap: usize,
    window: usize,
    scan: usize,
    start: i64,
    messages: Vec<Vec<i64>>,
    batches: BTreeMap<i64, Arc<Batch>>,
    matching: BTreeSet<i64>,
    steps: Vec<Step>,
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Append(i64),
    Dispatch(i64),
    Publish(i64),
}

impl Case {
    fn new(
        cap: usize,
        window: usize,
        scan: usize,
        start: i64,
        revisions: &[i64],
        matching: BTreeSet<i64>,
        per_message: usize,
    ) -> Case {
        let batches = revisions
            .iter()
            .map(|&r| {
                let events = match (matching.contains(&r), r % 2 == 1) {
                    (true, true) => vec![event("a", r), event("b", r)],
                    (true, false) => vec![event("a", r)],
                    (false, _) => vec![event("b", r)],
                };
                (r, Batch::new(r, events))
            })
            .collect();
        let messages: Vec<Vec<i64>> = revisions.chunks(per_message).map(<[i64]>::to_vec).collect();
        let mut steps = Vec::new();
        for m in &messages {
            for &r in m {
                steps.push(Step::Append(r));
                steps.push(Step::Dispatch(r));
            }
            steps.push(Step::Publish(*m.last().expect("non-empty")));
        }
        Case {
            cap,
            window,
            scan,
            start,
            messages,
            batches,
            matching,
            steps,
        }
    }

    fn describe(&self) -> String {
        format!(
            "capacity {}, window {}, scan {}, start {}, messages {:?}, matching {:?}",
            self.cap, self.window, self.scan, self.start, self.messages, self.matching
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Phase {
    /// The next consumer step is a look at the queue.
    Look,
    /// The last look found the queue empty while lagging: the next step is a scan.
    Scan,
}

struct Sub {
    id: SubId,
    mailbox: Arc<Mailbox>,
    _slot: Slot,
}

/// The state of one interleaving so far.
struct World<'c> {
    case: &'c Case,
    history: SharedHistory,
    subs: Subscribers,
    sub: Option<Sub>,
    /// Producer steps done.
    pc: usize,
    published: i64,
    phase: Phase,
    /// The first revision the subscriber is owed (once registered).
    owed_from: i64,
    last_seen: i64,
    /// Appends since the last scan that stopped at its bound (saturating at the bound
    /// + 1), while the catch-up is unfinished.
    since_bound: Option<usize>,
    /// Registered compacted, or delivered the compaction signal: nothing more to do.
    done: bool,
}

/// What identifies a state for the search (the history and the published revision
/// follow from `pc`).
#[derive(Debug, PartialEq, Eq, Hash)]
struct Key {
    pc: usize,
    registered: bool,
    queue: Vec<i64>,
    lagging: bool,
    last_rev: i64,
    end: Option<i64>,
    lag: usize,
    phase: Phase,
    last_seen: i64,
    since_bound: Option<usize>,
    done: bool,
}

#[derive(Debug, Clone, Copy)]
enum Move {
    Produce,
    Register,
    Consume,
}

#[derive(Debug, Default)]
struct Coverage {
    cases: u64,
    states: u64,
    interleavings: u128,
    deliveries: u64,
    idle_claims: u64,
    compacted: u64,
    compacted_at_registration: u64,
}

impl<'c> World<'c> {
    fn new(case: &'c Case) -> Self {
        let mut history = History::new(case.window, usize::MAX);
        history.reset(BASE);
        World {
            case,
            history: SharedHistory::for_test(history),
            subs: Subscribers::new(16, case.cap),
            sub: None,
            pc: 0,
            published: BASE,
            phase: Phase::Look,
            owed_from: 0,
            last_seen: 0,
            since_bound: None,
            done: false,
        }
    }

    /// A copy of this state to explore one move from.
    fn fork(&self) -> World<'c> {
        let mut history = History::new(self.case.window, usize::MAX);
        history.reset(BASE);
        for step in &self.case.steps[..self.pc] {
            if let Step::Append(r) = step {
                history.push(self.case.batches[r].clone(), false);
            }
        }
        let subs = Subscribers::new(16, self.case.cap);
        subs.lag
            .lagging
            .store(self.subs.lag.get(), Ordering::Relaxed);
        let sub = self.sub.as_ref().map(|s| {
            let st = s.mailbox.state.lock();
            let mailbox = Arc::new(Mailbox {
                filter: filter(),
                state: Mutex::new(State {
                    queue: st.queue.clone(),
                    cap: st.cap,
                    waker: None,
                    lagging: st.lagging,
                    last_rev: st.last_rev,
                    end: st.end.clone(),
                }),
            });
            subs.index.lock().insert(s.id, mailbox.clone());
            Sub {
                id: s.id,
                mailbox,
                _slot: subs.acquire(None).expect("a slot"),
            }
        });
        World {
            case: self.case,
            history: SharedHistory::for_test(history),
            subs,
            sub,
            pc: self.pc,
            published: self.published,
            phase: self.phase,
            owed_from: self.owed_from,
            last_seen: self.last_seen,
            since_bound: self.since_bound,
            done: self.done,
        }
    }

    fn key(&self) -> Key {
        let (queue, lagging, last_rev, end) = match &self.sub {
            Some(s) => {
                let st = s.mailbox.state.lock();
                let end = st.end.as_ref().map(|e| match e {
                    End::Compacted(c) => *c,
                    _ => -1,
                });
                (
                    st.queue.iter().map(|d| d.revision).collect(),
                    st.lagging,
                    st.last_rev,
                    end,
                )
            }
            None => (Vec::new(), false, 0, None),
        };
        Key {
            pc: self.pc,
            registered: self.sub.is_some(),
            queue,
            lagging,
            last_rev,
            end,
            lag: self.subs.lag.get(),
            phase: self.phase,
            last_seen: self.last_seen,
            since_bound: self.since_bound,
            done: self.done,
        }
    }

    /// The next revision the subscriber is owed and has not seen.
    fn next_owed(&self) -> Option<i64> {
        let from = self.owed_from.max(self.last_seen + 1);
        self.case.matching.range(from..).next().copied()
    }

    fn at_message_boundary(&self) -> bool {
        self.pc == 0 || matches!(self.case.steps[self.pc - 1], Step::Publish(_))
    }

    fn moves(&self) -> Vec<Move> {
        if self.done {
            return Vec::new();
        }
        let mut moves = Vec::new();
        if self.pc < self.case.steps.len() {
            moves.push(Move::Produce);
        }
        match &self.sub {
            None if self.at_message_boundary() => moves.push(Move::Register),
            None => {}
            Some(s) => {
                let st = s.mailbox.state.lock();
                let busy = !st.queue.is_empty() || st.lagging || st.end.is_some();
                if self.phase == Phase::Scan || busy {
                    moves.push(Move::Consume);
                }
            }
        }
        moves
    }

    fn apply(&mut self, m: Move) -> Result<(), String> {
        match m {
            Move::Produce => self.produce(),
            Move::Register => self.register()?,
            Move::Consume => match self.phase {
                Phase::Look => self.look()?,
                Phase::Scan => self.scan(),
            },
        }
        Ok(())
    }

    /// The writer's next step: append, dispatch or publish.
    fn produce(&mut self) {
        match self.case.steps[self.pc] {
            Step::Append(r) => {
                self.history
                    .write()
                    .push(self.case.batches[&r].clone(), false);
                let cap = self.case.scan + 1;
                self.since_bound = self.since_bound.map(|n| (n + 1).min(cap));
            }
            Step::Dispatch(r) => {
                let mut dispatcher = self.subs.lock();
                dispatcher.dispatch(&self.case.batches[&r]);
                dispatcher.take_wakers(&mut Vec::new());
            }
            Step::Publish(r) => self.published = r,
        }
        self.pc += 1;
    }

    /// The subscriber registers from the case's start.
    fn register(&mut self) -> Result<(), String> {
        let slot = self.subs.acquire(None).expect("a slot");
        let published = self.published;
        let registered = self
            .subs
            .register_as(
                self.subs.reserve_id(),
                filter(),
                self.case.start,
                0,
                &self.history,
                || published,
                &slot,
            )
            .map_err(|e| format!("registration failed: {e}"))?;
        match registered {
            Registered::Live {
                id,
                mailbox,
                position,
            } => {
                self.owed_from = if self.case.start == 0 {
                    position + 1
                } else {
                    self.case.start
                };
                self.last_seen = self.owed_from - 1;
                self.sub = Some(Sub {
                    id,
                    mailbox,
                    _slot: slot,
                });
            }
            Registered::Compacted { floor } => {
                if self.case.start >= floor {
                    return Err(format!(
                        "registered compacted at {floor} from start {}",
                        self.case.start
                    ));
                }
                self.done = true;
            }
        }
        Ok(())
    }

    /// The subscriber looks at its queue: a delivery must be the one owed next, a
    /// compaction only one the window forced.
    fn look(&mut self) -> Result<(), String> {
        let s = self.sub.as_ref().expect("registered");
        let published = self.published;
        let noop = futures_util::task::noop_waker_ref();
        match s.mailbox.poll_queue(noop, &|| published) {
            None => self.phase = Phase::Scan,
            Some(Polled::Delivery(d)) => {
                let owed = self.next_owed();
                if Some(d.revision) != owed {
                    return Err(format!(
                        "delivered {} after {}, but {owed:?} was owed next",
                        d.revision, self.last_seen
                    ));
                }
                if d.events.len() != 1 || d.events[0].key() != b"a" {
                    return Err(format!(
                        "delivery of {} is not its matching event: {:?}",
                        d.revision, d.events
                    ));
                }
                self.last_seen = d.revision;
            }
            Some(Polled::Ended(End::Compacted(c))) => {
                let owed = self.next_owed();
                let floor = self.history.read().floor();
                // The one compaction that may come while what is owed is
                // still in the window: the writer appended more than a
                // whole scan between two scans of an unfinished
                // catch-up, evicting batches no scan had read.
                let outrun = self.since_bound.is_some_and(|n| n > self.case.scan);
                if !(owed.is_some_and(|m| m < c) || outrun) || c > floor {
                    return Err(format!(
                        "compacted at {c} (floor {floor}) after {}, but {owed:?} was owed next",
                        self.last_seen
                    ));
                }
                self.done = true;
            }
            Some(other) => return Err(format!("a look with something to do gave {other:?}")),
        }
        Ok(())
    }

    /// The subscriber scans the history to catch up.
    fn scan(&mut self) {
        let s = self.sub.as_ref().expect("registered");
        let more = s
            .mailbox
            .catch_up(&self.history.read(), self.subs.lag(), self.case.scan);
        let compacted = s.mailbox.state.lock().end.is_some();
        if more {
            self.since_bound = Some(0);
        } else {
            // Kept when this scan compacted it: the look judges it.
            if !compacted {
                self.since_bound = None;
            }
            self.phase = Phase::Look;
        }
    }

    /// Checks that hold in every state.
    fn check_state(&self, cov: &mut Coverage) -> Result<(), String> {
        let Some(s) = &self.sub else {
            return Ok(());
        };
        let lagging = s.mailbox.state.lock().lagging;
        if self.subs.lag.get() != usize::from(lagging) {
            return Err(format!(
                "lag count {} for a subscriber that is lagging: {lagging}",
                self.subs.lag.get()
            ));
        }
        // Where the consumer could look and find nothing to do, the answer it would get
        // claims every owed revision up to the published one: it must have seen them.
        if !self.done && self.phase == Phase::Look && self.moves_consumer_idle(s) {
            let published = self.published;
            let noop = futures_util::task::noop_waker_ref();
            match s.mailbox.poll_queue(noop, &|| published) {
                Some(Polled::Idle { revision }) => {
                    cov.idle_claims += 1;
                    if let Some(m) = self.next_owed().filter(|&m| m <= revision) {
                        return Err(format!(
                            "idle at {revision} with {m} owed and not delivered"
                        ));
                    }
                }
                other => return Err(format!("an idle look gave {other:?}")),
            }
        }
        Ok(())
    }

    fn moves_consumer_idle(&self, s: &Sub) -> bool {
        let st = s.mailbox.state.lock();
        st.queue.is_empty() && !st.lagging && st.end.is_none()
    }

    /// Checks at the end of an interleaving.
    fn check_final(&self) -> Result<(), String> {
        if self.done {
            return Ok(());
        }
        let s = self.sub.as_ref().expect("registered by the end");
        let st = s.mailbox.state.lock();
        if st.lagging || self.subs.lag.get() != 0 || !st.queue.is_empty() {
            return Err(format!(
                "ended lagging {} with lag count {} and {} queued",
                st.lagging,
                self.subs.lag.get(),
                st.queue.len()
            ));
        }
        if let Some(m) = self.next_owed() {
            return Err(format!(
                "ended live after {} with {m} never delivered",
                self.last_seen
            ));
        }
        Ok(())
    }
}

/// Explores every move from `world`; returns the number of interleavings from it.
fn explore(
    world: World<'_>,
    memo: &mut HashMap<Key, u128>,
    cov: &mut Coverage,
) -> Result<u128, String> {
    let key = world.key();
    if let Some(&n) = memo.get(&key) {
        return Ok(n);
    }
    cov.states += 1;
    world.check_state(cov)?;
    let moves = world.moves();
    let mut paths = 0u128;
    if moves.is_empty() {
        world.check_final()?;
        if world.done {
            if world.sub.is_some() {
                cov.compacted += 1;
            } else {
                cov.compacted_at_registration += 1;
            }
        }
        paths = 1;
    }
    for m in moves {
        let mut next = world.fork();
        let before = next.key();
        next.apply(m)
            .map_err(|e| format!("{e}\n  after {m:?} from {before:?}"))?;
        if let Move::Consume = m {
            cov.deliveries += u64::from(next.last_seen != world.last_seen);
        }
        paths = paths.saturating_add(explore(next, memo, cov)?);
    }
    memo.insert(key, paths);
    Ok(paths)
}

/// Explores one case; a violation names the case and the state it was found in.
fn explore_case(case: &Case, cov: &mut Coverage) {
    let mut memo = HashMap::new();
    match explore(World::new(case), &mut memo, cov) {
        Ok(paths) => {
            cov.cases += 1;
            cov.interleavings = cov.interleavings.saturating_add(paths);
        }
        Err(e) => panic!("{}: {e}", case.describe()),
    }
}

#[test]
fn every_interleaving_of_push_and_catch_up_delivers_each_owed_revision_once_in_order() {
    let mut cov = Coverage::default();
    for n in 3..=5 {
        let revisions = &REVISIONS[..n];
        for pattern in 0u32..(1 << n) {
            let matching: BTreeSet<i64> = revisions
                .iter()
                .enumerate()
                .filter(|(i, _)| pattern & (1 << i) != 0)
                .map(|(_, &r)| r)
                .collect();
            // Five revisions only with the window that evicts (three and four cover the
            // one that holds everything), to keep the search to a few seconds.
            let windows: &[usize] = if n < 5 { &[2, n] } else { &[2] };
            for cap in [1, 2] {
                for &window in windows {
                    for scan in [1, 512] {
                        for per_message in [1, 2] {
                            for start in [0, revisions[0], revisions[1], revisions[2]] {
                                let case = Case::new(
                                    cap,
                                    window,
                                    scan,
                                    start,
                                    revisions,
                                    matching.clone(),
                                    per_message,
                                );
                                explore_case(&case, &mut cov);
                            }
                        }
                    }
                }
            }
        }
    }
    println!("INTERLEAVINGS | {cov:?}");
    assert!(
        cov.compacted > 0 && cov.compacted_at_registration > 0,
        "{cov:?}"
    );
    assert!(cov.deliveries > 0 && cov.idle_claims > 0, "{cov:?}");
}
