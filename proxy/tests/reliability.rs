//! The reliability checker (testkit's `reliability`, shared with the root crate) through
//! etcd-cache-proxy: every subscriber is a remote etcd-client watch through the proxy,
//! over several gRPC connections with many watches on each stream, checked against a
//! direct etcd watch from revision 1 for etcd's six watch guarantees (ordered, unique,
//! reliable, atomic, resumable, bookmarkable), prev_kv, filters and ranges, under the
//! faults: etcd kill -9 and restart, a proxy restart (SIGTERM, then started again on the
//! same port), and a cut between the proxy and etcd (testkit's `TcpProxy`: every
//! connection dropped, or traffic black-holed for a few seconds).
//!
//! When a stream breaks (the proxy restarted, or a forwarded watch's upstream stream
//! failed), each of its watches is created again on a new stream from its last
//! revision plus one, as clientv3 resumes; the checker records the resumption (`Resp::Resumed`) and
//! verifies that nothing is missing or repeated across it.
//!
//! Reads through the proxy (linearizable, serializable, and at a past revision) are
//! checked against the truth at the revision their header gives, and against etcd's own
//! answer there.
//!
//! The short test runs in the default `cargo test`; `proxy_reliability_soak` (ignored)
//! loops over the faults for `ETCD_CACHE_PROXY_SOAK_SECS` seconds (default 300). The seed
//! is printed; `ETCD_CACHE_SEED=<seed>` replays the operations.

mod support;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions, WatchResponse, WatchStream};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

use support::{EtcdOptions, EtcdServer, Proxy};
use testkit::reliability::checker::{
    check_get, check_sub, Class, End, Ev, GetRecord, Kv, Range, Resp, SubLog, SubSpec, Truth,
    TruthLog, Violation,
};
use testkit::reliability::run::{
    self, inside_key, make_spec, seed, writer, Counters, INSIDE_DIRS, PREFIX, SENTINEL,
};
use testkit::TcpProxy;

/// gRPC connections to the proxy (one etcd-client each).
const CONNS: usize = 4;
/// Watch streams per connection.
const STREAMS_PER_CONN: usize = 2;
/// Fixed watches per stream (more come and go with the churn).
const FIXED_PER_STREAM: usize = 5;
/// The proxy's `--history-window`.
const WINDOW: i64 = 512;
/// First client-chosen watch id (far from the ids the proxy picks).
const EXPLICIT_IDS: i64 = 1_000_000;

fn etcd_options() -> EtcdOptions {
    EtcdOptions::default().progress_notify_interval(Duration::from_millis(500))
}

fn rand_dur(rng: &mut StdRng, lo_ms: u64, hi_ms: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo_ms..=hi_ms))
}

/// A client of the proxies (every client-facing one: it fails over between them) with
/// short keep-alives (a dead proxy is noticed in ~2 s).
async fn proxy_client(endpoints: &[String]) -> Option<Client> {
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
        .with_keep_alive_while_idle(true);
    match timeout(
        Duration::from_secs(3),
        Client::connect(endpoints, Some(options)),
    )
    .await
    {
        Ok(Ok(c)) => Some(c),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------
// Remote subscribers
// ---------------------------------------------------------------------------------------

/// One remote watch, across the streams it lives on.
struct Remote {
    log: SubLog,
    /// A client-chosen watch id (kept when it is created again on a new stream).
    explicit_id: Option<i64>,
    fragment: bool,
    /// Its id on the current stream, once created there.
    id: Option<i64>,
    /// Created at least once (later creates are resumptions).
    created: bool,
    /// Stream-level progress requests sent on the current stream before its `created`
    /// arrived: an answer counts for it only if it answers a later request.
    created_seq: u64,
    /// The client's own position: every matching event up to here was delivered or
    /// promised by a progress response. A resumption starts at `covered + 1`.
    covered: i64,
    /// The highest header revision on the current stream.
    header: i64,
    /// Churn: cancelled after this many responses or at this time.
    life: Option<(usize, Instant)>,
    cancel_sent: bool,
    done: bool,
}

impl Remote {
    fn new(spec: SubSpec, rng: &mut StdRng) -> Remote {
        let life = (spec.class == Class::Churn).then(|| {
            (
                rng.random_range(1..60usize),
                Instant::now() + rand_dur(rng, 50, 4000),
            )
        });
        let explicit_id = rng.random_bool(0.4).then(|| EXPLICIT_IDS + spec.id as i64);
        Remote {
            covered: 0,
            log: SubLog {
                spec,
                responses: Vec::new(),
                end: End::Drained,
                last_header: 0,
                header_violations: Vec::new(),
            },
            explicit_id,
            fragment: rng.random_bool(0.3),
            id: None,
            created: false,
            created_seq: 0,
            header: 0,
            life,
            cancel_sent: false,
            done: false,
        }
    }

    fn spec(&self) -> &SubSpec {
        &self.log.spec
    }

    /// The create request: the original one, or a resumption from `covered + 1`.
    fn options(&self) -> etcd_client::WatchOptions {
        let start = if self.created {
            self.covered + 1
        } else {
            self.spec().start_revision
        };
        let mut o = self.spec().etcd_options(start);
        if let Some(id) = self.explicit_id {
            o = o.with_watch_id(id);
        }
        if self.fragment {
            o = o.with_fragment();
        }
        o
    }

    fn end(&mut self, end: End) {
        if !self.done {
            self.done = true;
            self.log.end = end;
        }
    }

    /// A churn watch whose life is over. In the final drain (to `target`), also one that
    /// starts after it: etcd answers no RequestProgress on a stream with a watch that
    /// starts above its revision (`progressIfSync`), so a forwarded one would keep the
    /// stream's drain from ever being answered.
    fn expired(&self, target: i64) -> bool {
        let future = target > 0 && self.spec().start_revision > target;
        self.life.is_some_and(|(msgs, until)| {
            future || self.log.responses.len() >= msgs || Instant::now() >= until
        })
    }

    fn check_header(&mut self, resp: &WatchResponse, min: i64) {
        let h = resp.header().map_or(0, |h| h.revision());
        if h < self.header || h < min {
            self.log.header_violations.push(format!(
                "header revision {h} after {} (events at {min})",
                self.header
            ));
        }
        self.header = self.header.max(h);
        self.log.last_header = self.log.last_header.max(h);
    }

    fn on_created(&mut self, resp: &WatchResponse) {
        self.check_header(resp, 0);
        self.id = Some(resp.watch_id());
        let rev = resp.header().map_or(0, |h| h.revision());
        if self.created {
            let from = self.covered + 1;
            self.log.responses.push(Resp::Resumed(from));
        } else {
            self.created = true;
            self.log.responses.push(Resp::Created(rev));
            self.covered = if self.spec().start_revision > 0 {
                self.spec().start_revision - 1
            } else {
                rev
            };
        }
    }

    fn on_progress(&mut self, rev: i64) {
        self.log.responses.push(Resp::Progress(rev));
        self.covered = self.covered.max(rev);
    }

    /// An events response; one response may carry several revisions (etcd batches
    /// them), each recorded on its own.
    fn on_events(&mut self, resp: &WatchResponse) {
        let evs: Vec<Ev> = resp.events().iter().map(Ev::from_etcd).collect();
        let last = evs.last().map_or(0, |e| e.kv.modr);
        self.check_header(resp, last);
        let mut i = 0;
        while i < evs.len() {
            let rev = evs[i].kv.modr;
            let j = i + evs[i..].iter().take_while(|e| e.kv.modr == rev).count();
            self.log
                .responses
                .push(Resp::Events(rev, evs[i..j].to_vec()));
            self.covered = self.covered.max(rev);
            i = j;
        }
    }
}

/// What every stream task shares.
#[derive(Clone)]
struct StreamCtx {
    endpoints: Vec<String>,
    /// etcd answers RequestProgress before its watches caught up (etcd#15220, before
    /// 3.4.25 and 3.5.8), and the proxy passes etcd's answer on for forwarded watches: then
    /// stream-level progress is asked for only in the final drain, when nothing replays.
    progress_untrusted: bool,
    drain: watch::Receiver<i64>,
    stats: Arc<Stats>,
    violations: Arc<Mutex<Vec<Violation>>>,
}

#[derive(Default)]
struct Stats {
    /// Streams that broke (ended or failed) while their watches were live.
    breaks: AtomicU64,
    /// New etcd-clients made because the old one could not open a stream.
    reconnects: AtomicU64,
    subscribers: AtomicU64,
    /// Stream-level progress answers received.
    progress_answers: AtomicU64,
}

/// Drives one gRPC Watch stream of one connection: its watches are created one at a time
/// (so each `created` belongs to the create in flight, whichever id the proxy picks),
/// stream-level progress is requested now and then, churn watches are cancelled when
/// their life is over, and when the stream breaks every live watch is created again on a
/// new one from its last revision + 1.
async fn stream_task(
    ctx: StreamCtx,
    mut client: Client,
    mut subs: Vec<Remote>,
    mut incoming: mpsc::UnboundedReceiver<Remote>,
    seed: u64,
) -> Vec<SubLog> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut drain = ctx.drain.clone();
    let mut failures = 0u32;
    let mut incoming_open = true;
    let mut drain_deadline: Option<Instant> = None;
    'session: loop {
        // Churn watches whose life ended while no stream was open are done.
        for s in subs
            .iter_mut()
            .filter(|s| !s.done && s.expired(*drain.borrow()))
        {
            s.end(End::Dropped);
        }
        for s in &mut subs {
            s.id = None;
            s.cancel_sent = false;
            s.header = 0;
        }
        let target = *drain.borrow();
        if target > 0 && drain_deadline.is_none() {
            drain_deadline = Some(Instant::now() + Duration::from_secs(45));
        }
        let mut pending: VecDeque<usize> = (0..subs.len()).filter(|&i| !subs[i].done).collect();
        let Some(first) = pending.pop_front() else {
            if target > 0 {
                return subs.into_iter().map(|s| s.log).collect();
            }
            tokio::select! {
                r = incoming.recv(), if incoming_open => match r {
                    Some(r) => subs.push(r),
                    None => incoming_open = false,
                },
                _ = drain.changed() => {}
            }
            continue 'session;
        };
        if drain_deadline.is_some_and(|d| Instant::now() >= d) {
            for s in &mut subs {
                s.end(End::DrainTimeout);
            }
            return subs.into_iter().map(|s| s.log).collect();
        }
        let key = subs[first].spec().key.clone();
        let opened = timeout(
            Duration::from_secs(5),
            client.watch(key, Some(subs[first].options())),
        )
        .await;
        let mut w: WatchStream = match opened {
            Ok(Ok(w)) => {
                failures = 0;
                w
            }
            _ => {
                failures += 1;
                if failures.is_multiple_of(10) {
                    if let Some(c) = proxy_client(&ctx.endpoints).await {
                        ctx.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                        client = c;
                    }
                }
                sleep(Duration::from_millis(rng.random_range(50..250))).await;
                continue 'session;
            }
        };
        let mut in_flight = Some(first);
        let mut by_id: HashMap<i64, usize> = HashMap::new();
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        let mut next_progress = Instant::now() + rand_dur(&mut rng, 300, 1500);
        let mut drain_asked: Option<Instant> = None;
        let mut last_create = Instant::now();
        let mut asks = Asks::default();
        loop {
            let step = tokio::select! {
                m = w.message() => Some(m),
                r = incoming.recv(), if incoming_open => {
                    match r {
                        Some(r) => {
                            subs.push(r);
                            pending.push_back(subs.len() - 1);
                        }
                        None => incoming_open = false,
                    }
                    None
                }
                _ = tick.tick() => None,
            };
            match step {
                Some(Ok(Some(resp))) => {
                    if let Some(done) =
                        on_response(&ctx, &mut subs, &mut by_id, &mut in_flight, &mut asks, resp)
                    {
                        // A stream-level progress response.
                        ctx.stats.progress_answers.fetch_add(1, Ordering::Relaxed);
                        let target = *drain.borrow();
                        // Every live watch is owed an answer that counts for it: a
                        // request may have been dropped (as etcd drops one while a
                        // watch starts beyond its revision), and then this answer may
                        // be to a later request than its count says; the next one is
                        // asked for at once.
                        let all_counted = subs.iter().all(|s| {
                            s.done
                                || s.id.is_none()
                                || s.cancel_sent
                                || s.created_seq < asks.answered
                        });
                        if target > 0
                            && done >= target
                            && all_counted
                            && in_flight.is_none()
                            && pending.is_empty()
                        {
                            for s in &mut subs {
                                let end = if s.cancel_sent {
                                    End::Dropped
                                } else {
                                    End::Drained
                                };
                                s.end(end);
                            }
                            return subs.into_iter().map(|s| s.log).collect();
                        }
                        drain_asked = None;
                    }
                }
                Some(_) => {
                    // The stream broke: every live watch resumes on a new one.
                    if subs.iter().any(|s| !s.done) {
                        ctx.stats.breaks.fetch_add(1, Ordering::Relaxed);
                    }
                    sleep(Duration::from_millis(rng.random_range(50..200))).await;
                    continue 'session;
                }
                None => {}
            }
            // The next create, once the one in flight is answered.
            if in_flight.is_none() {
                while let Some(i) = pending.pop_front() {
                    if subs[i].done {
                        continue;
                    }
                    if subs[i].expired(*drain.borrow()) {
                        subs[i].end(End::Dropped);
                        continue;
                    }
                    let key = subs[i].spec().key.clone();
                    if w.watch(key, Some(subs[i].options())).await.is_err() {
                        continue 'session;
                    }
                    last_create = Instant::now();
                    in_flight = Some(i);
                    break;
                }
            }
            // Churn watches whose life is over are cancelled.
            for s in subs.iter_mut() {
                if !s.done && !s.cancel_sent && s.expired(*drain.borrow()) {
                    if let Some(id) = s.id {
                        if w.cancel(id).await.is_err() {
                            continue 'session;
                        }
                        s.cancel_sent = true;
                    }
                }
            }
            let target = *drain.borrow();
            if target > 0 {
                let deadline =
                    *drain_deadline.get_or_insert(Instant::now() + Duration::from_secs(45));
                if Instant::now() >= deadline {
                    println!(
                        "proxy_reliability: a stream's drain to {target} timed out: {} progress requests, {} answers, the last at {}",
                        asks.sent, asks.answered, asks.last
                    );
                    for s in &mut subs {
                        s.end(End::DrainTimeout);
                    }
                    return subs.into_iter().map(|s| s.log).collect();
                }
                // Asked again when no answer came (the proxy gives up a request it
                // cannot answer, as etcd does).
                let quiet =
                    !ctx.progress_untrusted || last_create.elapsed() >= Duration::from_millis(500);
                let due = drain_asked.is_none_or(|at| at.elapsed() >= Duration::from_secs(3));
                if due && quiet && in_flight.is_none() && pending.is_empty() {
                    if w.request_progress().await.is_err() {
                        continue 'session;
                    }
                    asks.sent += 1;
                    drain_asked = Some(Instant::now());
                }
            } else if !ctx.progress_untrusted && Instant::now() >= next_progress {
                if w.request_progress().await.is_err() {
                    continue 'session;
                }
                asks.sent += 1;
                next_progress = Instant::now() + rand_dur(&mut rng, 300, 1500);
            }
        }
    }
}

/// The stream-level progress requests of one stream.
#[derive(Default)]
struct Asks {
    sent: u64,
    answered: u64,
    last: i64,
}

/// Records one response. Returns the revision of a stream-level progress response.
fn on_response(
    ctx: &StreamCtx,
    subs: &mut [Remote],
    by_id: &mut HashMap<i64, usize>,
    in_flight: &mut Option<usize>,
    asks: &mut Asks,
    resp: WatchResponse,
) -> Option<i64> {
    let harness = |detail: String| {
        ctx.violations.lock().push(Violation {
            guarantee: "harness",
            sub: None,
            detail,
        })
    };
    if resp.created() {
        let Some(i) = in_flight.take() else {
            harness(format!(
                "a `created` response with no create in flight: {resp:?}"
            ));
            return None;
        };
        let s = &mut subs[i];
        if resp.canceled() {
            // Refused: with a compaction, or an error.
            let end = if resp.compact_revision() > 0 {
                End::Compacted(resp.compact_revision())
            } else {
                End::Error(format!("create refused: {}", resp.cancel_reason()))
            };
            s.end(end);
            return None;
        }
        if let Some(id) = s.explicit_id {
            if resp.watch_id() != id {
                harness(format!(
                    "asked for watch id {id}, created {}",
                    resp.watch_id()
                ));
            }
        }
        s.on_created(&resp);
        s.created_seq = asks.sent;
        by_id.insert(resp.watch_id(), i);
        return None;
    }
    if resp.watch_id() == -1 && resp.events().is_empty() && !resp.canceled() {
        let rev = resp.header().map_or(0, |h| h.revision());
        // The n-th answer answers the n-th request or a later one (a request may go
        // unanswered, several may get one answer): it counts for the watches created
        // before the n-th request was sent.
        asks.answered += 1;
        asks.last = rev;
        for s in subs.iter_mut().filter(|s| s.created_seq < asks.answered) {
            // Only the watches created on this stream and not being cancelled: the
            // answer covers the stream's watches when it was made.
            // Its header is the lower of the cache's and etcd's answers when the stream
            // has forwarded watches, so it is not held to the watches' headers.
            if !s.done && s.id.is_some() && !s.cancel_sent {
                s.on_progress(rev);
            }
        }
        return Some(rev);
    }
    let Some(&i) = by_id.get(&resp.watch_id()) else {
        harness(format!(
            "a response for watch id {} that is not on the stream: {resp:?}",
            resp.watch_id()
        ));
        return None;
    };
    let s = &mut subs[i];
    if s.done {
        return None;
    }
    if resp.canceled() {
        by_id.remove(&resp.watch_id());
        let end = if s.cancel_sent {
            End::Dropped
        } else if resp.compact_revision() > 0 {
            End::Compacted(resp.compact_revision())
        } else {
            End::Error(format!("canceled: {}", resp.cancel_reason()))
        };
        // Events a cancel response carries still count.
        if !resp.events().is_empty() {
            s.on_events(&resp);
        }
        s.end(end);
        return None;
    }
    if resp.events().is_empty() {
        // A progress notification of this watch (progress_notify).
        s.check_header(&resp, 0);
        s.on_progress(resp.header().map_or(0, |h| h.revision()));
    } else {
        s.on_events(&resp);
    }
    None
}

/// A random subscriber: the reliability suite's shapes inside the cached prefix, and
/// some that the proxy forwards to etcd (from-key, all keys, a prefix outside).
fn proxy_spec(rng: &mut StdRng, id: usize, class: Class, head: i64) -> SubSpec {
    let floor = (head - WINDOW + 64).max(1);
    let mut spec = make_spec(rng, id, class, false, floor, head);
    match rng.random_range(0..10) {
        0 => {
            let start = INSIDE_DIRS[rng.random_range(0..INSIDE_DIRS.len())];
            spec.form = "from-key";
            spec.key = start.to_string();
            spec.range = Range::span(start.as_bytes(), b"\0");
        }
        1 => {
            spec.form = "range";
            spec.key = "\0".to_string();
            spec.range = Range::span(b"\0", b"\0");
        }
        2 => {
            spec.form = "prefix";
            spec.key = "/rem/".to_string();
            spec.range = Range::prefix(b"/rem/");
        }
        _ => {}
    }
    // Nothing the proxy does may end a fast watch with a compaction: etcd never
    // compacts here, and the proxy forwards what is below its window.
    spec.may_compact = false;
    spec
}

// ---------------------------------------------------------------------------------------
// Reads through the proxy
// ---------------------------------------------------------------------------------------

async fn reader(
    seed: u64,
    endpoints: Vec<String>,
    direct: Vec<String>,
    gets: Arc<Mutex<Vec<GetRecord>>>,
    counters: Arc<Counters>,
    mut stop: watch::Receiver<bool>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9e7);
    let mut via: Option<Client> = None;
    let mut etcd = run::connect(&direct).await;
    loop {
        tokio::select! {
            _ = sleep(rand_dur(&mut rng, 30, 150)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let Some(c) = via.as_mut() else {
            via = proxy_client(&endpoints).await;
            continue;
        };
        let (key, range, prefix) = match rng.random_range(0..3) {
            0 => (PREFIX.to_string(), Range::prefix(PREFIX.as_bytes()), true),
            1 => {
                let d = INSIDE_DIRS[rng.random_range(0..INSIDE_DIRS.len())];
                (d.to_string(), Range::prefix(d.as_bytes()), true)
            }
            _ => {
                let k = inside_key(&mut rng);
                (k.clone(), Range::single(k.as_bytes()), false)
            }
        };
        let limit = if rng.random_bool(0.3) {
            rng.random_range(1..5)
        } else {
            0
        };
        let head = counters.last_ack.load(Ordering::Relaxed);
        // 0: linearizable, 1: serializable, 2: serializable at a past revision.
        let mode = rng.random_range(0..3);
        let requested = if mode == 2 && head > 1 {
            rng.random_range((head - WINDOW).max(1)..=head)
        } else {
            0
        };
        let mut opts = GetOptions::new().with_limit(limit);
        let mut eopts = GetOptions::new().with_limit(limit);
        if prefix {
            opts = opts.with_range(range.end.clone());
            eopts = eopts.with_range(range.end.clone());
        }
        if mode > 0 {
            opts = opts.with_serializable();
        }
        if requested > 0 {
            opts = opts.with_revision(requested);
        }
        let min_rev = if mode == 0 { head } else { 0 };
        let resp = match timeout(Duration::from_secs(5), c.get(key.clone(), Some(opts))).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => {
                counters.gets_failed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Err(_) => {
                counters.gets_failed.fetch_add(1, Ordering::Relaxed);
                via = None;
                continue;
            }
        };
        counters.gets_ok.fetch_add(1, Ordering::Relaxed);
        let at = if requested > 0 {
            requested
        } else {
            resp.header().map_or(0, |h| h.revision())
        };
        let etcd_answer = run::etcd_answer(&mut etcd, key.clone(), eopts, at).await;
        gets.lock().push(GetRecord {
            range,
            requested,
            limit,
            at,
            kvs: resp.kvs().iter().map(Kv::from_etcd).collect(),
            count: resp.count(),
            more: resp.more(),
            etcd: etcd_answer,
            min_rev,
        });
    }
}

// ---------------------------------------------------------------------------------------
// One run
// ---------------------------------------------------------------------------------------

/// Faults injected, by kind.
#[derive(Default, Debug, Clone, Copy)]
struct Faults {
    etcd_kills: u64,
    proxy_restarts: u64,
    /// Client-facing proxies killed (SIGKILL), their clients moving to another.
    proxy_kills: u64,
    cuts: u64,
    blackholes: u64,
}

impl Faults {
    fn total(&self) -> u64 {
        self.etcd_kills + self.proxy_restarts + self.proxy_kills + self.cuts + self.blackholes
    }
}

#[derive(Debug, Default)]
struct Summary {
    seed: u64,
    revisions: i64,
    truth_events: u64,
    events_checked: u64,
    responses_checked: u64,
    subscribers: usize,
    dropped: usize,
    resumes: u64,
    breaks: u64,
    gets_checked: usize,
    faults: Faults,
    violations: usize,
    secs: f64,
}

/// Where the proxies stand between etcd and the clients.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Topology {
    /// One proxy.
    One,
    /// Two proxies side by side, each client on both (it fails over between them).
    Pair,
    /// A top proxy A in front of etcd, and two proxies B1, B2 following A; each client
    /// on both Bs.
    Tier,
}

struct World {
    etcd: Arc<std::sync::Mutex<EtcdServer>>,
    cut: TcpProxy,
    /// The client-facing proxies.
    proxies: Vec<Arc<std::sync::Mutex<Proxy>>>,
    /// The top of a tier (it follows etcd; the client-facing ones follow it).
    top: Option<Arc<std::sync::Mutex<Proxy>>>,
}

impl World {
    async fn kill_etcd(&self, rng: &mut StdRng) {
        let e = self.etcd.clone();
        testkit::blocking(move || e.lock().unwrap().kill()).await;
        sleep(rand_dur(rng, 200, 1500)).await;
        let e = self.etcd.clone();
        testkit::blocking(move || e.lock().unwrap().restart()).await;
    }

    /// Stops a proxy gracefully (SIGTERM) and starts it again: a client-facing one, or in
    /// a tier now and then the top one.
    async fn restart_proxy(&self, rng: &mut StdRng) {
        let p = match &self.top {
            Some(top) if rng.random_bool(0.5) => top.clone(),
            _ => self.proxies[rng.random_range(0..self.proxies.len())].clone(),
        };
        let q = p.clone();
        let (status, log) = testkit::blocking(move || {
            let mut p = q.lock().unwrap();
            let status = p.terminate(Duration::from_secs(15));
            (status, p.log_tail())
        })
        .await;
        assert!(
            status.is_some_and(|s| s.success()),
            "the proxy's graceful stop (SIGTERM) failed: {status:?}:\n{log}"
        );
        sleep(rand_dur(rng, 100, 1000)).await;
        testkit::blocking(move || p.lock().unwrap().start_again()).await;
    }

    /// Kills a client-facing proxy (SIGKILL; its clients move to another), and starts it
    /// again later.
    async fn kill_proxy(&self, rng: &mut StdRng) {
        let p = self.proxies[rng.random_range(0..self.proxies.len())].clone();
        let q = p.clone();
        testkit::blocking(move || q.lock().unwrap().kill()).await;
        sleep(rand_dur(rng, 500, 2500)).await;
        testkit::blocking(move || p.lock().unwrap().start_again()).await;
    }

    /// Every proxy's log tail and whole log, for a failure's report.
    fn logs(&self) -> (String, String) {
        let all: Vec<_> = self.top.iter().chain(&self.proxies).collect();
        let (mut tail, mut full) = (String::new(), String::new());
        for (i, p) in all.iter().enumerate() {
            let p = p.lock().unwrap();
            tail.push_str(&format!("--- proxy {i} ---\n{}\n", p.log_tail()));
            full.push_str(&format!("--- proxy {i} ---\n{}\n", p.log_text()));
        }
        (tail, full)
    }

    async fn blackhole(&self, rng: &mut StdRng) {
        self.cut.set_blackhole(true);
        sleep(rand_dur(rng, 1000, 3500)).await;
        self.cut.set_blackhole(false);
    }
}

async fn etcd_version(direct: &[String]) -> String {
    let mut c = run::connect(direct).await;
    c.status()
        .await
        .expect("etcd's status")
        .version()
        .to_string()
}

/// etcd answers RequestProgress while its watchers are still catching up before 3.4.25
/// and 3.5.8 (etcd#15220).
fn has_etcd_15220(version: &str) -> bool {
    let v: Vec<u32> = version.split('.').map(|p| p.parse().unwrap_or(0)).collect();
    matches!(v[..], [3, 4, p, ..] if p < 25)
        || matches!(v[..], [3, 5, p, ..] if p < 8)
        || matches!(v[..], [3, m, ..] if m < 4)
}

/// What a run does to the world while the workload runs.
enum Plan {
    /// Each fault once or twice, in a fixed order with random timing (the short test).
    EachOnce,
    /// Random faults until the time is up (the soak).
    Random(Duration),
}

async fn run(seed: u64, plan: Plan, topology: Topology) -> Summary {
    let started = Instant::now();
    println!("proxy_reliability: seed {seed} (replay with ETCD_CACHE_SEED={seed})");
    let etcd = testkit::blocking(|| EtcdServer::start_with(etcd_options())).await;
    let direct = vec![etcd.endpoint()];
    let cut = TcpProxy::start(etcd.client_addr()).await;
    let cut_ep = cut.endpoint();
    let start = |upstream: String| {
        testkit::blocking(move || {
            let window = WINDOW.to_string();
            let p = Proxy::start(
                &upstream,
                &[
                    "--prefix",
                    PREFIX,
                    "--history-window",
                    &window,
                    "--progress-notify-interval",
                    "500ms",
                    "--shutdown-timeout",
                    "5s",
                ],
            );
            Arc::new(std::sync::Mutex::new(p))
        })
    };
    let (top, proxies) = match topology {
        Topology::One => (None, vec![start(cut_ep).await]),
        Topology::Pair => (None, vec![start(cut_ep.clone()).await, start(cut_ep).await]),
        Topology::Tier => {
            let top = start(cut_ep).await;
            let above = top.lock().unwrap().endpoint();
            (
                Some(top),
                vec![start(above.clone()).await, start(above).await],
            )
        }
    };
    let endpoints: Vec<String> = proxies
        .iter()
        .map(|p| p.lock().unwrap().endpoint())
        .collect();
    println!("proxy_reliability: {topology:?}: clients on {endpoints:?}");
    let world = World {
        etcd: Arc::new(std::sync::Mutex::new(etcd)),
        cut,
        proxies,
        top,
    };

    let direct_shared = Arc::new(Mutex::new(direct.clone()));
    let truth = Truth::start(direct_shared.clone());
    let counters = Arc::new(Counters::default());
    let violations = Arc::new(Mutex::new(Vec::new()));
    let stats = Arc::new(Stats::default());
    let (stop, stop_rx) = watch::channel(false);
    let (drain, drain_rx) = watch::channel(0i64);
    let mut tasks: Vec<JoinHandle<()>> = Vec::new();
    tasks.push(tokio::spawn(writer(
        seed,
        direct_shared.clone(),
        Duration::from_millis(8),
        counters.clone(),
        stop_rx.clone(),
    )));
    let gets = Arc::new(Mutex::new(Vec::new()));
    tasks.push(tokio::spawn(reader(
        seed,
        endpoints.clone(),
        direct.clone(),
        gets.clone(),
        counters.clone(),
        stop_rx.clone(),
    )));
    sleep(Duration::from_millis(500)).await;

    // The streams: CONNS connections, STREAMS_PER_CONN streams each.
    let version = etcd_version(&direct).await;
    let progress_untrusted = has_etcd_15220(&version);
    println!(
        "proxy_reliability: etcd {version}{}",
        if progress_untrusted {
            " (etcd#15220: stream-level progress only in the final drain)"
        } else {
            ""
        }
    );
    let ctx = StreamCtx {
        endpoints: endpoints.clone(),
        progress_untrusted,
        drain: drain_rx,
        stats: stats.clone(),
        violations: violations.clone(),
    };
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eb5);
    let mut next_id = 0usize;
    let mut streams = Vec::new();
    let mut senders = Vec::new();
    for conn in 0..CONNS {
        let client = proxy_client(&endpoints)
            .await
            .expect("a client of the proxy");
        for k in 0..STREAMS_PER_CONN {
            let head = counters.last_ack.load(Ordering::Relaxed);
            let subs: Vec<Remote> = (0..FIXED_PER_STREAM)
                .map(|_| {
                    next_id += 1;
                    let spec = proxy_spec(&mut rng, next_id, Class::Fast, head);
                    Remote::new(spec, &mut rng)
                })
                .collect();
            stats
                .subscribers
                .fetch_add(subs.len() as u64, Ordering::Relaxed);
            let (tx, rx) = mpsc::unbounded_channel();
            senders.push(tx);
            let stream_seed = seed ^ ((conn * 16 + k) as u64) << 8;
            streams.push(tokio::spawn(stream_task(
                ctx.clone(),
                client.clone(),
                subs,
                rx,
                stream_seed,
            )));
        }
    }
    // The churn: a new watch on a random stream every ~150 ms, from now, from inside or
    // just below the window, or from the future.
    {
        let counters = counters.clone();
        let stats = stats.clone();
        let mut stop = stop_rx.clone();
        let mut id = next_id;
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed ^ 0xc4);
            loop {
                tokio::select! {
                    _ = sleep(rand_dur(&mut rng, 30, 270)) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                id += 1;
                let head = counters.last_ack.load(Ordering::Relaxed);
                let spec = proxy_spec(&mut rng, id, Class::Churn, head);
                let r = Remote::new(spec, &mut rng);
                stats.subscribers.fetch_add(1, Ordering::Relaxed);
                let _ = senders[rng.random_range(0..senders.len())].send(r);
            }
        }));
    }

    // The faults.
    let mut faults = Faults::default();
    let mut frng = StdRng::seed_from_u64(seed ^ 0xfa17);
    sleep(Duration::from_secs(2)).await;
    match plan {
        Plan::EachOnce => {
            let gap = |rng: &mut StdRng| rand_dur(rng, 1500, 3000);
            world.cut.drop_all_connections();
            faults.cuts += 1;
            sleep(gap(&mut frng)).await;
            world.blackhole(&mut frng).await;
            faults.blackholes += 1;
            sleep(gap(&mut frng)).await;
            world.kill_etcd(&mut frng).await;
            faults.etcd_kills += 1;
            sleep(gap(&mut frng)).await;
            world.restart_proxy(&mut frng).await;
            faults.proxy_restarts += 1;
            sleep(gap(&mut frng)).await;
            world.cut.drop_all_connections();
            faults.cuts += 1;
            sleep(gap(&mut frng)).await;
            world.restart_proxy(&mut frng).await;
            faults.proxy_restarts += 1;
            sleep(gap(&mut frng)).await;
            if topology != Topology::One {
                world.kill_proxy(&mut frng).await;
                faults.proxy_kills += 1;
                sleep(gap(&mut frng)).await;
            }
        }
        Plan::Random(dur) => {
            let end = Instant::now() + dur;
            while Instant::now() < end {
                match frng.random_range(0..5) {
                    4 if topology != Topology::One => {
                        world.kill_proxy(&mut frng).await;
                        faults.proxy_kills += 1;
                    }
                    0 => {
                        world.kill_etcd(&mut frng).await;
                        faults.etcd_kills += 1;
                    }
                    1 => {
                        world.restart_proxy(&mut frng).await;
                        faults.proxy_restarts += 1;
                    }
                    2 => {
                        world.cut.drop_all_connections();
                        faults.cuts += 1;
                    }
                    _ => {
                        world.blackhole(&mut frng).await;
                        faults.blackholes += 1;
                    }
                }
                sleep(rand_dur(&mut frng, 1000, 4000)).await;
            }
        }
    }
    println!("proxy_reliability: faults {faults:?}");

    // Stop the workload, write the sentinel, drain every stream to it.
    let _ = stop.send(true);
    for t in tasks {
        let _ = timeout(Duration::from_secs(20), t).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let sentinel_rev = loop {
        let mut c = run::connect(&direct).await;
        if let Ok(Ok(r)) = timeout(
            Duration::from_secs(3),
            c.put(SENTINEL, seed.to_string(), None),
        )
        .await
        {
            break r.header().unwrap().revision();
        }
        assert!(Instant::now() < deadline, "cannot write the sentinel");
    };
    truth.wait_for(sentinel_rev, Duration::from_secs(30)).await;
    let _ = drain.send(sentinel_rev);
    let mut logs = Vec::new();
    for h in streams {
        match timeout(Duration::from_secs(60), h).await {
            Ok(Ok(l)) => logs.extend(l),
            Ok(Err(e)) => violations.lock().push(Violation {
                guarantee: "harness",
                sub: None,
                detail: format!("stream task panicked: {e}"),
            }),
            Err(_) => violations.lock().push(Violation {
                guarantee: "resumable",
                sub: None,
                detail: "a stream task did not finish its drain".into(),
            }),
        }
    }
    let log = truth.stop().await;
    let truth: TruthLog = std::mem::take(&mut *log.lock());
    if let Some(lost) = &truth.lost {
        panic!("seed {seed}: ground truth lost: {lost}");
    }
    let mut out = std::mem::take(&mut *violations.lock());
    let mut summary = Summary {
        seed,
        revisions: sentinel_rev,
        truth_events: truth.events.values().map(|v| v.len() as u64).sum(),
        subscribers: logs.len(),
        faults,
        breaks: stats.breaks.load(Ordering::Relaxed),
        ..Summary::default()
    };
    for l in &logs {
        let c = check_sub(l, &truth, sentinel_rev, &mut out);
        summary.events_checked += c.events;
        summary.responses_checked += c.responses;
        summary.resumes += c.resumes;
        if l.end == End::Dropped {
            summary.dropped += 1;
        }
    }
    let gets = gets.lock().clone();
    for g in &gets {
        check_get(g, &truth, &mut out);
    }
    summary.gets_checked = gets.len();
    summary.violations = out.len();
    summary.secs = started.elapsed().as_secs_f64();
    println!(
        "RELIABILITY | proxy | seed {} | revisions {} | truth events {} | events checked {} | responses {} | subscribers {} (dropped by churn {}) over {CONNS} connections x {STREAMS_PER_CONN} streams | resumptions {} after {} stream breaks | gets {} | faults {} ({} etcd kill -9, {} proxy restarts, {} proxy kill -9, {} cuts, {} blackholes) | violations {} | {:.1} s",
        summary.seed, summary.revisions, summary.truth_events, summary.events_checked,
        summary.responses_checked, summary.subscribers, summary.dropped, summary.resumes,
        summary.breaks, summary.gets_checked, summary.faults.total(), faults.etcd_kills,
        faults.proxy_restarts, faults.proxy_kills, faults.cuts, faults.blackholes, summary.violations, summary.secs
    );
    println!(
        "proxy_reliability: writes ok {} failed {}; gets ok {} failed {}; stream-level progress answers {}; client reconnects {}; truth resumes {}",
        counters.writes_ok.load(Ordering::Relaxed),
        counters.writes_failed.load(Ordering::Relaxed),
        counters.gets_ok.load(Ordering::Relaxed),
        counters.gets_failed.load(Ordering::Relaxed),
        stats.progress_answers.load(Ordering::Relaxed),
        stats.reconnects.load(Ordering::Relaxed),
        truth.resumes,
    );
    if !out.is_empty() {
        let (log, full) = world.logs();
        let path = std::env::temp_dir().join(format!("proxy-reliability-{seed}.log"));
        let _ = std::fs::write(&path, full);
        let mut msg = format!(
            "proxy_reliability: {} violation(s); replay with ETCD_CACHE_SEED={seed}\n",
            out.len()
        );
        for v in out.iter().take(40) {
            msg.push_str(&format!("  {v}\n"));
        }
        msg.push_str(&format!(
            "proxy log tail (all of it in {}):\n{log}\n",
            path.display()
        ));
        panic!("{msg}");
    }
    drop(world);
    summary
}

/// The short form: each fault at least once (a cut twice, a proxy restart twice) in
/// about 20 s of workload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_watches_through_the_proxy_keep_the_six_guarantees_under_faults() {
    testkit::init_tracing();
    let s = testkit::bounded(
        Duration::from_secs(170),
        run(seed(), Plan::EachOnce, Topology::One),
    )
    .await;
    assert!(s.faults.total() >= 6);
    assert!(s.resumes > 0, "no watch resumed across a proxy restart");
    assert!(s.events_checked > 0);
}

/// Two proxies side by side (issue 20), each client on both: a proxy killed with
/// SIGKILL, its clients resume on the other, with the faults of the short form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_watches_across_two_proxies_keep_the_six_guarantees_under_faults() {
    testkit::init_tracing();
    let s = testkit::bounded(
        Duration::from_secs(200),
        run(seed(), Plan::EachOnce, Topology::Pair),
    )
    .await;
    assert!(s.faults.proxy_kills >= 1);
    assert!(s.resumes > 0 && s.events_checked > 0);
}

/// A tier (issue 20): etcd → A → {B1, B2} → clients, with the faults of the short form
/// (cuts and blackholes between etcd and A, A or a B restarted, a B killed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_watches_through_a_tier_keep_the_six_guarantees_under_faults() {
    testkit::init_tracing();
    let s = testkit::bounded(
        Duration::from_secs(200),
        run(seed(), Plan::EachOnce, Topology::Tier),
    )
    .await;
    assert!(s.faults.proxy_kills >= 1);
    assert!(s.resumes > 0 && s.events_checked > 0);
}

/// `ETCD_CACHE_PROXY_TOPOLOGY`: one (default), pair or tier, for the soak.
fn topology_from_env() -> Topology {
    match std::env::var("ETCD_CACHE_PROXY_TOPOLOGY").as_deref() {
        Ok("pair") => Topology::Pair,
        Ok("tier") => Topology::Tier,
        _ => Topology::One,
    }
}

/// The soak: random faults for `ETCD_CACHE_PROXY_SOAK_SECS` (default 300).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: ETCD_CACHE_PROXY_SOAK_SECS=<secs> cargo test -p etcd-cache-proxy --test reliability -- --ignored --nocapture"]
async fn proxy_reliability_soak() {
    testkit::init_tracing();
    let secs: u64 = std::env::var("ETCD_CACHE_PROXY_SOAK_SECS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(300);
    let dur = Duration::from_secs(secs);
    testkit::bounded(
        dur + Duration::from_secs(180),
        run(seed(), Plan::Random(dur), topology_from_env()),
    )
    .await;
}
