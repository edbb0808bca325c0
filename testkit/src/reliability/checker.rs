//! The checker: ground truth recorded from etcd itself, what every subscriber received,
//! and the comparison of the two against etcd's six watch guarantees.
//!
//! Ground truth is a direct etcd watch on every key from revision 1 with `prev_kv`, opened
//! by the test before the cache exists (every test starts a fresh etcd, so the state at any
//! revision is the fold of the truth log up to it). It reconnects and resumes from its
//! last revision + 1 when its member dies; a compaction that overtakes it fails the test.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A key-value as the checker compares it (every field etcd reports).
#[derive(Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Kv {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub create: i64,
    pub modr: i64,
    pub version: i64,
    pub lease: i64,
}

impl fmt::Debug for Kv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={} (c{} m{} v{} l{})",
            String::from_utf8_lossy(&self.key),
            String::from_utf8_lossy(&self.value),
            self.create,
            self.modr,
            self.version,
            self.lease
        )
    }
}

/// A [`Kv`] from anything with etcd's key-value accessors (the cache's and etcd's
/// types spell them the same).
macro_rules! kv_of {
    ($kv:expr) => {
        Kv {
            key: $kv.key().to_vec(),
            value: $kv.value().to_vec(),
            create: $kv.create_revision(),
            modr: $kv.mod_revision(),
            version: $kv.version(),
            lease: $kv.lease(),
        }
    };
}

impl Kv {
    /// A key-value as the cache delivered it.
    pub fn from_cache(kv: &etcd_cache::KeyValue) -> Kv {
        kv_of!(kv)
    }

    /// A key-value as etcd returned it.
    pub fn from_etcd(kv: &etcd_client::KeyValue) -> Kv {
        kv_of!(kv)
    }
}

/// One event, as the checker compares it.
#[derive(Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Ev {
    pub put: bool,
    pub kv: Kv,
    pub prev: Option<Kv>,
}

impl fmt::Debug for Ev {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:?} prev={:?}",
            if self.put { "PUT" } else { "DEL" },
            self.kv,
            self.prev
        )
    }
}

impl Ev {
    /// An event as the cache delivered it.
    pub fn from_cache(e: &etcd_cache::Event) -> Ev {
        Ev {
            put: e.event_type() == etcd_cache::EventType::Put,
            kv: Kv::from_cache(e.kv().expect("cache event without kv")),
            prev: e.prev_kv().map(Kv::from_cache),
        }
    }

    /// An event as an etcd client received it (a remote watch through the proxy).
    pub fn from_etcd(e: &etcd_client::Event) -> Ev {
        Ev {
            put: e.event_type() == etcd_client::EventType::Put,
            kv: Kv::from_etcd(e.kv().expect("etcd event without kv")),
            prev: e.prev_kv().map(Kv::from_etcd),
        }
    }
}

/// A half-open key range `[start, end)`; `end` empty = the single key `start`.
#[derive(Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Range {
    pub start: Vec<u8>,
    pub end: Vec<u8>,
}

impl fmt::Debug for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{:?}, {:?})",
            String::from_utf8_lossy(&self.start),
            String::from_utf8_lossy(&self.end)
        )
    }
}

impl Range {
    /// The range of one key.
    pub fn single(key: &[u8]) -> Range {
        Range {
            start: key.to_vec(),
            end: Vec::new(),
        }
    }
    /// Every key under the prefix `p`.
    pub fn prefix(p: &[u8]) -> Range {
        Range {
            start: p.to_vec(),
            end: prefix_end(p),
        }
    }
    /// The keys in `[start, end)`, with etcd's meaning of an empty and a `\0` end.
    pub fn span(start: &[u8], end: &[u8]) -> Range {
        Range {
            start: start.to_vec(),
            end: end.to_vec(),
        }
    }
    /// Whether `key` is in the range.
    pub fn contains(&self, key: &[u8]) -> bool {
        if self.end.is_empty() {
            key == self.start.as_slice()
        } else if self.end == b"\0" {
            key >= self.start.as_slice()
        } else {
            key >= self.start.as_slice() && key < self.end.as_slice()
        }
    }
}

/// etcd's prefix end: the prefix with its last byte below 0xff incremented.
pub fn prefix_end(p: &[u8]) -> Vec<u8> {
    let mut end = p.to_vec();
    while let Some(&last) = end.last() {
        if last < 0xff {
            *end.last_mut().unwrap() += 1;
            return end;
        }
        end.pop();
    }
    vec![0]
}

/// The ground truth: every event etcd produced, by revision, with prev_kv.
#[derive(Default)]
#[allow(missing_docs)]
pub struct TruthLog {
    pub events: BTreeMap<i64, Vec<Ev>>,
    /// Newest revision seen (events only).
    pub last: i64,
    /// Reconnects of the truth watch.
    pub resumes: u64,
    /// Set when the truth watch could not resume (compacted): the test is void.
    pub lost: Option<String>,
}

impl TruthLog {
    /// The state (key → kv) at `rev`, restricted to `range`.
    pub fn state_at(&self, rev: i64, range: &Range) -> BTreeMap<Vec<u8>, Kv> {
        let mut state = BTreeMap::new();
        for (_, evs) in self.events.range(..=rev) {
            for e in evs {
                if !range.contains(&e.kv.key) {
                    continue;
                }
                if e.put {
                    state.insert(e.kv.key.clone(), e.kv.clone());
                } else {
                    state.remove(&e.kv.key);
                }
            }
        }
        state
    }
}

/// The truth recorder: a task that keeps a direct watch on every key open.
#[allow(missing_docs)]
pub struct Truth {
    pub log: Arc<Mutex<TruthLog>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Truth {
    /// Starts watching every key from revision 1 through `endpoints` (tried in turn).
    pub fn start(endpoints: Arc<Mutex<Vec<String>>>) -> Truth {
        let log = Arc::new(Mutex::new(TruthLog::default()));
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(truth_task(endpoints, log.clone(), stop_rx));
        Truth { log, stop, task }
    }

    /// Waits until the truth has seen revision `rev` (or panics after `limit`).
    pub async fn wait_for(&self, rev: i64, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            {
                let log = self.log.lock();
                if let Some(lost) = &log.lost {
                    panic!("ground truth lost: {lost}");
                }
                if log.last >= rev {
                    return;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "ground-truth watch did not reach revision {rev} within {limit:?} (at {})",
                self.log.lock().last
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the truth watch and returns its log.
    pub async fn stop(self) -> Arc<Mutex<TruthLog>> {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        self.log
    }
}

async fn truth_task(
    endpoints: Arc<Mutex<Vec<String>>>,
    log: Arc<Mutex<TruthLog>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut attempt = 0usize;
    loop {
        if *stop.borrow() {
            return;
        }
        let eps = endpoints.lock().clone();
        let ep = eps[attempt % eps.len()].clone();
        attempt += 1;
        let next = log.lock().last + 1;
        let session = async {
            let opts = etcd_client::ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(1))
                .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1));
            let mut client = match tokio::time::timeout(
                Duration::from_secs(2),
                etcd_client::Client::connect([ep.as_str()], Some(opts)),
            )
            .await
            {
                Ok(Ok(c)) => c,
                _ => return,
            };
            let wopts = etcd_client::WatchOptions::new()
                .with_range("\0")
                .with_prev_key()
                .with_start_revision(next);
            let mut stream =
                match tokio::time::timeout(Duration::from_secs(2), client.watch("\0", Some(wopts)))
                    .await
                {
                    Ok(Ok(s)) => s,
                    _ => return,
                };
            loop {
                let msg = match stream.message().await {
                    Ok(Some(m)) => m,
                    _ => return,
                };
                if msg.compact_revision() > 0 {
                    log.lock().lost = Some(format!(
                        "truth watch compacted at {} (resume from {next})",
                        msg.compact_revision()
                    ));
                    return;
                }
                if msg.canceled() {
                    return;
                }
                let mut log = log.lock();
                for e in msg.events() {
                    let kv = Kv::from_etcd(e.kv().expect("etcd event without kv"));
                    let rev = kv.modr;
                    if rev < log.last {
                        continue;
                    }
                    let ev = Ev {
                        put: e.event_type() == etcd_client::EventType::Put,
                        kv,
                        prev: e.prev_kv().map(Kv::from_etcd),
                    };
                    log.events.entry(rev).or_default().push(ev);
                    log.last = rev;
                }
            }
        };
        tokio::select! {
            _ = session => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if log.lock().lost.is_some() {
            return;
        }
        log.lock().resumes += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How a subscriber is consumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Polled continuously.
    Fast,
    /// One message a second.
    Slow,
    /// Never polled until the end of the test.
    Stuck,
    /// Created and dropped at random by the churn task.
    Churn,
}

/// What a subscriber asked for.
#[derive(Clone, Debug)]
#[allow(missing_docs)]
pub struct SubSpec {
    pub id: usize,
    pub class: Class,
    pub key: String,
    /// How the range was asked for: "key", "prefix", "range", "from-key".
    pub form: &'static str,
    pub range: Range,
    pub start_revision: i64,
    pub prev_kv: bool,
    pub no_put: bool,
    pub no_delete: bool,
    pub progress_notify: bool,
    /// Whether `Compacted` is an acceptable end for this subscriber in this test.
    pub may_compact: bool,
}

/// A spec's watch options, for `etcd_cache::WatchOptions` and
/// `etcd_client::WatchOptions` alike (the same builder names; the filter type is
/// etcd-client's in both).
macro_rules! watch_options {
    ($spec:expr, $options:ty, $start:expr) => {{
        let spec = $spec;
        let mut o = <$options>::new().with_start_revision($start);
        match spec.form {
            "prefix" => o = o.with_prefix(),
            "range" => o = o.with_range(spec.range.end.clone()),
            "from-key" => o = o.with_from_key(),
            _ => {}
        }
        if spec.prev_kv {
            o = o.with_prev_key();
        }
        if spec.progress_notify {
            o = o.with_progress_notify();
        }
        let mut filters = Vec::new();
        if spec.no_put {
            filters.push(etcd_client::WatchFilterType::NoPut);
        }
        if spec.no_delete {
            filters.push(etcd_client::WatchFilterType::NoDelete);
        }
        if !filters.is_empty() {
            o = o.with_filters(filters);
        }
        o
    }};
}

impl SubSpec {
    /// The request for the cache (a local watch).
    pub fn options(&self) -> etcd_cache::WatchOptions {
        watch_options!(self, etcd_cache::WatchOptions, self.start_revision)
    }

    /// The same request for etcd-client (a remote watch), starting at `start_revision`.
    pub fn etcd_options(&self, start_revision: i64) -> etcd_client::WatchOptions {
        watch_options!(self, etcd_client::WatchOptions, start_revision)
    }

    fn wants(&self, e: &Ev) -> bool {
        self.range.contains(&e.kv.key) && if e.put { !self.no_put } else { !self.no_delete }
    }

    /// The events of `truth` at `rev` this subscriber must receive, as it must receive them.
    fn expected(&self, truth: &TruthLog, rev: i64) -> Vec<Ev> {
        truth
            .events
            .get(&rev)
            .map(|evs| {
                evs.iter()
                    .filter(|e| self.wants(e))
                    .map(|e| Ev {
                        put: e.put,
                        kv: e.kv.clone(),
                        prev: if self.prev_kv { e.prev.clone() } else { None },
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[derive(Clone, Debug)]
/// One response a subscriber received, as the checker reads it.
pub enum Resp {
    /// The watch was created, at this header revision.
    Created(i64),
    /// Events, with their response's header revision.
    Events(i64, Vec<Ev>),
    /// A progress notification at this revision.
    Progress(i64),
    /// The watch was created again, on a new stream, from this start revision: a client
    /// resuming after its stream broke (a remote watch across a proxy restart). Recorded
    /// when the new watch's `created` response arrives; everything after it must go on
    /// from where the old stream stopped, with no gap and no duplicate.
    Resumed(i64),
}

/// How a subscriber's stream ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// Still open when the test stopped it (after the final drain).
    Drained,
    /// The drain did not reach the final revision in time.
    DrainTimeout,
    /// Dropped by the test (churn).
    Dropped,
    /// `Err(Compacted)`.
    Compacted(i64),
    /// `Ok(None)` before the test asked.
    Ended,
    /// Any other error.
    Error(String),
    /// `cache.watch` itself failed.
    OpenFailed(String),
}

#[derive(Clone, Debug)]
/// Everything one subscriber received, and how its stream ended.
#[allow(missing_docs)]
pub struct SubLog {
    pub spec: SubSpec,
    pub responses: Vec<Resp>,
    pub end: End,
    /// The highest header revision seen on the stream.
    pub last_header: i64,
    /// Header revisions that went down, or fell below their events' revision.
    pub header_violations: Vec<String>,
}

/// One violation, with enough context to replay it.
#[derive(Debug)]
#[allow(missing_docs)]
pub struct Violation {
    pub guarantee: &'static str,
    pub sub: Option<usize>,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.sub {
            Some(id) => write!(f, "[{}] subscriber {id}: {}", self.guarantee, self.detail),
            None => write!(f, "[{}] {}", self.guarantee, self.detail),
        }
    }
}

/// What one subscriber's check counted.
#[derive(Default, Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct SubCounts {
    pub events: u64,
    pub responses: u64,
    pub progress: u64,
    /// `Resumed` entries (remote watches created again after their stream broke).
    pub resumes: u64,
}

/// Checks one subscriber's log against the truth. `final_rev` is the revision every
/// drained subscriber must have covered.
pub fn check_sub(
    log: &SubLog,
    truth: &TruthLog,
    final_rev: i64,
    out: &mut Vec<Violation>,
) -> SubCounts {
    let spec = &log.spec;
    let mut counts = SubCounts::default();
    let mut v = |g: &'static str, d: String| {
        out.push(Violation {
            guarantee: g,
            sub: Some(spec.id),
            detail: format!("{d}; spec {spec:?}"),
        })
    };
    for h in &log.header_violations {
        v("ordered", h.clone());
    }
    if let End::OpenFailed(e) = &log.end {
        v(
            "resumable",
            format!("watch() failed on a valid request: {e}"),
        );
        return counts;
    }
    let mut it = log.responses.iter();
    // `covered`: every matching event <= covered was delivered (or promised by progress).
    let mut covered;
    let mut last_event = 0i64;
    let mut last_progress = 0i64;
    // Where the last event was, for a report: responses and resumptions since.
    let (mut since_event, mut resumed_since_event) = (0usize, 0usize);
    match it.next() {
        Some(Resp::Created(rev)) => {
            covered = if spec.start_revision > 0 {
                spec.start_revision - 1
            } else {
                *rev
            };
        }
        Some(other) => {
            v(
                "created",
                format!("first response is not `created`: {other:?}"),
            );
            return counts;
        }
        None => {
            // A watch below the window yields Compacted without a created response.
            match &log.end {
                End::Compacted(cr) => {
                    if spec.start_revision <= 0 || spec.start_revision >= *cr {
                        v(
                            "resumable",
                            format!("Compacted {{ compact_revision: {cr} }} at creation, but start revision {} is not below it", spec.start_revision),
                        );
                    }
                    if !spec.may_compact && spec.start_revision > 0 && spec.start_revision >= *cr {
                        v("resumable", "unexpected Compacted".into());
                    }
                }
                End::Dropped => {}
                other => v(
                    "created",
                    format!("stream ended without `created`: {other:?}"),
                ),
            }
            return counts;
        }
    }
    let mut seen: std::collections::HashSet<(i64, Vec<u8>)> = Default::default();
    // The last few responses, for a report.
    let mut recent: std::collections::VecDeque<String> = Default::default();
    for r in it {
        counts.responses += 1;
        since_event += 1;
        if recent.len() == 6 {
            recent.pop_front();
        }
        recent.push_back(match r {
            Resp::Events(rev, evs) => format!("Events({rev}, {} events)", evs.len()),
            other => format!("{other:?}"),
        });
        match r {
            Resp::Created(rev) => v("created", format!("second `created` response at {rev}")),
            Resp::Resumed(from) => {
                counts.resumes += 1;
                resumed_since_event += 1;
                if *from > covered + 1 {
                    for rev in (covered + 1)..*from {
                        let exp = spec.expected(truth, rev);
                        if !exp.is_empty() {
                            v("reliable", format!("resumed from {from} after covering only {covered}: the events at {rev} were never delivered: {exp:?}"));
                            break;
                        }
                    }
                    // A resumption from ahead promises nothing about what it skipped.
                }
            }
            Resp::Progress(p) => {
                counts.progress += 1;
                if *p < last_event {
                    v(
                        "ordered",
                        format!(
                            "progress {p} after an event at {last_event} ({since_event} \
                             responses and {resumed_since_event} resumptions later; the last \
                             responses {recent:?})"
                        ),
                    );
                }
                if *p < spec.start_revision {
                    // etcd#20221: a client that resumes from it is sent events from
                    // before the start it asked for.
                    v(
                        "ordered",
                        format!(
                            "progress {p} below the start revision {}",
                            spec.start_revision
                        ),
                    );
                }
                if *p > covered {
                    for rev in (covered + 1)..=*p {
                        let exp = spec.expected(truth, rev);
                        if !exp.is_empty() {
                            v("bookmarkable", format!("progress {p} but the events at {rev} were never delivered: {exp:?}"));
                            break;
                        }
                    }
                    covered = *p;
                }
                last_progress = last_progress.max(*p);
            }
            Resp::Events(rev, evs) => {
                counts.events += evs.len() as u64;
                if evs.is_empty() {
                    v(
                        "atomic",
                        format!("an events response at {rev} with no events"),
                    );
                }
                if *rev <= last_event {
                    v("ordered", format!("revision {rev} after {last_event}"));
                }
                if *rev <= last_progress {
                    v(
                        "bookmarkable",
                        format!("event at {rev} after progress {last_progress}"),
                    );
                }
                if spec.start_revision > 0 && *rev < spec.start_revision {
                    v(
                        "ordered",
                        format!(
                            "event at {rev} before the start revision {}",
                            spec.start_revision
                        ),
                    );
                }
                for e in evs {
                    if e.kv.modr != *rev {
                        v(
                            "atomic",
                            format!("event {e:?} in the response for revision {rev}"),
                        );
                    }
                    if !seen.insert((e.kv.modr, e.kv.key.clone())) {
                        v("unique", format!("event {e:?} delivered twice"));
                    }
                    if !spec.range.contains(&e.kv.key) {
                        v("filter", format!("event {e:?} outside the watched range"));
                    }
                    if (e.put && spec.no_put) || (!e.put && spec.no_delete) {
                        v("filter", format!("event {e:?} of a filtered type"));
                    }
                }
                if *rev > covered {
                    for gap in (covered + 1)..*rev {
                        let exp = spec.expected(truth, gap);
                        if !exp.is_empty() {
                            v("reliable", format!("gap: events at {gap} never delivered (next delivered {rev}): {exp:?}"));
                            break;
                        }
                    }
                }
                let exp = spec.expected(truth, *rev);
                if exp != *evs {
                    // Tell apart a prev_kv mismatch from the rest.
                    let strip =
                        |x: &[Ev]| x.iter().map(|e| (e.put, e.kv.clone())).collect::<Vec<_>>();
                    if strip(&exp) == strip(evs) {
                        v(
                            "prev_kv",
                            format!("at {rev}: got {evs:?}, etcd says {exp:?}"),
                        );
                    } else {
                        v(
                            "atomic",
                            format!("at {rev}: got {evs:?}, etcd says {exp:?}"),
                        );
                    }
                }
                last_event = last_event.max(*rev);
                (since_event, resumed_since_event) = (0, 0);
                covered = covered.max(*rev);
            }
        }
    }
    match &log.end {
        End::Drained => {
            if covered < final_rev {
                v(
                    "reliable",
                    format!("drained but covered only up to {covered} < final {final_rev}"),
                );
            }
        }
        End::DrainTimeout => v(
            "resumable",
            format!("the final drain timed out at {covered} < {final_rev}"),
        ),
        End::Dropped => {}
        End::Compacted(cr) => {
            if covered + 1 >= *cr {
                v("resumable", format!("Compacted {{ compact_revision: {cr} }} although the stream was at {covered}, inside the window"));
            }
            if !spec.may_compact {
                v(
                    "resumable",
                    format!("unexpected Compacted {{ compact_revision: {cr} }} at {covered}"),
                );
            }
        }
        End::Ended => v(
            "resumable",
            format!("stream ended (None) at {covered} while the cache was open"),
        ),
        End::Error(e) => v("resumable", format!("stream error at {covered}: {e}")),
        End::OpenFailed(_) => unreachable!(),
    }
    counts
}

/// One recorded `cache.get`, checked against the truth after the run.
#[derive(Clone, Debug)]
#[allow(missing_docs)]
pub struct GetRecord {
    pub range: Range,
    /// Requested revision (0 = latest).
    pub requested: i64,
    pub limit: i64,
    /// Revision the answer reflects: `requested`, or the response's revision.
    pub at: i64,
    pub kvs: Vec<Kv>,
    pub count: i64,
    pub more: bool,
    /// etcd's own answer at the same revision, when it could be read.
    pub etcd: Option<(Vec<Kv>, i64, bool)>,
    /// For a consistent read: the newest revision acknowledged before the read started.
    pub min_rev: i64,
}

/// Checks one read against the truth at the revision its header gives (and the
/// linearizable bound); pushes what it finds into `out`.
pub fn check_get(g: &GetRecord, truth: &TruthLog, out: &mut Vec<Violation>) {
    if g.min_rev > 0 && g.at < g.min_rev {
        out.push(Violation {
            guarantee: "linearizable",
            sub: None,
            detail: format!(
                "consistent get {:?} answered at {} although revision {} was acknowledged before it started",
                g.range, g.at, g.min_rev
            ),
        });
    }
    let state = truth.state_at(g.at, &g.range);
    let all: Vec<Kv> = state.into_values().collect();
    let count = all.len() as i64;
    let (kvs, more) = if g.limit > 0 && all.len() > g.limit as usize {
        (all[..g.limit as usize].to_vec(), true)
    } else {
        (all, false)
    };
    if kvs != g.kvs || count != g.count || more != g.more {
        out.push(Violation {
            guarantee: "get",
            sub: None,
            detail: format!(
                "get {:?} at {} (asked {}, limit {}): cache gave {} kvs count {} more {}: {:?}; etcd's state: {} kvs count {count} more {more}: {:?}",
                g.range, g.at, g.requested, g.limit, g.kvs.len(), g.count, g.more, g.kvs, kvs.len(), kvs
            ),
        });
    }
    if let Some((ekvs, ecount, emore)) = &g.etcd {
        if *ekvs != g.kvs || *ecount != g.count || *emore != g.more {
            out.push(Violation {
                guarantee: "get",
                sub: None,
                detail: format!(
                    "get {:?} at {}: cache {:?} (count {}, more {}) != etcd get at {} {:?} (count {ecount}, more {emore})",
                    g.range, g.at, g.kvs, g.count, g.more, g.at, ekvs
                ),
            });
        }
    }
}

/// The checker itself: a clean log passes, and each kind of fault injected into a log is
/// reported under its guarantee. No etcd needed.
#[cfg(test)]
mod self_test {
    use super::*;

    fn kv(key: &str, value: &str, create: i64, modr: i64, version: i64) -> Kv {
        Kv {
            key: key.into(),
            value: value.into(),
            create,
            modr,
            version,
            lease: 0,
        }
    }

    fn truth() -> TruthLog {
        let mut t = TruthLog::default();
        let a1 = kv("/p/a", "1", 2, 2, 1);
        let a2 = kv("/p/a", "2", 2, 3, 2);
        let b1 = kv("/p/b", "1", 4, 4, 1);
        let c1 = kv("/p/c", "1", 4, 4, 1);
        t.events.insert(
            2,
            vec![Ev {
                put: true,
                kv: a1.clone(),
                prev: None,
            }],
        );
        t.events.insert(
            3,
            vec![Ev {
                put: true,
                kv: a2.clone(),
                prev: Some(a1),
            }],
        );
        t.events.insert(
            4,
            vec![
                Ev {
                    put: true,
                    kv: b1.clone(),
                    prev: None,
                },
                Ev {
                    put: true,
                    kv: c1,
                    prev: None,
                },
            ],
        );
        t.events.insert(
            5,
            vec![Ev {
                put: true,
                kv: kv("/q/x", "1", 5, 5, 1),
                prev: None,
            }],
        );
        t.events.insert(
            6,
            vec![Ev {
                put: false,
                kv: kv("/p/a", "", 0, 6, 0),
                prev: Some(a2),
            }],
        );
        t.last = 6;
        t
    }

    fn spec(prev_kv: bool) -> SubSpec {
        SubSpec {
            id: 1,
            class: Class::Fast,
            key: "/p/".into(),
            form: "prefix",
            range: Range::prefix(b"/p/"),
            start_revision: 2,
            prev_kv,
            no_put: false,
            no_delete: false,
            progress_notify: false,
            may_compact: false,
        }
    }

    fn good(t: &TruthLog, prev: bool) -> Vec<Resp> {
        let s = spec(prev);
        let mut r = vec![Resp::Created(1)];
        for rev in [2, 3, 4, 6] {
            r.push(Resp::Events(rev, s.expected(t, rev)));
        }
        r.push(Resp::Progress(6));
        r
    }

    fn guarantees(responses: Vec<Resp>, prev: bool, end: End) -> Vec<&'static str> {
        let log = SubLog {
            spec: spec(prev),
            responses,
            end,
            last_header: 0,
            header_violations: Vec::new(),
        };
        let mut out = Vec::new();
        check_sub(&log, &truth(), 6, &mut out);
        out.iter().map(|v| v.guarantee).collect()
    }

    #[test]
    fn clean_log_passes() {
        let t = truth();
        assert!(guarantees(good(&t, true), true, End::Drained).is_empty());
        assert!(guarantees(good(&t, false), false, End::Drained).is_empty());
    }

    #[test]
    fn injected_faults_are_caught() {
        let t = truth();
        // A gap: revision 3 missing.
        let mut r = good(&t, true);
        r.remove(2);
        assert!(guarantees(r, true, End::Drained).contains(&"reliable"));
        // A duplicate response.
        let mut r = good(&t, true);
        r.insert(2, r[1].clone());
        let g = guarantees(r, true, End::Drained);
        assert!(g.contains(&"ordered") && g.contains(&"unique"), "{g:?}");
        // A split revision (atomic).
        let mut r = good(&t, true);
        if let Resp::Events(_, evs) = &mut r[3] {
            evs.pop();
        }
        assert!(guarantees(r, true, End::Drained).contains(&"atomic"));
        // A wrong prev_kv.
        let mut r = good(&t, true);
        if let Resp::Events(_, evs) = &mut r[2] {
            evs[0].prev = None;
        }
        assert!(guarantees(r, true, End::Drained).contains(&"prev_kv"));
        // An event outside the range (revision 5, key /q/x).
        let mut r = good(&t, true);
        r.insert(4, Resp::Events(5, t.events[&5].clone()));
        assert!(guarantees(r, true, End::Drained).contains(&"filter"));
        // A progress below the watch's start (2), before anything was delivered.
        let mut r = good(&t, true);
        r.insert(1, Resp::Progress(1));
        assert!(guarantees(r, true, End::Drained).contains(&"ordered"));
        // A progress that promises an event never delivered (bookmarkable).
        let mut r = good(&t, true);
        r.insert(2, Resp::Progress(3));
        r.remove(3);
        assert!(guarantees(r, true, End::Drained).contains(&"bookmarkable"));
        // An unexpected end, a spurious Compacted, a drain that stopped short.
        let mut r = good(&t, true);
        r.pop();
        assert!(guarantees(r.clone(), true, End::Ended).contains(&"resumable"));
        assert!(guarantees(r.clone(), true, End::Compacted(3)).contains(&"resumable"));
        r.truncate(3);
        assert!(guarantees(r, true, End::Drained).contains(&"reliable"));
    }

    /// A remote watch that resumes on a new stream from where it stopped passes; one
    /// that resumes too late (a gap) or too early (a duplicate) is caught.
    #[test]
    fn resumptions_are_checked_across_the_break() {
        let t = truth();
        let s = spec(true);
        let resumed = |from: i64, revs: &[i64]| {
            let mut r = vec![
                Resp::Created(1),
                Resp::Events(2, s.expected(&t, 2)),
                Resp::Events(3, s.expected(&t, 3)),
                Resp::Resumed(from),
            ];
            for rev in revs {
                r.push(Resp::Events(*rev, s.expected(&t, *rev)));
            }
            r.push(Resp::Progress(6));
            r
        };
        // From the last revision + 1; and from after a revision with nothing for it (5).
        assert!(guarantees(resumed(4, &[4, 6]), true, End::Drained).is_empty());
        assert!(guarantees(resumed(4, &[4]), true, End::Drained).contains(&"bookmarkable"));
        let log = SubLog {
            spec: spec(true),
            responses: resumed(4, &[4, 6]),
            end: End::Drained,
            last_header: 0,
            header_violations: Vec::new(),
        };
        let mut out = Vec::new();
        assert_eq!(check_sub(&log, &t, 6, &mut out).resumes, 1);
        // Resumed past revision 4: a gap across the break.
        assert!(guarantees(resumed(5, &[6]), true, End::Drained).contains(&"reliable"));
        // Resumed from 3 again: revision 3 twice.
        let g = guarantees(resumed(3, &[3, 4, 6]), true, End::Drained);
        assert!(g.contains(&"unique") && g.contains(&"ordered"), "{g:?}");
        // A second `created` without a resumption is still wrong.
        let mut r = resumed(4, &[4, 6]);
        r[3] = Resp::Created(3);
        assert!(guarantees(r, true, End::Drained).contains(&"created"));
    }

    #[test]
    fn get_check_catches_a_wrong_read() {
        let t = truth();
        let range = Range::prefix(b"/p/");
        let state: Vec<Kv> = t.state_at(4, &range).into_values().collect();
        let g = GetRecord {
            range: range.clone(),
            requested: 4,
            limit: 0,
            at: 4,
            kvs: state.clone(),
            count: 3,
            more: false,
            etcd: None,
            min_rev: 0,
        };
        let mut out = Vec::new();
        check_get(&g, &t, &mut out);
        assert!(out.is_empty(), "{out:?}");
        let g = GetRecord { at: 6, ..g };
        check_get(&g, &t, &mut out);
        assert_eq!(out.len(), 1);
    }
}
