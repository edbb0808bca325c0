//! A million watches through one etcd-cache-proxy: C client connections x W watches each,
//! opened by this process, against a cache of K keys, then puts that each match about 1%
//! of the watches.
//!
//! ```text
//! cargo xtask bench million                          # C=10,000 x W=100 = 1,000,000 watches
//! cargo xtask bench million --quick                  # C=100 x W=100, K=10,000
//! cargo bench --bench million -- --conns 2000 --watches 100 --keys 100000 --burst 1000
//! cargo bench --bench million -- --fronts etcd,cache-proxy,grpc-proxy   # each in turn
//! ```
//!
//! One etcd on loopback (started here) holds K keys `/m/k000000`... (64-byte values). The
//! front under test is started with its default flags and `--prefix /m/` (etcd-cache-proxy)
//! or as `etcd grpc-proxy start`; `--fronts etcd` runs the same watches straight to etcd,
//! the reference for what each watch must get. Each connection is its own
//! etcd-client `Client` (its own HTTP/2 connection) with one Watch stream of W watches, a
//! mix of what services watch: 1 on the whole prefix, up to 9 on a small prefix (10 keys),
//! the rest on exact keys, keys and prefixes drawn from a fixed seed. With C = 10,000 a put
//! matches the 10,000 whole-prefix watches plus about 18 others: 1% of a million.
//!
//! The load generator is this process: one tokio runtime with 2 workers reads every
//! stream (one task per connection); the writer is its own thread with its own runtime and
//! connection straight to etcd. Rust and etcd-client, as the fan-out bench, so that the
//! figures compare; it shares the 2 cores with the proxy and etcd, and its own CPU is
//! reported beside theirs.
//!
//! What it reports:
//! - the time to open every connection (with its first watch) and then every watch, and
//!   the proxy's RSS before, after the connections and after the watches: RSS per
//!   connection and per watch;
//! - etcd's own watcher count (`etcd_debugging_mvcc_watcher_total`);
//! - 5 s with every watch open and nothing written: the CPU of the front, the clients
//!   and etcd;
//! - `--singles` puts one at a time, each waited for at every watch that matches it:
//!   put -> delivery p50/p99/max over every delivery;
//! - a burst of `--burst` puts, 16 in flight: time until every delivery arrived,
//!   deliveries/s, proxy CPU per delivery;
//! - `--paced` puts (1,000) at `--rate` puts/s (100), each matching about 1% of the
//!   watches: put -> delivery p50/p99/max, the front's CPU per delivery and etcd's CPU per
//!   put, beside etcd's CPU per put for the same puts written before any front runs (etcd
//!   with no watcher at all);
//! - `--stalled` puts (1,000) written while every odd connection stops reading: the
//!   reading half's time and latency, the front's RSS before, at its peak and 5 s later;
//!   then the stalled half reads again and must get every event;
//! - each watch got every event of its keys once, in revision order, and none was
//!   canceled: anything else fails the run (exit code 1). Slowness is reported, never
//!   failed; a front that cannot open every watch within `--open-timeout` is reported with
//!   how many it opened, and for the peer that is a result, not a failure.
//!
//! Open files: each connection is a descriptor here and one in the front; the run stops at
//! once, naming the limit, when `ulimit -n` is below C + 1,024.
//!
//! Run by `cargo test --all-targets` (no `--bench` argument) it only prints that it skipped.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::latency::{now_ns, percentiles, record, reset_stats, total_deliveries};
use common::proc::{clk_tck, cpu_ticks, status_kib};
use etcd_client::{EventType, WatchOptions, WatchStream};
use futures::StreamExt;

const PREFIX: &str = "/m/";
const VALUE_SIZE: usize = 64;
const IN_FLIGHT: usize = 16;
/// Connections set up at once.
const OPEN_CONCURRENCY: usize = 64;
/// Keys per small prefix: `/m/k00001` holds `/m/k000010`..`/m/k000019`.
const GROUP: usize = 10;
/// Small-prefix watches per connection (after the whole-prefix one).
const SMALL_PER_CONN: usize = 9;
const SEED: u64 = 0x6d69_6c6c_696f_6e21;
/// A run fails once no delivery arrived for this long while some are missing.
const STALL: Duration = Duration::from_secs(60);
/// How long every watch is held open with nothing written, for the idle cost.
const IDLE: Duration = Duration::from_secs(5);

struct Opts {
    conns: usize,
    watches: usize,
    keys: usize,
    singles: usize,
    burst: usize,
    /// Puts written while half the connections stop reading.
    stalled: usize,
    /// Puts written at `rate` per second after the burst.
    paced: usize,
    rate: usize,
    open_timeout: Duration,
    /// Run straight to etcd, then etcd-cache-proxy, then grpc-proxy.
    etcd: bool,
    cache_proxy: bool,
    grpc_proxy: bool,
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = if common::quick() {
        Opts {
            conns: 100,
            watches: 100,
            keys: 10_000,
            singles: 20,
            burst: 1000,
            stalled: 1000,
            paced: 100,
            rate: 100,
            open_timeout: Duration::from_secs(120),
            etcd: false,
            cache_proxy: true,
            grpc_proxy: false,
        }
    } else {
        Opts {
            conns: 10_000,
            watches: 100,
            keys: 100_000,
            singles: 20,
            burst: 1000,
            stalled: 1000,
            paced: 1000,
            rate: 100,
            open_timeout: Duration::from_secs(900),
            etcd: false,
            cache_proxy: true,
            grpc_proxy: false,
        }
    };
    let mut it = std::env::args().skip(1);
    let num = |v: Option<String>, what: &str| -> Result<usize, String> {
        v.and_then(|v| v.replace('_', "").parse().ok())
            .ok_or(format!("{what} needs a number"))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--conns" => o.conns = num(it.next(), "--conns")?,
            "--watches" => o.watches = num(it.next(), "--watches")?,
            "--keys" => o.keys = num(it.next(), "--keys")?,
            "--singles" => o.singles = num(it.next(), "--singles")?,
            "--burst" => o.burst = num(it.next(), "--burst")?,
            "--stalled" => o.stalled = num(it.next(), "--stalled")?,
            "--paced" => o.paced = num(it.next(), "--paced")?,
            "--rate" => o.rate = num(it.next(), "--rate")?,
            "--open-timeout" => {
                o.open_timeout = Duration::from_secs(num(it.next(), "--open-timeout")? as u64)
            }
            "--fronts" => {
                (o.etcd, o.cache_proxy, o.grpc_proxy) = (false, false, false);
                for f in it.next().ok_or("--fronts needs a list")?.split(',') {
                    match f.trim() {
                        "etcd" => o.etcd = true,
                        "cache-proxy" => o.cache_proxy = true,
                        "grpc-proxy" => o.grpc_proxy = true,
                        other => {
                            return Err(format!(
                                "unknown front {other} (etcd, cache-proxy, grpc-proxy)"
                            ))
                        }
                    }
                }
            }
            // What cargo bench passes to every bench target (--bench, filters) is ignored.
            _ => {}
        }
    }
    if o.conns == 0 || o.watches == 0 {
        return Err("--conns and --watches must be at least 1".into());
    }
    if o.rate == 0 || o.rate > 10_000 {
        return Err(format!("--rate must be 1 to 10000 puts/s, not {}", o.rate));
    }
    if o.keys < GROUP || o.keys % GROUP != 0 || o.keys > 1_000_000 {
        // Keys are six digits, and a small prefix is a key's first five.
        return Err(format!(
            "--keys must be a multiple of {GROUP} from {GROUP} to 1000000"
        ));
    }
    Ok(o)
}

/// splitmix64: the same watches and puts on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn key(i: usize) -> String {
    format!("{PREFIX}k{i:06}")
}

/// What one watch covers.
#[derive(Clone, Copy)]
enum Target {
    Whole,
    /// Keys `g * GROUP .. (g + 1) * GROUP`.
    Group(usize),
    Key(usize),
}

impl Target {
    fn matches(self, key: &[u8]) -> bool {
        let (k, o) = self.request();
        if o.is_some() {
            key.starts_with(k.as_bytes())
        } else {
            key == k.as_bytes()
        }
    }

    fn request(self) -> (String, Option<WatchOptions>) {
        match self {
            Target::Whole => (PREFIX.to_string(), Some(WatchOptions::new().with_prefix())),
            Target::Group(g) => (
                format!("{PREFIX}k{g:05}"),
                Some(WatchOptions::new().with_prefix()),
            ),
            Target::Key(k) => (key(k), None),
        }
    }
}

/// Every connection's watches and the puts, drawn from [`SEED`].
struct Plan {
    conns: Vec<Vec<Target>>,
    singles: Vec<usize>,
    burst: Vec<usize>,
    /// Written at a fixed rate after the burst.
    paced: Vec<usize>,
    /// Written while every odd connection stops reading.
    stalled: Vec<usize>,
    /// Puts per key and per group over the singles and the burst.
    puts_per_key: Vec<u32>,
    puts_per_group: Vec<u32>,
    /// Watches matching each key (to wait for a single put's deliveries).
    matching: Vec<u32>,
}

impl Plan {
    fn new(o: &Opts) -> Plan {
        let mut rng = Rng(SEED);
        let groups = o.keys / GROUP;
        let mut exact = vec![0u32; o.keys];
        let mut small = vec![0u32; groups];
        let conns = (0..o.conns)
            .map(|_| {
                (0..o.watches)
                    .map(|j| match j {
                        0 => Target::Whole,
                        j if j <= SMALL_PER_CONN => {
                            let g = rng.below(groups);
                            small[g] += 1;
                            Target::Group(g)
                        }
                        _ => {
                            let k = rng.below(o.keys);
                            exact[k] += 1;
                            Target::Key(k)
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let singles: Vec<usize> = (0..o.singles).map(|_| rng.below(o.keys)).collect();
        let burst: Vec<usize> = (0..o.burst).map(|_| rng.below(o.keys)).collect();
        let stalled: Vec<usize> = (0..o.stalled).map(|_| rng.below(o.keys)).collect();
        // Drawn last, so that the other puts are those of the runs before it existed.
        let paced: Vec<usize> = (0..o.paced).map(|_| rng.below(o.keys)).collect();
        let mut puts_per_key = vec![0u32; o.keys];
        let mut puts_per_group = vec![0u32; groups];
        for &k in singles.iter().chain(&burst).chain(&paced).chain(&stalled) {
            puts_per_key[k] += 1;
            puts_per_group[k / GROUP] += 1;
        }
        let whole = o.conns as u32;
        let matching = (0..o.keys)
            .map(|k| whole + exact[k] + small[k / GROUP])
            .collect();
        Plan {
            conns,
            singles,
            burst,
            paced,
            stalled,
            puts_per_key,
            puts_per_group,
            matching,
        }
    }

    fn want(&self, t: Target) -> u64 {
        match t {
            Target::Whole => {
                (self.singles.len() + self.burst.len() + self.paced.len() + self.stalled.len())
                    as u64
            }
            Target::Group(g) => self.puts_per_group[g] as u64,
            Target::Key(k) => self.puts_per_key[k] as u64,
        }
    }

    /// What watch `t` wants of the puts `per_key` counts.
    fn want_of(t: Target, per_key: &HashMap<usize, u64>, written: usize) -> u64 {
        match t {
            Target::Whole => written as u64,
            Target::Group(g) => (g * GROUP..(g + 1) * GROUP)
                .map(|k| per_key.get(&k).copied().unwrap_or(0))
                .sum(),
            Target::Key(k) => per_key.get(&k).copied().unwrap_or(0),
        }
    }

    /// The puts written before the stalled ones, in order: the singles, the burst, the
    /// paced.
    fn before_stalled(&self) -> Vec<usize> {
        (self.singles.iter().chain(&self.burst).chain(&self.paced))
            .copied()
            .collect()
    }

    /// Events the connections of parity `half` (0: even, 1: odd) want of `written`.
    fn wanted(&self, written: &[usize], half: usize) -> u64 {
        let mut per_key = HashMap::<usize, u64>::new();
        for &k in written {
            *per_key.entry(k).or_default() += 1;
        }
        self.conns
            .iter()
            .skip(half)
            .step_by(2)
            .flatten()
            .map(|&t| Self::want_of(t, &per_key, written.len()))
            .sum()
    }

    /// Events the connections of parity `half` got so far.
    fn got(&self, seen: &[Arc<[AtomicU64]>], half: usize) -> u64 {
        seen.iter()
            .skip(half)
            .step_by(2)
            .flat_map(|s| s.iter())
            .map(|a| a.load(Ordering::Relaxed))
            .sum()
    }

    /// The watches (up to 5) that saw fewer events than `written` puts to their keys, as
    /// `connection/watch target got/wanted`.
    fn short(&self, seen: &[Arc<[AtomicU64]>], written: &[usize]) -> String {
        let mut per_key = HashMap::<usize, u64>::new();
        for &k in written {
            *per_key.entry(k).or_default() += 1;
        }
        let want = |t: Target| Self::want_of(t, &per_key, written.len());
        let mut out = Vec::new();
        let mut count = 0;
        for (c, (targets, got)) in self.conns.iter().zip(seen).enumerate() {
            for (j, &t) in targets.iter().enumerate() {
                let (g, w) = (got[j].load(Ordering::Relaxed), want(t));
                if g < w {
                    count += 1;
                    if out.len() < 5 {
                        let dup = targets
                            .iter()
                            .filter(|&&o| o.request().0 == t.request().0)
                            .count();
                        out.push(format!(
                            "{c}/{j} {} {g}/{w} ({dup} watch(es) of it on the stream)",
                            t.request().0
                        ));
                    }
                }
            }
        }
        format!("{count} watches, e.g. {}", out.join(", "))
    }

    fn deliveries(&self, puts: &[usize]) -> u64 {
        puts.iter().map(|&k| self.matching[k] as u64).sum()
    }
}

/// The soft limit on open files (`ulimit -n`), from /proc.
fn open_files_limit() -> Option<u64> {
    std::fs::read_to_string("/proc/self/limits")
        .ok()?
        .lines()
        .find(|l| l.starts_with("Max open files"))?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()
}

/// etcd's own count of its watchers.
fn etcd_watchers(etcd: &testkit::EtcdServer) -> String {
    testkit::http_request(
        etcd.client_addr(),
        "GET",
        "/metrics",
        None,
        Duration::from_secs(10),
    )
    .ok()
    .and_then(|(_, body)| {
        body.lines()
            .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_watcher_total "))
            .map(|v| v.trim().to_string())
    })
    .unwrap_or_else(|| "?".into())
}

/// Loads the K keys, 128 puts per txn.
async fn load_keys(ep: &str, keys: usize) -> Result<(), String> {
    let mut c = testkit::Connect::plain()
        .try_client(&[ep])
        .await
        .map_err(|e| e.to_string())?;
    let value = vec![b'v'; VALUE_SIZE];
    for chunk in (0..keys).collect::<Vec<_>>().chunks(128) {
        let ops: Vec<etcd_client::TxnOp> = chunk
            .iter()
            .map(|&i| etcd_client::TxnOp::put(key(i), value.clone(), None))
            .collect();
        c.txn(etcd_client::Txn::new().and_then(ops))
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// One connection: its client, its stream, and which watch id is which target.
struct Conn {
    /// Its index in the plan.
    no: usize,
    _client: etcd_client::Client,
    stream: WatchStream,
    targets: Vec<Target>,
    ids: HashMap<i64, usize>,
}

/// Waits for `n` created responses on `stream`, numbering them from `first`.
async fn await_created(
    stream: &mut WatchStream,
    ids: &mut HashMap<i64, usize>,
    first: usize,
    n: usize,
) -> Result<(), String> {
    let mut created = 0;
    while created < n {
        match stream.message().await.map_err(|e| e.to_string())? {
            Some(r) if r.canceled() => {
                return Err(format!("watch create refused: {}", r.cancel_reason()))
            }
            Some(r) if r.created() => {
                ids.insert(r.watch_id(), first + created);
                created += 1;
            }
            Some(_) => {}
            None => return Err("watch stream ended during set-up".into()),
        }
    }
    Ok(())
}

/// Opens the connection and its first watch.
async fn open_conn(ep: String, no: usize, targets: Vec<Target>) -> Result<Conn, String> {
    let mut client = testkit::Connect::plain()
        .try_client(&[&ep])
        .await
        .map_err(|e| e.to_string())?;
    let (k, o) = targets[0].request();
    let mut stream = client.watch(k, o).await.map_err(|e| e.to_string())?;
    let mut ids = HashMap::with_capacity(targets.len());
    await_created(&mut stream, &mut ids, 0, 1).await?;
    Ok(Conn {
        no,
        _client: client,
        stream,
        targets,
        ids,
    })
}

/// Opens the connection's other watches on its stream.
async fn open_rest(mut c: Conn) -> Result<Conn, String> {
    for t in &c.targets[1..] {
        let (k, o) = t.request();
        c.stream.watch(k, o).await.map_err(|e| e.to_string())?;
    }
    let n = c.targets.len() - 1;
    await_created(&mut c.stream, &mut c.ids, 1, n).await?;
    Ok(c)
}

/// Runs `open` on each of `items`, [`OPEN_CONCURRENCY`] at a time, until `deadline`.
/// `(first, step)` count `what` as opened: `first`, then `step` per item done (for the
/// message when time runs out).
async fn open_all<T, F, Fut>(
    items: impl IntoIterator<Item = T>,
    deadline: tokio::time::Instant,
    (first, step): (usize, usize),
    what: &str,
    open: F,
) -> Result<Vec<Conn>, String>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<Conn, String>>,
{
    let opened = AtomicUsize::new(first);
    let all = futures::stream::iter(items.into_iter().map(|item| {
        let (opened, c) = (&opened, open(item));
        async move {
            let c = c.await?;
            opened.fetch_add(step, Ordering::Relaxed);
            Ok::<_, String>(c)
        }
    }))
    .buffer_unordered(OPEN_CONCURRENCY)
    .collect::<Vec<_>>();
    let timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
    match tokio::time::timeout_at(deadline, all).await {
        Ok(v) => v.into_iter().collect(),
        Err(_) => Err(format!(
            "{} {what} opened, time ran out ({timeout:?} left at the start)",
            opened.load(Ordering::Relaxed)
        )),
    }
}

/// Reads a connection until each of its watches got what the plan puts to its keys:
/// every event once, in revision order, none canceled.
async fn read_conn(
    mut c: Conn,
    wants: Vec<u64>,
    seen: Arc<[AtomicU64]>,
    mut pause: tokio::sync::watch::Receiver<bool>,
) -> Result<(), String> {
    let mut got = vec![0u64; wants.len()];
    let mut last = vec![0i64; wants.len()];
    let mut open = wants.iter().filter(|&&w| w > 0).count();
    while open > 0 {
        while *pause.borrow_and_update() {
            if pause.changed().await.is_err() {
                break;
            }
        }
        let r = match c.stream.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return Err("a watch stream ended".into()),
            Err(e) => return Err(format!("a watch stream failed: {e}")),
        };
        if r.canceled() {
            return Err(format!("a watch was canceled: {}", r.cancel_reason()));
        }
        if r.events().is_empty() {
            continue;
        }
        let i = *c
            .ids
            .get(&r.watch_id())
            .ok_or(format!("events for unknown watch id {}", r.watch_id()))?;
        let now = now_ns();
        for ev in r.events() {
            let kv = ev.kv().ok_or("an event without a kv")?;
            if ev.event_type() != EventType::Put {
                return Err("an event that is not a put".into());
            }
            if kv.mod_revision() <= last[i] {
                return Err(format!(
                    "watch {i}: revision {} after {}",
                    kv.mod_revision(),
                    last[i]
                ));
            }
            if !c.targets[i].matches(kv.key()) {
                return Err(format!(
                    "watch {i} ({}) got an event of {}",
                    c.targets[i].request().0,
                    String::from_utf8_lossy(kv.key())
                ));
            }
            last[i] = kv.mod_revision();
            let sent = kv
                .value()
                .get(..8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                .unwrap_or(0);
            record(sent, now, 1);
        }
        got[i] += r.events().len() as u64;
        seen[i].store(got[i], Ordering::Relaxed);
        if got[i] > wants[i] {
            return Err(format!(
                "watch {i} ({:?}): {} events, {} written",
                c.targets[i].request().0,
                got[i],
                wants[i]
            ));
        }
        if got[i] == wants[i] {
            open -= 1;
        }
    }
    Ok(())
}

/// Puts `keys` straight to etcd, `in_flight` at a time, each value stamped with its send
/// time; on its own thread and runtime. Returns the elapsed time.
fn write(ep: &str, keys: Vec<usize>, in_flight: usize) -> Result<Duration, String> {
    write_as(ep, keys, Pace::InFlight(in_flight))
}

/// Puts `keys` at `rate` per second (each sent on its tick, whether or not the ones
/// before it were answered); the time until the last was answered.
fn write_paced(ep: &str, keys: Vec<usize>, rate: usize) -> Result<Duration, String> {
    write_as(ep, keys, Pace::Rate(rate))
}

/// How [`write_as`] sends its puts.
enum Pace {
    InFlight(usize),
    Rate(usize),
}

fn write_as(ep: &str, keys: Vec<usize>, pace: Pace) -> Result<Duration, String> {
    let ep = ep.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let client = testkit::Connect::plain()
                .try_client(&[&ep])
                .await
                .map_err(|e| e.to_string())?;
            let put = move |k: usize| {
                let mut c = client.clone();
                async move {
                    let mut value = vec![b'v'; VALUE_SIZE];
                    value[..8].copy_from_slice(&now_ns().to_le_bytes());
                    c.put(key(k), value, None)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
            };
            let t = Instant::now();
            match pace {
                Pace::InFlight(n) => {
                    let mut puts =
                        futures::stream::iter(keys.into_iter().map(put)).buffer_unordered(n);
                    while let Some(r) = puts.next().await {
                        r?;
                    }
                }
                Pace::Rate(rate) => {
                    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate as u32);
                    let mut puts = Vec::with_capacity(keys.len());
                    for k in keys {
                        tick.tick().await;
                        puts.push(tokio::spawn(put(k)));
                    }
                    for p in puts {
                        p.await.map_err(|e| e.to_string())??;
                    }
                }
            }
            Ok(t.elapsed())
        })
    })
    .join()
    .map_err(|_| "the writer panicked".to_string())?
}

/// What the readers that stopped found wrong, in order.
static READER_ERRORS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// The first readers' errors, for a run that stalled.
fn reader_errors() -> String {
    let e = READER_ERRORS.lock().expect("not poisoned");
    match e.len() {
        0 => "no reader stopped".into(),
        n => format!("{n} readers stopped: {}", e[..n.min(3)].join("; ")),
    }
}

/// Waits until `count()` reaches `total`; fails once it did not move for [`STALL`], saying
/// how far it got and what stopped readers found.
async fn wait_count(count: impl Fn() -> u64, total: u64) -> Result<(), String> {
    let t = Instant::now();
    let (mut seen, mut moved) = (count(), Instant::now());
    while seen < total {
        if moved.elapsed() > STALL {
            return Err(format!(
                "{seen} of {total}, none for {STALL:?} ({:.0} s in all); {}",
                t.elapsed().as_secs_f64(),
                reader_errors()
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = count();
        if now != seen {
            (seen, moved) = (now, Instant::now());
        }
    }
    Ok(())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn cpu_s(pid: Option<u32>) -> f64 {
    cpu_ticks(pid) as f64 / clk_tck()
}

/// One front's run. `Ok(None)`: it could not open every watch in time (reported).
async fn run(
    label: &str,
    front: &str,
    front_pid: Option<u32>,
    etcd: &testkit::EtcdServer,
    plan: &Plan,
    o: &Opts,
) -> Result<Option<()>, String> {
    let n = o.conns * o.watches;
    println!(
        "\n== {label}: {} connections x {} watches = {n}",
        o.conns, o.watches
    );
    let rss0 = status_kib(front_pid, "VmRSS");
    let t = Instant::now();
    let deadline = tokio::time::Instant::now() + o.open_timeout;
    let items = plan.conns.iter().cloned().enumerate();
    let conns = open_all(items, deadline, (0, 1), "connections", |(no, targets)| {
        open_conn(front.to_string(), no, targets)
    })
    .await;
    let conns = match conns {
        Ok(c) => c,
        Err(e) => {
            println!("{label}: could not open every connection: {e}");
            return Ok(None);
        }
    };
    let conns_took = t.elapsed();
    let rss1 = status_kib(front_pid, "VmRSS");
    println!(
        "{} connections, each with its first watch, in {:.1} s",
        o.conns,
        conns_took.as_secs_f64()
    );
    let t2 = Instant::now();
    let rest = open_all(
        conns,
        deadline,
        (o.conns, o.watches - 1),
        "watches",
        open_rest,
    )
    .await;
    let mut conns = match rest {
        Ok(c) => c,
        Err(e) => {
            println!("{label}: could not open every watch: {e}");
            return Ok(None);
        }
    };
    let watches_took = t2.elapsed();
    // Opened out of order: back in the plan's, which `seen` and the halves follow.
    conns.sort_by_key(|c| c.no);
    let rss2 = status_kib(front_pid, "VmRSS");
    println!(
        "opened: {} connections in {:.1} s, then {n} watches in {:.1} s ({:.0} watches/s)",
        o.conns,
        conns_took.as_secs_f64(),
        watches_took.as_secs_f64(),
        n as f64 / (conns_took + watches_took).as_secs_f64()
    );
    println!(
        "{label} RSS: {:.0} MiB before, {:.0} MiB with the connections, {:.0} MiB with every \
         watch: {:.1} KiB per connection (with its first watch), {:.0} B per further watch",
        mib(rss0),
        mib(rss1),
        mib(rss2),
        rss1.saturating_sub(rss0) as f64 / o.conns as f64,
        rss2.saturating_sub(rss1) as f64 * 1024.0 / (n - o.conns).max(1) as f64
    );
    println!(
        "etcd watchers: {}; this process (the clients) RSS {:.0} MiB",
        etcd_watchers(etcd),
        mib(status_kib(None, "VmRSS"))
    );

    let mut seen = Vec::with_capacity(conns.len());
    // Every odd connection stops reading while `plan.stalled` is written.
    let (pause, paused) = tokio::sync::watch::channel(false);
    let (_never, reading) = tokio::sync::watch::channel(false);
    let readers: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let wants = c.targets.iter().map(|&t| plan.want(t)).collect();
            let s: Arc<[AtomicU64]> = c.targets.iter().map(|_| AtomicU64::new(0)).collect();
            seen.push(s.clone());
            let p = if i % 2 == 1 {
                paused.clone()
            } else {
                reading.clone()
            };
            tokio::spawn(async move {
                let r = read_conn(c, wants, s, p).await;
                if let Err(e) = &r {
                    READER_ERRORS.lock().expect("not poisoned").push(e.clone());
                }
                r
            })
        })
        .collect();
    // Every watch open and nothing written: what holding them costs.
    let (idle0, idle_own0, idle_etcd0) = (cpu_s(front_pid), cpu_s(None), cpu_s(etcd.pid()));
    tokio::time::sleep(IDLE).await;
    println!(
        "idle {:.0} s with every watch open: {label} CPU {:.2} s, clients {:.2} s, etcd {:.2} s",
        IDLE.as_secs_f64(),
        cpu_s(front_pid) - idle0,
        cpu_s(None) - idle_own0,
        cpu_s(etcd.pid()) - idle_etcd0
    );
    // One put at a time, each waited for at every watch it matches.
    reset_stats();
    let mut expected = 0;
    let (cpu0, own0) = (cpu_s(front_pid), cpu_s(None));
    for (i, &k) in plan.singles.iter().enumerate() {
        expected += plan.matching[k] as u64;
        let ep = etcd.endpoint();
        tokio::task::spawn_blocking(move || write(&ep, vec![k], 1))
            .await
            .map_err(|e| e.to_string())??;
        if let Err(e) = wait_count(total_deliveries, expected).await {
            return Err(format!(
                "{e}; short: {}",
                plan.short(&seen, &plan.singles[..=i])
            ));
        }
    }
    let p = percentiles(&[0.5, 0.99, 1.0]);
    let singles = plan.singles.len().max(1) as f64;
    println!(
        "{} single puts, {:.0} deliveries each: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; \
         CPU per put: {label} {:.1} ms, clients {:.1} ms",
        plan.singles.len(),
        expected as f64 / singles,
        p[0].as_secs_f64() * 1e3,
        p[1].as_secs_f64() * 1e3,
        p[2].as_secs_f64() * 1e3,
        (cpu_s(front_pid) - cpu0) * 1e3 / singles,
        (cpu_s(None) - own0) * 1e3 / singles
    );
    // The burst.
    reset_stats();
    let burst_deliveries = plan.deliveries(&plan.burst);
    let (cpu1, own1, etcd1) = (cpu_s(front_pid), cpu_s(None), cpu_s(etcd.pid()));
    let t = Instant::now();
    let keys = plan.burst.clone();
    let ep = etcd.endpoint();
    let wrote = tokio::task::spawn_blocking(move || write(&ep, keys, IN_FLIGHT))
        .await
        .map_err(|e| e.to_string())??;
    if let Err(e) = wait_count(total_deliveries, burst_deliveries).await {
        let written: Vec<usize> = plan.singles.iter().chain(&plan.burst).copied().collect();
        return Err(format!("{e}; short: {}", plan.short(&seen, &written)));
    }
    let took = t.elapsed();
    let p = percentiles(&[0.5, 0.99, 1.0]);
    let front_cpu = cpu_s(front_pid) - cpu1;
    println!(
        "burst of {} puts (written in {:.1} s): {burst_deliveries} deliveries in {:.1} s, \
         {:.0} deliveries/s; latency p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        plan.burst.len(),
        wrote.as_secs_f64(),
        took.as_secs_f64(),
        burst_deliveries as f64 / took.as_secs_f64(),
        p[0].as_secs_f64() * 1e3,
        p[1].as_secs_f64() * 1e3,
        p[2].as_secs_f64() * 1e3,
    );
    println!(
        "burst CPU: {label} {:.1} s ({:.0} ns per delivery), clients {:.1} s, etcd {:.1} s; \
         {label} RSS {:.0} MiB",
        front_cpu,
        front_cpu * 1e9 / burst_deliveries.max(1) as f64,
        cpu_s(None) - own1,
        cpu_s(etcd.pid()) - etcd1,
        mib(status_kib(front_pid, "VmRSS"))
    );
    if !plan.paced.is_empty() {
        paced(label, front_pid, etcd, plan, &seen, o.rate).await?;
    }
    if !plan.stalled.is_empty() {
        stalled_half(label, front_pid, etcd, plan, &seen, &pause).await?;
    }
    for r in readers {
        r.await.map_err(|e| e.to_string())??;
    }
    println!("every watch got each of its events once, in order; none canceled");
    Ok(Some(()))
}

/// `plan.paced` written at `rate` puts/s, each put's deliveries timed: the latency and
/// cost of a steady load rather than a burst.
async fn paced(
    label: &str,
    front_pid: Option<u32>,
    etcd: &testkit::EtcdServer,
    plan: &Plan,
    seen: &[Arc<[AtomicU64]>],
    rate: usize,
) -> Result<(), String> {
    reset_stats();
    let want = plan.deliveries(&plan.paced);
    let (cpu0, etcd0) = (cpu_s(front_pid), cpu_s(etcd.pid()));
    let keys = plan.paced.clone();
    let ep = etcd.endpoint();
    let wrote = tokio::task::spawn_blocking(move || write_paced(&ep, keys, rate))
        .await
        .map_err(|e| e.to_string())??;
    if let Err(e) = wait_count(total_deliveries, want).await {
        return Err(format!(
            "{e}; short: {}",
            plan.short(seen, &plan.before_stalled())
        ));
    }
    let p = percentiles(&[0.5, 0.99, 0.999, 1.0]);
    let n = plan.paced.len() as f64;
    println!(
        "{} puts at {rate}/s (written in {:.1} s), {:.0} deliveries each: p50 {:.1} ms, p99 \
         {:.1} ms, p99.9 {:.1} ms, max {:.1} ms; {label} CPU {:.0} ns per delivery, etcd CPU \
         {:.0} us per put",
        plan.paced.len(),
        wrote.as_secs_f64(),
        want as f64 / n,
        p[0].as_secs_f64() * 1e3,
        p[1].as_secs_f64() * 1e3,
        p[2].as_secs_f64() * 1e3,
        p[3].as_secs_f64() * 1e3,
        (cpu_s(front_pid) - cpu0) * 1e9 / want.max(1) as f64,
        (cpu_s(etcd.pid()) - etcd0) * 1e6 / n
    );
    Ok(())
}

/// Every odd connection stops reading while `plan.stalled` is written: the others must
/// get every event as fast as in the burst, and the front's memory stay bounded; then the
/// stalled half reads again and must get every event too (checked by the readers).
async fn stalled_half(
    label: &str,
    front_pid: Option<u32>,
    etcd: &testkit::EtcdServer,
    plan: &Plan,
    seen: &[Arc<[AtomicU64]>],
    pause: &tokio::sync::watch::Sender<bool>,
) -> Result<(), String> {
    let before = plan.before_stalled();
    let all: Vec<usize> = before.iter().chain(&plan.stalled).copied().collect();
    let reading_want = plan.wanted(&all, 0);
    pause.send_replace(true);
    reset_stats();
    let rss0 = status_kib(front_pid, "VmRSS");
    common::proc::reset_peak(front_pid);
    let t = Instant::now();
    let keys = plan.stalled.clone();
    let ep = etcd.endpoint();
    tokio::task::spawn_blocking(move || write(&ep, keys, IN_FLIGHT))
        .await
        .map_err(|e| e.to_string())??;
    // The reading half: every event, however long the other half stays stalled.
    if let Err(e) = wait_count(|| plan.got(seen, 0), reading_want).await {
        return Err(format!(
            "with half the connections stalled, the reading half got {e} events; short: {}",
            plan.short(seen, &all)
        ));
    }
    let took = t.elapsed();
    let p = percentiles(&[0.5, 0.99, 1.0]);
    let reading_new = reading_want - plan.wanted(&before, 0);
    // Held stalled a while longer: does the front's memory grow?
    tokio::time::sleep(IDLE).await;
    let rss1 = status_kib(front_pid, "VmRSS");
    println!(
        "{} puts with every odd connection stalled: the reading half got its {reading_new} \
         events in {:.1} s ({:.0}/s), p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; {label} RSS \
         {:.0} MiB before, peak {:.0} MiB, {:.0} MiB after {:.0} s more",
        plan.stalled.len(),
        took.as_secs_f64(),
        reading_new as f64 / took.as_secs_f64(),
        p[0].as_secs_f64() * 1e3,
        p[1].as_secs_f64() * 1e3,
        p[2].as_secs_f64() * 1e3,
        mib(rss0),
        common::proc::peak_rss_mib(front_pid),
        mib(rss1),
        IDLE.as_secs_f64()
    );
    let t = Instant::now();
    pause.send_replace(false);
    let stalled_want = plan.wanted(&all, 1);
    if let Err(e) = wait_count(|| plan.got(seen, 1), stalled_want).await {
        return Err(format!(
            "the stalled half, reading again, got {e} events; short: {}",
            plan.short(seen, &all)
        ));
    }
    println!(
        "the stalled half, reading again, got every event in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The run through etcd-cache-proxy: its exit code.
async fn run_cache_proxy(etcd: &testkit::EtcdServer, plan: &Plan, o: &Opts) -> i32 {
    let bin = match common::cache_proxy_bin() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("million: {e}");
            return 1;
        }
    };
    let extra = ["--prefix".to_string(), PREFIX.to_string()];
    let proxy = match common::CacheProxy::start(&bin, &etcd.endpoint(), &extra) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("million: starting etcd-cache-proxy: {e}");
            return 1;
        }
    };
    let ep = proxy.endpoint();
    match run("etcd-cache-proxy", &ep, proxy.pid(), etcd, plan, o).await {
        Ok(Some(())) => 0,
        Ok(None) => 1,
        Err(e) => {
            eprintln!("million: etcd-cache-proxy: {e}\n{}", proxy.log_tail(20));
            1
        }
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "million: skipped (needs `cargo bench --bench million` or `cargo xtask bench million`)"
        );
        return;
    }
    let o = match parse_opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("million: {e}");
            std::process::exit(2);
        }
    };
    let need = o.conns as u64 + 1024;
    match open_files_limit() {
        Some(l) if l < need => {
            eprintln!(
                "million: {} connections need about {need} open files here and in the front; \
                 `ulimit -n` is {l}: raise it (e.g. `ulimit -n {need}` as root, or \
                 `prlimit --nofile={need}`) or lower --conns",
                o.conns
            );
            std::process::exit(2);
        }
        _ => {}
    }
    now_ns();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let code = rt.block_on(async {
        let plan = Plan::new(&o);
        let etcd = testkit::EtcdServer::start_with(
            testkit::EtcdOptions::default().arg("--quota-backend-bytes=8589934592"),
        );
        let t = Instant::now();
        if let Err(e) = load_keys(&etcd.endpoint(), o.keys).await {
            eprintln!("million: loading the keys: {e}");
            return 1;
        }
        println!(
            "etcd {}: {} keys loaded in {:.1} s; load average {}",
            etcd.binaries().describe(),
            o.keys,
            t.elapsed().as_secs_f64(),
            common::proc::loadavg()
        );
        if !plan.paced.is_empty() {
            // etcd's CPU per put with no watcher at all: the paced puts' keys, before any front.
            let (keys, ep, etcd0) = (plan.paced.clone(), etcd.endpoint(), cpu_s(etcd.pid()));
            let rate = o.rate;
            match tokio::task::spawn_blocking(move || write_paced(&ep, keys, rate)).await {
                Ok(Ok(_)) => println!(
                    "etcd alone, no watcher: {} puts at {rate}/s, etcd CPU {:.0} us per put",
                    plan.paced.len(),
                    (cpu_s(etcd.pid()) - etcd0) * 1e6 / plan.paced.len() as f64
                ),
                Ok(Err(e)) => println!("etcd alone: {e}"),
                Err(e) => println!("etcd alone: {e}"),
            }
        }
        let mut code = 0;
        if o.etcd {
            // The reference: what etcd itself delivers to the same watches.
            if let Err(e) = run("etcd", &etcd.endpoint(), etcd.pid(), &etcd, &plan, &o).await {
                println!("etcd: {e}");
                code = 1;
            }
        }
        if o.cache_proxy {
            code = run_cache_proxy(&etcd, &plan, &o).await;
        }
        if o.grpc_proxy {
            let g = testkit::grpc_proxy(&[etcd.endpoint()]);
            // The peer's shortfall is a result: reported, not failed.
            if let Err(e) = run("grpc-proxy", &g.endpoint(), g.pid(), &etcd, &plan, &o).await {
                println!("grpc-proxy: {e}");
            }
        }
        code
    });
    // The reader tasks of a run that failed may still hold connections: do not wait.
    rt.shutdown_timeout(Duration::from_secs(1));
    std::process::exit(code);
}
