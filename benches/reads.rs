//! Read latency: cache vs. etcd, against one real etcd in the same run .
//!
//! ```text
//! cargo bench --bench reads                              # full run (about 3-4 minutes)
//! ETCD_CACHE_BENCH_QUICK=1 cargo bench --bench reads     # short form (< 30 s)
//! cargo bench --bench reads -- --key-iters 20000 --prefix-iters 1000 --write-rate 500
//! ```
//!
//! One etcd on loopback (started here, through `testkit`), 10,000 keys with
//! 100-byte values under `/bench/reads/`, one `Cache` on that prefix. For two targets,
//! - `key`:    one key (`/bench/reads/k05000`),
//! - `prefix`: the whole 10,000-key prefix,
//!
//! it measures the latency of three reads, interleaved round-robin (the order rotates every
//! iteration) so that each sees the same conditions:
//! - `cache consistent`:   `cache.get(key, None)`, the default linearizable read;
//! - `etcd linearizable`:  `client.get(key, None)` on its own etcd-client connection;
//! - `cache serializable`: `cache.get(key, Some(GetOptions::new().with_serializable()))`;
//! - `(etcd revision probe)`: for reference, the round trip a consistent cache read makes
//!   first (a linearizable count-only, limit-1 read of one key: its header revision).
//!
//! Three runs, each with a fresh `Cache` on the same etcd:
//! - `quiet`: nothing else writes; the cache's revision is the cluster's.
//! - `busy`: a writer (own thread, runtime and connection) puts keys *outside* the
//!   prefix at `--write-rate` puts/s, so the cluster revision moves while the
//!   prefix is quiet. On etcd < 3.4.31 / 3.5.13 (3.4.23 here) the cache cannot
//!   trust `RequestProgress` answers (etcd#15220), so a consistent read whose
//!   revision the cache has not applied is answered by etcd
//!   (`stats().fallback_reads`).
//! - `busy+trust`: the same writer, with `.progress_trust(ProgressTrust::Always)`: the fast
//!   path fixed etcd versions get (a progress request, then memory). Forcing
//!   trust on 3.4.23 is not safe in general (etcd#15220 shows after a resumed
//!   watch); it is here only to time that path.
//!   `--progress-request-interval-ms N` sets the cache's
//!   `progress_request_interval` for this run (default: the crate's, 100 ms).
//!
//! Each line reports p50 / p99 / mean and the ratio of p50 and p99 to the direct etcd read of
//! the same target in the same run, plus the cache's fallback reads and progress requests
//! during that measurement. A markdown table follows.
//!
//! Every response is checked (the key's value, 10,000 key-values for the prefix, and a
//! consistent read's revision is >= the revision of every direct etcd read that completed
//! before it started); a wrong answer, an error or a read hanging for 30 s exits with 1.
//! Slowness never fails.
//!
//! Run by `cargo test --all-targets` (no `--bench` argument) it does a smoke run of a few
//! iterations per measurement and exits.

mod common;
use common::{bounded, CALL_TIMEOUT};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_cache::{Cache, GetOptions, ProgressTrust};
use etcd_client::Client;

const PREFIX: &str = "/bench/reads/";
const KEYS: usize = 10_000;
const VALUE_SIZE: usize = 100;
/// The single key read (in the middle of the prefix).
const ONE_KEY: usize = KEYS / 2;
/// Keys the background writer cycles through, outside `PREFIX`.
const WRITER_KEYS: u64 = 1000;

fn key(i: usize) -> String {
    format!("{PREFIX}k{i:05}")
}

fn value(i: usize) -> Vec<u8> {
    let mut v = format!("value-{i:05}-").into_bytes();
    v.resize(VALUE_SIZE, b'x');
    v
}

// ---------------------------------------------------------------------------------------
// Options

struct Opts {
    smoke: bool,
    quick: bool,
    key_iters: usize,
    prefix_iters: usize,
    /// Puts per second of the background writer in the busy runs (0: as fast as one put in
    /// flight allows).
    write_rate: u64,
    /// `progress_request_interval` of the cache in the `busy+trust` run (None: the default).
    request_interval: Option<Duration>,
}

fn parse_opts() -> Result<Opts, String> {
    let bench = std::env::args().any(|a| a == "--bench");
    let quick = common::quick();
    let mut o = if !bench {
        Opts {
            smoke: true,
            quick: false,
            key_iters: 5,
            prefix_iters: 2,
            write_rate: 200,
            request_interval: None,
        }
    } else if quick {
        Opts {
            smoke: false,
            quick: true,
            key_iters: 250,
            prefix_iters: 30,
            write_rate: 200,
            request_interval: None,
        }
    } else {
        Opts {
            smoke: false,
            quick: false,
            key_iters: 2000,
            prefix_iters: 300,
            write_rate: 200,
            request_interval: None,
        }
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut num = |name: &str| -> Result<u64, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match a.as_str() {
            "--key-iters" => o.key_iters = num("--key-iters")?.max(1) as usize,
            "--prefix-iters" => o.prefix_iters = num("--prefix-iters")?.max(1) as usize,
            "--write-rate" => o.write_rate = num("--write-rate")?,
            "--progress-request-interval-ms" => {
                o.request_interval = Some(Duration::from_millis(
                    num("--progress-request-interval-ms")?.max(1),
                ))
            }
            // `--bench` and whatever else cargo passes to every bench target are ignored.
            _ => {}
        }
    }
    Ok(o)
}

// ---------------------------------------------------------------------------------------
// Statistics

#[derive(Clone, Copy)]
struct Summary {
    n: usize,
    p50: Duration,
    p99: Duration,
    mean: Duration,
}

fn summarize(samples: &mut [Duration]) -> Summary {
    samples.sort_unstable();
    let n = samples.len();
    // Nearest rank.
    let rank = |p: f64| samples[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
    let total: Duration = samples.iter().sum();
    Summary {
        n,
        p50: rank(0.50),
        p99: rank(0.99),
        mean: total / n as u32,
    }
}

fn fmt_d(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.2} ms", us / 1000.0)
    }
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-12)
}

// ---------------------------------------------------------------------------------------
// Background writer (outside the prefix)

struct Writer {
    stop: Arc<AtomicBool>,
    puts: Arc<AtomicU64>,
    started: Instant,
    thread: std::thread::JoinHandle<Result<(), String>>,
}

impl Writer {
    /// Starts putting `/bench/other/w<n>` at `rate` puts/s on its own thread, runtime and
    /// connection; returns once the first put is done (so the cluster revision has moved).
    fn start(endpoint: String, rate: u64) -> Result<Writer, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let puts = Arc::new(AtomicU64::new(0));
        let (first_tx, first_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let thread = {
            let (stop, puts) = (stop.clone(), puts.clone());
            std::thread::Builder::new()
                .name("reads-writer".into())
                .spawn(move || -> Result<(), String> {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| e.to_string())?;
                    rt.block_on(async move {
                        let mut client =
                            match testkit::Connect::plain().try_client(&[endpoint]).await {
                                Ok(c) => c,
                                Err(e) => {
                                    let e = format!("writer connect: {e}");
                                    let _ = first_tx.send(Err(e.clone()));
                                    return Err(e);
                                }
                            };
                        let mut tick = (rate > 0).then(|| {
                            let mut t =
                                tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
                            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                            t
                        });
                        let payload = vec![b'w'; VALUE_SIZE];
                        let mut n = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            if let Some(t) = tick.as_mut() {
                                t.tick().await;
                            }
                            let k = format!("/bench/other/w{:04}", n % WRITER_KEYS);
                            let r = tokio::time::timeout(
                                CALL_TIMEOUT,
                                client.put(k, payload.clone(), None),
                            )
                            .await;
                            match r {
                                Ok(Ok(_)) => {}
                                Ok(Err(e)) => return Err(format!("writer put: {e}")),
                                Err(_) => return Err("writer put hung for 30 s".into()),
                            }
                            n += 1;
                            puts.store(n, Ordering::Relaxed);
                            if n == 1 {
                                let _ = first_tx.send(Ok(()));
                            }
                        }
                        Ok(())
                    })
                })
                .map_err(|e| e.to_string())?
        };
        match first_rx.recv_timeout(CALL_TIMEOUT) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err("the writer did not complete a put in 30 s".into()),
        }
        Ok(Writer {
            stop,
            puts,
            started: Instant::now(),
            thread,
        })
    }

    /// Stops the writer; returns (puts, puts/s).
    fn stop(self) -> Result<(u64, f64), String> {
        self.stop.store(true, Ordering::Relaxed);
        let secs = self.started.elapsed().as_secs_f64();
        self.thread
            .join()
            .map_err(|_| "writer thread panicked".to_string())??;
        let n = self.puts.load(Ordering::Relaxed);
        Ok((n, n as f64 / secs.max(1e-9)))
    }
}

// ---------------------------------------------------------------------------------------
// Measurements

#[derive(Clone, Copy, PartialEq, Eq)]
enum Read {
    CacheConsistent,
    Etcd,
    CacheSerializable,
    /// What a consistent cache read sends to etcd first: a linearizable count-only,
    /// limit-1 range over the cache's prefix (shown to explain the consistent read's cost).
    Probe,
}

const READS: [Read; 4] = [
    Read::CacheConsistent,
    Read::Etcd,
    Read::CacheSerializable,
    Read::Probe,
];

impl Read {
    fn name(self) -> &'static str {
        match self {
            Read::CacheConsistent => "cache consistent",
            Read::Etcd => "etcd linearizable",
            Read::CacheSerializable => "cache serializable",
            Read::Probe => "(etcd revision probe)",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Key,
    Prefix,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Key => "key",
            Target::Prefix => "prefix",
        }
    }
}

struct Row {
    mode: &'static str,
    target: Target,
    read: Read,
    s: Summary,
    vs_etcd: (f64, f64),
    /// Fallback reads / progress requests during the measurement (cache consistent only).
    fallback: Option<(u64, u64)>,
}

struct Ctx {
    cache: Cache,
    client: Client,
    /// Highest header revision of a direct etcd read that has completed.
    etcd_seen: i64,
}

/// One read, timed and checked.
async fn one(ctx: &mut Ctx, target: Target, read: Read) -> Result<Duration, String> {
    let (k, prefix) = match target {
        Target::Key => (key(ONE_KEY), false),
        Target::Prefix => (PREFIX.to_string(), true),
    };
    let seen_before = ctx.etcd_seen;
    let t0 = Instant::now();
    let (n, first_value, revision) = match read {
        Read::Probe => {
            // The cache's probe: a count-only, limit-1 read of one key (the prefix
            // itself); only its header revision matters.
            let opts = etcd_client::GetOptions::new()
                .with_count_only()
                .with_limit(1);
            let r = bounded("etcd probe", ctx.client.get(PREFIX, Some(opts))).await?;
            let took = t0.elapsed();
            if r.header().map_or(0, |h| h.revision()) == 0 {
                return Err("probe answered without a revision".into());
            }
            return Ok(took);
        }
        Read::Etcd => {
            let opts = prefix.then(|| etcd_client::GetOptions::new().with_prefix());
            let r = bounded("etcd get", ctx.client.get(k.as_str(), opts)).await?;
            let rev = r.header().map_or(0, |h| h.revision());
            ctx.etcd_seen = ctx.etcd_seen.max(rev);
            (
                r.kvs().len(),
                r.kvs().first().map(|kv| kv.value().to_vec()),
                rev,
            )
        }
        Read::CacheConsistent | Read::CacheSerializable => {
            let mut opts = GetOptions::new();
            if prefix {
                opts = opts.with_prefix();
            }
            if read == Read::CacheSerializable {
                opts = opts.with_serializable();
            }
            let r = bounded(read.name(), ctx.cache.get(k.as_str(), Some(opts))).await?;
            (
                r.kvs().len(),
                r.kvs().first().map(|kv| kv.value().to_vec()),
                r.revision(),
            )
        }
    };
    let took = t0.elapsed();
    let want = if prefix { KEYS } else { 1 };
    if n != want {
        return Err(format!(
            "{} of {}: {n} key-values, want {want}",
            read.name(),
            target.name()
        ));
    }
    let want_first = value(if prefix { 0 } else { ONE_KEY });
    if first_value.as_deref() != Some(&want_first[..]) {
        return Err(format!("{} of {}: wrong value", read.name(), target.name()));
    }
    if read == Read::CacheConsistent && revision < seen_before {
        return Err(format!(
            "consistent read of {} at revision {revision}, but etcd had answered at {seen_before} before it started",
            target.name()
        ));
    }
    Ok(took)
}

async fn measure(
    ctx: &mut Ctx,
    mode: &'static str,
    target: Target,
    iters: usize,
) -> Result<Vec<Row>, String> {
    // Warm-up: connections, allocator, the cache's snapshot path.
    let warmup = (iters / 20).clamp(1, 50);
    for i in 0..warmup {
        for j in 0..READS.len() {
            one(ctx, target, READS[(i + j) % READS.len()]).await?;
        }
    }
    let before = ctx.cache.stats();
    let mut samples: [Vec<Duration>; 4] = Default::default();
    for i in 0..iters {
        for j in 0..READS.len() {
            let r = (i + j) % READS.len();
            samples[r].push(one(ctx, target, READS[r]).await?);
        }
    }
    let after = ctx.cache.stats();
    let sums: Vec<Summary> = samples.iter_mut().map(|s| summarize(s)).collect();
    let etcd = sums[1];
    Ok(READS
        .iter()
        .zip(&sums)
        .map(|(&read, &s)| Row {
            mode,
            target,
            read,
            s,
            vs_etcd: (ratio(s.p50, etcd.p50), ratio(s.p99, etcd.p99)),
            fallback: (read == Read::CacheConsistent).then(|| {
                (
                    after.fallback_reads - before.fallback_reads,
                    after.progress_requests - before.progress_requests,
                )
            }),
        })
        .collect())
}

fn print_row(r: &Row) {
    let extra = match r.fallback {
        Some((f, p)) => format!("  fallback_reads {f}/{}  progress_requests {p}", r.s.n),
        None => String::new(),
    };
    println!(
        "reads [{:<10}] {:<6} {:<21} p50 {:>9}  p99 {:>9}  mean {:>9}  vs etcd get: p50 {:>6.2}x  p99 {:>6.2}x{extra}",
        r.mode,
        r.target.name(),
        r.read.name(),
        fmt_d(r.s.p50),
        fmt_d(r.s.p99),
        fmt_d(r.s.mean),
        r.vs_etcd.0,
        r.vs_etcd.1,
    );
}

async fn load(endpoint: &str) -> Result<(), String> {
    common::load_txns(endpoint, KEYS, |i| (key(i), value(i))).await
}

async fn run_mode(
    endpoint: &str,
    opts: &Opts,
    mode: &'static str,
    busy: bool,
    trust: ProgressTrust,
    rows: &mut Vec<Row>,
) -> Result<(), String> {
    let cache_client = testkit::Connect::plain().try_client(&[endpoint]).await?;
    let mut builder = Cache::builder(cache_client)
        .prefix(PREFIX)
        .progress_trust(trust);
    if let (ProgressTrust::Always, Some(every)) = (trust, opts.request_interval) {
        builder = builder.progress_request_interval(every);
    }
    let cache = bounded("build the cache", builder.build()).await?;
    bounded("wait_ready", cache.wait_ready()).await?;
    let client = testkit::Connect::plain().try_client(&[endpoint]).await?;
    let mut ctx = Ctx {
        cache,
        client,
        etcd_seen: 0,
    };
    let writer = if busy {
        Some(Writer::start(endpoint.to_string(), opts.write_rate)?)
    } else {
        None
    };
    let t0 = Instant::now();
    let mut result = Ok(());
    for (target, iters) in [
        (Target::Key, opts.key_iters),
        (Target::Prefix, opts.prefix_iters),
    ] {
        match measure(&mut ctx, mode, target, iters).await {
            Ok(new) => {
                for r in &new {
                    print_row(r);
                }
                rows.extend(new);
            }
            Err(e) => {
                result = Err(format!("{mode}: {e}"));
                break;
            }
        }
    }
    let stats = ctx.cache.stats();
    let writer_note = match writer {
        Some(w) => {
            let (n, rate) = w.stop()?;
            format!(", writer {n} puts outside the prefix ({rate:.0}/s)")
        }
        None => String::new(),
    };
    println!(
        "reads [{mode:<10}] done in {:.1} s: progress_trusted {}, cache revision {}, fallback_reads {}, progress_requests {}{writer_note}",
        t0.elapsed().as_secs_f64(),
        stats.progress_trusted,
        stats.revision,
        stats.fallback_reads,
        stats.progress_requests,
    );
    ctx.cache.close().await;
    result
}

fn print_table(rows: &[Row]) {
    println!();
    println!(
        "| run | target | read | p50 | p99 | mean | p50 / etcd | p99 / etcd | fallback reads |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let fb = match r.fallback {
            Some((f, _)) => format!("{f} / {}", r.s.n),
            None => "–".to_string(),
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.2}x | {:.2}x | {fb} |",
            r.mode,
            if r.target == Target::Key {
                "1 key".to_string()
            } else {
                format!("prefix, {KEYS} keys")
            },
            r.read.name(),
            fmt_d(r.s.p50),
            fmt_d(r.s.p99),
            fmt_d(r.s.mean),
            r.vs_etcd.0,
            r.vs_etcd.1,
        );
    }
}

fn main() {
    let opts = match parse_opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("reads: {e}");
            std::process::exit(2);
        }
    };
    let started = Instant::now();
    let server = testkit::EtcdServer::start();
    let version = server.status().map(|s| s.version).unwrap_or_default();
    let form = if opts.smoke {
        "smoke run (no --bench argument)"
    } else if opts.quick {
        "quick (ETCD_CACHE_BENCH_QUICK)"
    } else {
        "full"
    };
    println!(
        "reads: {form}; etcd {version} at {}, {} CPUs, {KEYS} keys x {VALUE_SIZE} B under {PREFIX}; \
         key iterations {}, prefix iterations {}; busy runs: writer at {} puts/s outside the prefix; \
         busy+trust progress_request_interval {}",
        server.endpoint(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        opts.key_iters,
        opts.prefix_iters,
        if opts.write_rate == 0 { "max".to_string() } else { opts.write_rate.to_string() },
        opts.request_interval.map_or("default".to_string(), |d| format!("{d:?}")),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let endpoint = server.endpoint();
    let result: Result<Vec<Row>, String> = rt.block_on(async {
        load(&endpoint).await?;
        let mut rows = Vec::new();
        for (mode, busy, trust) in [
            ("quiet", false, ProgressTrust::Auto),
            ("busy", true, ProgressTrust::Auto),
            ("busy+trust", true, ProgressTrust::Always),
        ] {
            run_mode(&endpoint, &opts, mode, busy, trust, &mut rows).await?;
        }
        Ok(rows)
    });
    drop(rt);
    match result {
        Ok(rows) => {
            if !opts.smoke {
                print_table(&rows);
            }
            println!("reads: ok in {:.1} s", started.elapsed().as_secs_f64());
        }
        Err(e) => {
            eprintln!("reads: FAILED: {e}");
            eprintln!("etcd log tail:\n{}", server.log_tail(20));
            std::process::exit(1);
        }
    }
}
