//! One checked run: ground truth, a cache, a seeded random workload, fixed and churning
//! subscribers, readers, a stats monitor; then the final drain and the check.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_cache::{Cache, Error, GetOptions};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

use super::checker::{
    check_get, check_sub, prefix_end, Class, End, Ev, GetRecord, Kv, Range, Resp, SubLog, SubSpec,
    Truth, Violation,
};

/// The cache's prefix. Keys inside and outside it are written.
pub const PREFIX: &str = "/rel/";
/// Written after the workload; every drained subscriber must cover its revision.
pub const SENTINEL: &str = "/rel/~end";
/// The directories inside the prefix the workload writes keys in.
pub const INSIDE_DIRS: [&str; 3] = ["/rel/a/", "/rel/b/", "/rel/c/"];
const KEYS_PER_DIR: usize = 8;
/// Keys outside the prefix, some right next to it.
pub const OUTSIDE: [&str; 6] = ["/rel", "/rel0", "/rek/x", "/rem/0", "/rem/1", "/r"];

/// The seed: `ETCD_CACHE_SEED` to replay, otherwise from the clock.
pub fn seed() -> u64 {
    match std::env::var("ETCD_CACHE_SEED") {
        Ok(s) if !s.trim().is_empty() => s.trim().parse().expect("ETCD_CACHE_SEED must be a u64"),
        _ => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32)
        }
    }
}

/// A client with short keep-alives (so a stalled connection is noticed in ~2 s),
/// retried for up to 20 s until a status call answers.
pub async fn connect(endpoints: &[String]) -> etcd_client::Client {
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
        .with_keep_alive_while_idle(true);
    crate::Connect::new()
        .options(options)
        .retry_for(Duration::from_secs(20))
        .client(endpoints)
        .await
}

/// The knobs of one run.
#[derive(Clone, Debug)]
#[allow(missing_docs)]
pub struct Cfg {
    pub name: &'static str,
    pub seed: u64,
    pub history_window: usize,
    pub subscriber_buffer: usize,
    pub max_watchers: usize,
    /// Fixed subscribers per class, opened when the cache is ready.
    pub fixed: Vec<(Class, usize)>,
    /// Mean pause between two churn actions (None: no churn).
    pub churn_every: Option<Duration>,
    /// Pause between two writes of the workload.
    pub write_pause: Duration,
    /// A re-list is part of the test: any subscriber may end with `Compacted` (still only
    /// when its position is below the compact revision).
    pub relist_expected: bool,
}

impl Cfg {
    /// The default knobs for the run `name` with `seed`.
    pub fn new(name: &'static str, seed: u64) -> Cfg {
        Cfg {
            name,
            seed,
            history_window: 512,
            subscriber_buffer: 16,
            max_watchers: 10_000,
            fixed: vec![(Class::Fast, 8)],
            churn_every: Some(Duration::from_millis(150)),
            write_pause: Duration::from_millis(8),
            relist_expected: false,
        }
    }
}

#[derive(Default)]
/// What the workload did: writes and reads that succeeded or failed, and the newest
/// acknowledged revision.
#[allow(missing_docs)]
pub struct Counters {
    /// Revision of the newest acknowledged write (for the linearizable-read check).
    pub last_ack: AtomicI64,
    pub writes_ok: AtomicU64,
    pub writes_failed: AtomicU64,
    pub gets_ok: AtomicU64,
    pub gets_compacted: AtomicU64,
    pub gets_failed: AtomicU64,
    pub max_history_len: AtomicUsize,
    pub max_lagging: AtomicUsize,
    pub max_watchers: AtomicUsize,
    pub subs_opened: AtomicU64,
}

/// The result line of a run.
#[derive(Debug, Default)]
#[allow(missing_docs)]
pub struct Summary {
    pub name: &'static str,
    pub seed: u64,
    pub revisions: i64,
    pub truth_events: u64,
    pub events_checked: u64,
    pub responses_checked: u64,
    pub subscribers: usize,
    pub compacted_ends: usize,
    pub dropped: usize,
    pub stuck: usize,
    pub stuck_compacted: usize,
    pub gets_checked: usize,
    pub faults: u64,
    pub lists: u64,
    pub connects: u64,
    pub violations: usize,
}

impl Summary {
    /// The one-line summary the run prints (`RELIABILITY | ...`).
    pub fn line(&self) -> String {
        format!(
            "RELIABILITY | {} | seed {} | revisions {} | truth events {} | events checked {} | responses {} | subscribers {} (compacted {}, dropped {}) | gets {} | faults {} | lists {} | connects {} | violations {}",
            self.name, self.seed, self.revisions, self.truth_events, self.events_checked,
            self.responses_checked, self.subscribers, self.compacted_ends, self.dropped,
            self.gets_checked, self.faults, self.lists, self.connects, self.violations
        )
    }
}

/// A running test.
#[allow(missing_docs)]
pub struct Run {
    pub cfg: Cfg,
    pub cache: Cache,
    pub truth: Truth,
    /// Endpoints for the writer, the readers' etcd comparisons and the truth: direct, not
    /// through the cache's fault path. The test updates it when members die.
    pub direct: Arc<Mutex<Vec<String>>>,
    pub counters: Arc<Counters>,
    pub violations: Arc<Mutex<Vec<Violation>>>,
    pub faults: u64,
    stop: watch::Sender<bool>,
    drain: watch::Sender<i64>,
    subs: Arc<Mutex<Vec<JoinHandle<SubLog>>>>,
    gets: Arc<Mutex<Vec<GetRecord>>>,
    tasks: Vec<JoinHandle<()>>,
    next_id: Arc<AtomicUsize>,
}

impl Run {
    /// Starts the truth, a cache over `cache_client`, the workload and the subscribers.
    pub async fn start(cfg: Cfg, direct: Vec<String>, cache_client: etcd_client::Client) -> Run {
        println!(
            "{}: seed {} (replay with ETCD_CACHE_SEED={})",
            cfg.name, cfg.seed, cfg.seed
        );
        let direct = Arc::new(Mutex::new(direct));
        let truth = Truth::start(direct.clone());
        let cache = Cache::builder(cache_client)
            .prefix(PREFIX)
            .history_window(cfg.history_window)
            .subscriber_buffer(cfg.subscriber_buffer)
            .max_watchers(cfg.max_watchers)
            .backoff(Duration::from_millis(50), Duration::from_millis(500))
            .progress_notify_interval(Duration::from_millis(300))
            .build()
            .await
            .expect("build the cache");
        cache
            .wait_ready_timeout(Duration::from_secs(30))
            .await
            .expect("cache ready");
        let (stop, _) = watch::channel(false);
        let (drain, _) = watch::channel(0i64);
        let mut run = Run {
            cfg: cfg.clone(),
            cache,
            truth,
            direct,
            counters: Arc::new(Counters::default()),
            violations: Arc::new(Mutex::new(Vec::new())),
            faults: 0,
            stop,
            drain,
            subs: Arc::new(Mutex::new(Vec::new())),
            gets: Arc::new(Mutex::new(Vec::new())),
            tasks: Vec::new(),
            next_id: Arc::new(AtomicUsize::new(0)),
        };
        // The writer first, so that replays have something to replay.
        let writer = tokio::spawn(writer(
            cfg.seed,
            run.direct.clone(),
            cfg.write_pause,
            run.counters.clone(),
            run.stop.subscribe(),
        ));
        run.tasks.push(writer);
        let mut rng = StdRng::seed_from_u64(cfg.seed ^ 0x5eb5);
        for (class, n) in cfg.fixed.clone() {
            for _ in 0..n {
                let spec = random_spec(&mut rng, &run, class, cfg.relist_expected);
                run.spawn_sub(spec);
            }
        }
        if let Some(every) = cfg.churn_every {
            let ctx = run.sub_ctx();
            let seed = cfg.seed;
            let relist = cfg.relist_expected;
            let mut stop = run.stop.subscribe();
            run.tasks.push(tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed ^ 0xc4u64);
                loop {
                    let pause = every.mul_f64(rng.random_range(0.2..1.8));
                    tokio::select! {
                        _ = sleep(pause) => {}
                        _ = stop.wait_for(|s| *s) => return,
                    }
                    let spec = ctx.random_spec(&mut rng, Class::Churn, relist);
                    ctx.spawn(spec);
                }
            }));
        }
        run.tasks.push(tokio::spawn(reader(
            cfg.seed,
            run.cache.clone(),
            run.direct.clone(),
            run.gets.clone(),
            run.counters.clone(),
            run.violations.clone(),
            run.stop.subscribe(),
        )));
        run.tasks.push(tokio::spawn(monitor(
            run.cache.clone(),
            cfg.history_window,
            run.counters.clone(),
            run.violations.clone(),
            run.stop.subscribe(),
        )));
        run
    }

    fn sub_ctx(&self) -> SubCtx {
        SubCtx {
            cache: self.cache.clone(),
            drain: self.drain.subscribe(),
            subs: self.subs.clone(),
            next_id: self.next_id.clone(),
            counters: self.counters.clone(),
        }
    }

    /// Opens and records one more subscriber of `spec`.
    pub fn spawn_sub(&self, spec: SubSpec) {
        self.sub_ctx().spawn(spec);
    }

    /// Replaces the endpoints the writer and the truth use.
    pub fn set_direct(&self, endpoints: Vec<String>) {
        *self.direct.lock() = endpoints;
    }

    /// A fresh direct client (retried).
    pub async fn direct_client(&self) -> etcd_client::Client {
        let eps = self.direct.lock().clone();
        connect(&eps).await
    }

    /// The current etcd revision, read directly.
    pub async fn etcd_revision(&self) -> i64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut c = self.direct_client().await;
            if let Ok(Ok(r)) = timeout(Duration::from_secs(3), c.get("/", None)).await {
                return r.header().unwrap().revision();
            }
            assert!(Instant::now() < deadline, "cannot read etcd's revision");
            sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the workload, drains every subscriber to a final revision, checks
    /// everything and panics (with the seed) on any violation.
    pub async fn finish(self) -> Summary {
        let Run {
            cfg,
            cache,
            truth,
            direct,
            counters,
            violations,
            faults,
            stop,
            drain,
            subs,
            gets,
            tasks,
            ..
        } = self;
        let _ = stop.send(true);
        for t in tasks {
            let _ = timeout(Duration::from_secs(20), t).await;
        }
        // The faults are healed: the cache must become ready again.
        if let Err(e) = cache.wait_ready_timeout(Duration::from_secs(30)).await {
            violations.lock().push(Violation {
                guarantee: "resumable",
                sub: None,
                detail: format!("cache not ready again after the faults: {e}"),
            });
        }
        // The sentinel: one last revision inside the prefix.
        let eps = direct.lock().clone();
        let deadline = Instant::now() + Duration::from_secs(30);
        let sentinel_rev = loop {
            let mut c = connect(&eps).await;
            if let Ok(Ok(r)) = timeout(
                Duration::from_secs(3),
                c.put(SENTINEL, cfg.seed.to_string(), None),
            )
            .await
            {
                break r.header().unwrap().revision();
            }
            assert!(Instant::now() < deadline, "cannot write the sentinel");
        };
        truth.wait_for(sentinel_rev, Duration::from_secs(30)).await;
        if timeout(
            Duration::from_secs(30),
            cache.wait_for_revision(sentinel_rev),
        )
        .await
        .is_err()
        {
            violations.lock().push(Violation {
                guarantee: "reliable",
                sub: None,
                detail: format!(
                    "the cache did not reach the sentinel revision {sentinel_rev} (at {})",
                    cache.revision()
                ),
            });
        }
        let _ = drain.send(sentinel_rev);
        let handles: Vec<_> = std::mem::take(&mut *subs.lock());
        let mut logs = Vec::new();
        for h in handles {
            match timeout(Duration::from_secs(60), h).await {
                Ok(Ok(log)) => logs.push(log),
                Ok(Err(e)) => violations.lock().push(Violation {
                    guarantee: "harness",
                    sub: None,
                    detail: format!("subscriber task panicked: {e}"),
                }),
                Err(_) => violations.lock().push(Violation {
                    guarantee: "resumable",
                    sub: None,
                    detail: "subscriber task did not finish its drain".into(),
                }),
            }
        }
        let stats = cache.stats();
        let log = truth.stop().await;
        let truth = std::mem::take(&mut *log.lock());
        let mut out = std::mem::take(&mut *violations.lock());
        if let Some(lost) = &truth.lost {
            panic!("{}: seed {}: ground truth lost: {lost}", cfg.name, cfg.seed);
        }
        let mut summary = Summary {
            name: cfg.name,
            seed: cfg.seed,
            revisions: sentinel_rev,
            truth_events: truth.events.values().map(|v| v.len() as u64).sum(),
            subscribers: logs.len(),
            faults,
            lists: stats.lists,
            connects: stats.connects,
            ..Summary::default()
        };
        for l in &logs {
            let c = check_sub(l, &truth, sentinel_rev, &mut out);
            summary.events_checked += c.events;
            summary.responses_checked += c.responses;
            if l.spec.class == Class::Stuck {
                summary.stuck += 1;
                if matches!(l.end, End::Compacted(_)) {
                    summary.stuck_compacted += 1;
                }
            }
            match l.end {
                End::Compacted(_) => summary.compacted_ends += 1,
                End::Dropped => summary.dropped += 1,
                _ => {}
            }
        }
        let gets: Vec<GetRecord> = gets.lock().clone();
        for g in gets.iter() {
            check_get(g, &truth, &mut out);
        }
        summary.gets_checked = gets.len();
        if !cfg.relist_expected && stats.lists > 1 {
            out.push(Violation {
                guarantee: "resumable",
                sub: None,
                detail: format!("{} lists without a compaction", stats.lists),
            });
        }
        summary.violations = out.len();
        println!("{}", summary.line());
        println!(
            "{}: writes ok {} failed {}; gets ok {} compacted {} failed {}; max history {} lagging {} watchers {}; subscribers opened {}; truth resumes {}",
            cfg.name,
            counters.writes_ok.load(Ordering::Relaxed),
            counters.writes_failed.load(Ordering::Relaxed),
            counters.gets_ok.load(Ordering::Relaxed),
            counters.gets_compacted.load(Ordering::Relaxed),
            counters.gets_failed.load(Ordering::Relaxed),
            counters.max_history_len.load(Ordering::Relaxed),
            counters.max_lagging.load(Ordering::Relaxed),
            counters.max_watchers.load(Ordering::Relaxed),
            counters.subs_opened.load(Ordering::Relaxed),
            truth.resumes,
        );
        drop(truth);
        cache.close().await;
        if !out.is_empty() {
            let mut msg = format!(
                "{}: {} violation(s); replay with ETCD_CACHE_SEED={}\n",
                cfg.name,
                out.len(),
                cfg.seed
            );
            for v in out.iter().take(40) {
                msg.push_str(&format!("  {v}\n"));
            }
            panic!("{msg}");
        }
        summary
    }
}

/// What a subscriber-spawning task needs.
#[derive(Clone)]
struct SubCtx {
    cache: Cache,
    drain: watch::Receiver<i64>,
    subs: Arc<Mutex<Vec<JoinHandle<SubLog>>>>,
    next_id: Arc<AtomicUsize>,
    counters: Arc<Counters>,
}

impl SubCtx {
    fn random_spec(&self, rng: &mut StdRng, class: Class, relist: bool) -> SubSpec {
        let (floor, head) = self.cache.history_span();
        make_spec(
            rng,
            self.next_id.fetch_add(1, Ordering::Relaxed),
            class,
            relist,
            floor,
            head,
        )
    }

    fn spawn(&self, spec: SubSpec) {
        self.counters.subs_opened.fetch_add(1, Ordering::Relaxed);
        let h = tokio::spawn(subscriber(self.cache.clone(), spec, self.drain.clone()));
        self.subs.lock().push(h);
    }
}

fn random_spec(rng: &mut StdRng, run: &Run, class: Class, relist: bool) -> SubSpec {
    run.sub_ctx().random_spec(rng, class, relist)
}

/// A random key inside the prefix.
pub fn inside_key(rng: &mut StdRng) -> String {
    format!(
        "{}{}",
        INSIDE_DIRS[rng.random_range(0..INSIDE_DIRS.len())],
        rng.random_range(0..KEYS_PER_DIR)
    )
}

/// A random subscriber `id` of `class`: a random range, filters and prev_kv; a churning
/// one may start from inside the window `floor..=head`, just below it, or from the
/// future. `relist`: the run expects a re-list.
pub fn make_spec(
    rng: &mut StdRng,
    id: usize,
    class: Class,
    relist: bool,
    floor: i64,
    head: i64,
) -> SubSpec {
    let (form, key, range) = match rng.random_range(0..5) {
        0 => (
            "prefix",
            PREFIX.to_string(),
            Range::prefix(PREFIX.as_bytes()),
        ),
        1 => {
            let d = INSIDE_DIRS[rng.random_range(0..INSIDE_DIRS.len())];
            ("prefix", d.to_string(), Range::prefix(d.as_bytes()))
        }
        2 => {
            let k = inside_key(rng);
            ("key", k.clone(), Range::single(k.as_bytes()))
        }
        3 => {
            let mut a = inside_key(rng);
            let mut b = inside_key(rng);
            if a > b {
                std::mem::swap(&mut a, &mut b);
            }
            if a == b {
                b.push('0');
            }
            ("range", a.clone(), Range::span(a.as_bytes(), b.as_bytes()))
        }
        _ => {
            // Up to the end of the prefix: "/rel/b/" .. "/rel0".
            let a = "/rel/b/".to_string();
            let end = prefix_end(PREFIX.as_bytes());
            ("range", a.clone(), Range::span(a.as_bytes(), &end))
        }
    };
    let start_revision = match class {
        Class::Churn => match rng.random_range(0..10) {
            0..=3 => 0,
            // Replays from inside the window, sometimes from just below it.
            4..=7 => (floor + rng.random_range(-3..=(head - floor).max(0))).max(1),
            // Future revisions.
            _ => head + rng.random_range(1..200),
        },
        _ => 0,
    };
    let filter = rng.random_range(0..6);
    SubSpec {
        id,
        class,
        key,
        form,
        range,
        start_revision,
        prev_kv: rng.random_bool(0.6),
        no_put: filter == 0,
        no_delete: filter == 1,
        progress_notify: rng.random_bool(0.5),
        may_compact: relist
            || matches!(class, Class::Slow | Class::Stuck)
            || (class == Class::Churn && start_revision > 0 && start_revision <= head),
    }
}

/// Records one message; returns the end if the stream ended.
fn record(
    log: &mut SubLog,
    m: etcd_cache::Result<Option<etcd_cache::WatchResponse>>,
) -> Option<End> {
    match m {
        Ok(Some(r)) => {
            // The header revision never goes down on a stream, and is at least the
            // revision of the events it carries.
            let header = r.header().map_or(0, |h| h.revision());
            if header != r.revision() || header < log.last_header {
                log.header_violations.push(format!(
                    "header revision {header} (revision() {}) after {}",
                    r.revision(),
                    log.last_header
                ));
            }
            log.last_header = log.last_header.max(header);
            if r.canceled() {
                return Some(if r.compact_revision() > 0 {
                    End::Compacted(r.compact_revision())
                } else {
                    End::Error(format!("canceled: {}", r.cancel_reason()))
                });
            }
            if r.created() {
                log.responses.push(Resp::Created(r.revision()));
            } else if r.is_progress_notify() {
                log.responses.push(Resp::Progress(r.revision()));
            } else {
                let revision = r.events().first().map_or(0, |e| e.revision());
                if header < revision {
                    log.header_violations.push(format!(
                        "header revision {header} below its events' {revision}"
                    ));
                }
                log.responses.push(Resp::Events(
                    revision,
                    r.events().iter().map(Ev::from_cache).collect(),
                ));
            }
            None
        }
        Ok(None) => Some(End::Ended),
        Err(e) => Some(End::Error(e.to_string())),
    }
}

async fn subscriber(cache: Cache, spec: SubSpec, mut drain: watch::Receiver<i64>) -> SubLog {
    let mut rng = StdRng::seed_from_u64(spec.id as u64 ^ 0xfeed);
    let mut log = SubLog {
        spec: spec.clone(),
        responses: Vec::new(),
        end: End::Drained,
        last_header: 0,
        header_violations: Vec::new(),
    };
    let mut stream = match cache.watch(spec.key.clone(), Some(spec.options())).await {
        Ok(s) => s,
        Err(e) => {
            log.end = End::OpenFailed(e.to_string());
            return log;
        }
    };
    // Churn subscribers are dropped after a few messages or a while: replays from an
    // old revision are often cut in the middle.
    let life_msgs = rng.random_range(1..60usize);
    let life_until = Instant::now() + Duration::from_millis(rng.random_range(50..4000));
    if *drain.borrow() == 0 {
        loop {
            match spec.class {
                Class::Fast | Class::Churn => {
                    tokio::select! {
                        biased;
                        _ = drain.changed() => break,
                        m = stream.message() => if let Some(end) = record(&mut log, m) {
                            log.end = end;
                            return log;
                        },
                        _ = sleep_until_opt(spec.class == Class::Churn, life_until) => {}
                    }
                    if spec.class == Class::Churn
                        && (log.responses.len() >= life_msgs || Instant::now() >= life_until)
                    {
                        drop(stream);
                        log.end = End::Dropped;
                        return log;
                    }
                }
                Class::Slow => {
                    tokio::select! {
                        _ = drain.changed() => break,
                        _ = sleep(Duration::from_secs(1)) => {
                            if let Ok(m) = timeout(Duration::from_millis(20), stream.message()).await {
                                if let Some(end) = record(&mut log, m) {
                                    log.end = end;
                                    return log;
                                }
                            }
                        }
                    }
                }
                Class::Stuck => {
                    let _ = drain.changed().await;
                    break;
                }
            }
        }
    }
    // The final drain: everything up to the sentinel must arrive, then a progress
    // response that promises it. A watch from beyond the sentinel is owed nothing up to
    // it, and its stream-wide progress is not answered until the cache reaches its start
    // (fixed etcd drops such a request: etcd#20221): drained as it is.
    let target = *drain.borrow();
    if spec.start_revision > target {
        return log;
    }
    let _ = stream.request_progress().await;
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        match tokio::time::timeout_at(deadline, stream.message()).await {
            Err(_) => {
                log.end = End::DrainTimeout;
                return log;
            }
            Ok(m) => {
                if let Some(end) = record(&mut log, m) {
                    log.end = end;
                    return log;
                }
                if let Some(Resp::Progress(p)) = log.responses.last() {
                    if *p >= target {
                        log.end = End::Drained;
                        return log;
                    }
                    let _ = stream.request_progress().await;
                }
            }
        }
    }
}

async fn sleep_until_opt(on: bool, at: Instant) {
    if on {
        tokio::time::sleep_until(at).await
    } else {
        std::future::pending().await
    }
}

/// The seeded random workload: puts, deletes, range deletes, multi-key transactions and
/// leased keys that expire, inside and outside the prefix. Writes go straight to etcd.
pub async fn writer(
    seed: u64,
    direct: Arc<Mutex<Vec<String>>>,
    pause: Duration,
    counters: Arc<Counters>,
    mut stop: watch::Receiver<bool>,
) {
    use etcd_client::{DeleteOptions, PutOptions, Txn, TxnOp};
    let mut rng = StdRng::seed_from_u64(seed);
    let eps = direct.lock().clone();
    let mut client = connect(&eps).await;
    let mut n = 0u64;
    let mut failures = 0u32;
    while !*stop.borrow() {
        n += 1;
        let value = format!("{seed:x}-{n}");
        let key = |rng: &mut StdRng| {
            if rng.random_bool(0.75) {
                inside_key(rng)
            } else {
                OUTSIDE[rng.random_range(0..OUTSIDE.len())].to_string()
            }
        };
        let op = rng.random_range(0..100);
        let res: Result<i64, etcd_client::Error> = timeout(Duration::from_secs(3), async {
            match op {
                0..=44 => client
                    .put(key(&mut rng), value, None)
                    .await
                    .map(|r| r.header().map_or(0, |h| h.revision())),
                45..=59 => client
                    .delete(key(&mut rng), None)
                    .await
                    .map(|r| r.header().map_or(0, |h| h.revision())),
                60..=63 => {
                    let d = INSIDE_DIRS[rng.random_range(0..INSIDE_DIRS.len())];
                    client
                        .delete(d, Some(DeleteOptions::new().with_prefix()))
                        .await
                        .map(|r| r.header().map_or(0, |h| h.revision()))
                }
                64..=89 => {
                    let mut keys: Vec<String> =
                        (0..rng.random_range(2..5)).map(|_| key(&mut rng)).collect();
                    keys.sort();
                    keys.dedup();
                    let ops: Vec<TxnOp> = keys
                        .into_iter()
                        .enumerate()
                        .map(|(i, k)| {
                            if rng.random_bool(0.3) {
                                TxnOp::delete(k, None)
                            } else {
                                TxnOp::put(k, format!("{value}.{i}"), None)
                            }
                        })
                        .collect();
                    client
                        .txn(Txn::new().and_then(ops))
                        .await
                        .map(|r| r.header().map_or(0, |h| h.revision()))
                }
                _ => {
                    let lease = client.lease_grant(2, None).await?.id();
                    let mut keys: Vec<String> = (0..rng.random_range(1..4))
                        .map(|_| inside_key(&mut rng))
                        .collect();
                    keys.sort();
                    keys.dedup();
                    let ops: Vec<TxnOp> = keys
                        .into_iter()
                        .map(|k| {
                            TxnOp::put(
                                k,
                                format!("{value}.lease"),
                                Some(PutOptions::new().with_lease(lease)),
                            )
                        })
                        .collect();
                    client
                        .txn(Txn::new().and_then(ops))
                        .await
                        .map(|r| r.header().map_or(0, |h| h.revision()))
                }
            }
        })
        .await
        .unwrap_or_else(|_| Err(etcd_client::Error::InvalidArgs("timeout".into())));
        match res {
            Ok(rev) => {
                counters.last_ack.fetch_max(rev, Ordering::Relaxed);
                failures = 0;
                counters.writes_ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                failures += 1;
                counters.writes_failed.fetch_add(1, Ordering::Relaxed);
                if failures >= 2 {
                    // Reconnect to whatever is alive now.
                    let eps = direct.lock().clone();
                    tokio::select! {
                        c = connect(&eps) => client = c,
                        _ = stop.wait_for(|s| *s) => return,
                    }
                } else {
                    sleep(Duration::from_millis(100)).await;
                }
            }
        }
        tokio::select! {
            _ = sleep(pause) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Reads from the cache (latest consistent, and serializable at random revisions inside
/// the window), each compared afterwards with the truth and, when it can be read, with
/// etcd's own answer at the same revision.
async fn reader(
    seed: u64,
    cache: Cache,
    direct: Arc<Mutex<Vec<String>>>,
    gets: Arc<Mutex<Vec<GetRecord>>>,
    counters: Arc<Counters>,
    violations: Arc<Mutex<Vec<Violation>>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9e7);
    let eps = direct.lock().clone();
    let mut etcd = connect(&eps).await;
    loop {
        tokio::select! {
            _ = sleep(Duration::from_millis(rng.random_range(20..120))) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let (key, range, spec): (String, Range, u8) = match rng.random_range(0..3) {
            0 => (PREFIX.into(), Range::prefix(PREFIX.as_bytes()), 0),
            1 => {
                let d = INSIDE_DIRS[rng.random_range(0..INSIDE_DIRS.len())];
                (d.into(), Range::prefix(d.as_bytes()), 0)
            }
            _ => {
                let k = inside_key(&mut rng);
                (k.clone(), Range::single(k.as_bytes()), 1)
            }
        };
        let limit = if rng.random_bool(0.3) {
            rng.random_range(1..5)
        } else {
            0
        };
        let (floor, head) = cache.history_span();
        let requested = if rng.random_bool(0.5) || head < floor {
            0
        } else {
            rng.random_range((floor - 1).max(1)..=head)
        };
        let mut opts = GetOptions::new().with_limit(limit);
        let mut eopts = etcd_client::GetOptions::new().with_limit(limit);
        if spec == 0 {
            opts = opts.with_prefix();
            eopts = eopts.with_range(range.end.clone());
        }
        if requested > 0 {
            opts = opts.with_revision(requested).with_serializable();
        }
        // A consistent read must reflect at least every write acknowledged before it.
        let min_rev = if requested == 0 {
            counters.last_ack.load(Ordering::Relaxed)
        } else {
            0
        };
        let res = timeout(Duration::from_secs(10), cache.get(key.clone(), Some(opts))).await;
        let resp = match res {
            Ok(Ok(r)) => r,
            Ok(Err(Error::Compacted { .. })) => {
                counters.gets_compacted.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            other => {
                // A serializable read at a revision the cache has applied is answered
                // from memory: only Compacted may stop it, whatever etcd is doing.
                if requested > 0 {
                    violations.lock().push(Violation {
                        guarantee: "get",
                        sub: None,
                        detail: format!(
                            "serializable get {range:?} at {requested} (applied {head}): {:?}",
                            other.map(|r| r.map(|r| r.revision()))
                        ),
                    });
                }
                counters.gets_failed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        counters.gets_ok.fetch_add(1, Ordering::Relaxed);
        let at = if requested > 0 {
            requested
        } else {
            resp.revision()
        };
        let etcd_answer = etcd_answer(&mut etcd, key.clone(), eopts, at).await;
        gets.lock().push(GetRecord {
            range,
            requested,
            limit,
            at,
            kvs: resp.kvs().iter().map(Kv::from_cache).collect(),
            count: resp.count(),
            more: resp.more(),
            etcd: etcd_answer,
            min_rev,
        });
    }
}

/// etcd's own answer to a read at `at` (kvs, count, more), or `None` if etcd did not
/// answer within 2 s: what a read's answer is compared with.
pub async fn etcd_answer(
    etcd: &mut etcd_client::Client,
    key: impl Into<Vec<u8>>,
    options: etcd_client::GetOptions,
    at: i64,
) -> Option<(Vec<Kv>, i64, bool)> {
    let get = etcd.get(key, Some(options.with_revision(at)));
    let r = timeout(Duration::from_secs(2), get).await.ok()?.ok()?;
    Some((
        r.kvs().iter().map(Kv::from_etcd).collect(),
        r.count(),
        r.more(),
    ))
}

/// Samples the cache's stats: the history never holds more than its window.
async fn monitor(
    cache: Cache,
    window: usize,
    counters: Arc<Counters>,
    violations: Arc<Mutex<Vec<Violation>>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let s = cache.stats();
        counters
            .max_history_len
            .fetch_max(s.history_len, Ordering::Relaxed);
        counters.max_lagging.fetch_max(s.lagging, Ordering::Relaxed);
        counters
            .max_watchers
            .fetch_max(s.watchers, Ordering::Relaxed);
        if s.history_len > window {
            violations.lock().push(Violation {
                guarantee: "memory",
                sub: None,
                detail: format!("history holds {} batches > window {window}", s.history_len),
            });
        }
        if s.lagging > s.watchers + 64 {
            // (sampled without a lock; a counter leak or underflow shows as a huge gap)
            violations.lock().push(Violation {
                guarantee: "memory",
                sub: None,
                detail: format!("{} lagging > {} watchers", s.lagging, s.watchers),
            });
        }
        tokio::select! {
            _ = sleep(Duration::from_millis(50)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
