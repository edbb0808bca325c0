//! Consistent reads at load, as Kubernetes measures them (KEP-2340: 99.9% of consistent
//! reads served from the watch cache within 110 ms of waiting for freshness).
//!
//! ```text
//! cargo bench --bench reads_load                           # 2 rounds of 10 s per target
//! ETCD_CACHE_BENCH_QUICK=1 cargo bench --bench reads_load  # 1 round of 3 s
//! cargo bench --bench reads_load -- --reads 10000 --writes 1000 --seconds 10 --rounds 2
//! ETCD_VERSION=3.7 ETCD_CACHE_ETCD_DIR=target/etcd cargo bench --bench reads_load
//! ```
//!
//! One etcd on loopback (testkit: Debian's 3.4.23 unless `ETCD_VERSION` picks another),
//! 10,000 keys of 100 bytes under `/bench/load/`, one `Cache` on that prefix with the
//! crate's defaults (`ProgressTrust::Auto`). A writer (its own thread, runtime and
//! connection) puts keys of the prefix at `--writes` puts/s for the whole run, so every
//! consistent read has something to wait for. Then, in rounds, each target for
//! `--seconds`:
//! - `cache`: `cache.get(key, None)`, the default consistent read, at `--reads` reads/s;
//! - `etcd`: a linearizable `get` straight to etcd on its own connection, at the same rate.
//!
//! The reads are open-loop: one is started on each tick whatever the others are doing, up
//! to `--in-flight` at once (a tick with none free is counted as not sent, and reported).
//! tokio's timer fires at most once a millisecond, so at 10,000 reads/s the ticks come in
//! bursts of about 10 (missed ticks fire at once): the rate holds, the reads of a
//! millisecond start together, which is harder on the cache than an even spread.
//! Each read's time from its start to its answer is its wait. Reported per round and
//! target: reads/s achieved, p50 / p99 / p99.9 / max, the share answered within 110 ms,
//! the cache's fallback reads (answered by etcd because the cache could not show it had
//! reached the read's revision: on etcd < 3.4.31 / 3.5.13 progress answers are not
//! trusted, etcd#15220) and progress requests, and etcd's CPU per read.
//!
//! Every answer is checked: the key's value is one the writer wrote or the load's, and a
//! consistent read's revision is at least the revision of the last put acknowledged before
//! the read started. A wrong answer, an error or a read hanging for 30 s exits with 1;
//! slowness never does.
//!
//! Run by `cargo test --all-targets` (no `--bench` argument) it only prints that it skipped.

mod common;
use common::bounded;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_cache::Cache;

const PREFIX: &str = "/bench/load/";
const KEYS: usize = 10_000;
const VALUE_SIZE: usize = 100;
/// KEP-2340's bound on a consistent read's wait.
const FRESH: Duration = Duration::from_millis(110);

fn key(i: usize) -> String {
    format!("{PREFIX}k{i:05}")
}

/// A value of the load (`w` = 0) or of the writer's `w`-th put.
fn value(i: usize, w: u64) -> Vec<u8> {
    let mut v = format!("value-{i:05}-{w}-").into_bytes();
    v.resize(VALUE_SIZE, b'x');
    v
}

struct Opts {
    reads: u32,
    writes: u32,
    seconds: u64,
    rounds: u32,
    in_flight: usize,
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = if common::quick() {
        Opts {
            reads: 10_000,
            writes: 1_000,
            seconds: 3,
            rounds: 1,
            in_flight: 1024,
        }
    } else {
        Opts {
            reads: 10_000,
            writes: 1_000,
            seconds: 10,
            rounds: 2,
            in_flight: 1024,
        }
    };
    let mut it = std::env::args().skip(1);
    let num = |v: Option<String>, what: &str| -> Result<u64, String> {
        v.and_then(|v| v.replace('_', "").parse().ok())
            .ok_or(format!("{what} needs a number"))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--reads" => o.reads = num(it.next(), "--reads")? as u32,
            "--writes" => o.writes = num(it.next(), "--writes")? as u32,
            "--seconds" => o.seconds = num(it.next(), "--seconds")?,
            "--rounds" => o.rounds = num(it.next(), "--rounds")? as u32,
            "--in-flight" => o.in_flight = num(it.next(), "--in-flight")? as usize,
            // What cargo bench passes to every bench target (--bench, filters) is ignored.
            _ => {}
        }
    }
    if !(1..=100_000).contains(&o.reads) || !(1..=10_000).contains(&o.writes) {
        return Err(format!(
            "--reads must be 1 to 100000 and --writes 1 to 10000 per second, not {} and {}",
            o.reads, o.writes
        ));
    }
    if o.seconds == 0 || o.rounds == 0 || o.in_flight == 0 {
        return Err("--seconds, --rounds and --in-flight must be at least 1".into());
    }
    Ok(o)
}

async fn load(endpoint: &str) -> Result<(), String> {
    common::load_txns(endpoint, KEYS, |i| (key(i), value(i, 0))).await
}

/// The writer: puts at `rate` per second until stopped, each sent on its tick; the
/// revision of the last acknowledged put in `acked`.
struct Writer {
    stop: Arc<AtomicBool>,
    puts: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<Result<(), String>>,
}

impl Writer {
    fn start(endpoint: String, rate: u32, acked: Arc<AtomicI64>) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let puts = Arc::new(AtomicU64::new(0));
        let (s, p) = (stop.clone(), puts.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                let client = testkit::Connect::plain().try_client(&[&endpoint]).await?;
                let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
                let mut w = 0u64;
                let mut tasks = tokio::task::JoinSet::new();
                while !s.load(Ordering::Relaxed) {
                    tick.tick().await;
                    w += 1;
                    let i = (w as usize * 7919) % KEYS;
                    let (mut c, acked, p) = (client.clone(), acked.clone(), p.clone());
                    tasks.spawn(async move {
                        let r = bounded("put", c.put(key(i), value(i, w), None)).await?;
                        acked.fetch_max(r.header().map_or(0, |h| h.revision()), Ordering::SeqCst);
                        p.fetch_add(1, Ordering::Relaxed);
                        Ok::<_, String>(())
                    });
                    while let Some(r) = tasks.try_join_next() {
                        r.map_err(|e| e.to_string())??;
                    }
                }
                while let Some(r) = tasks.join_next().await {
                    r.map_err(|e| e.to_string())??;
                }
                Ok(())
            })
        });
        Writer { stop, puts, thread }
    }

    fn stop(self) -> Result<u64, String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| "the writer panicked".to_string())??;
        Ok(self.puts.load(Ordering::Relaxed))
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Target {
    Cache,
    Etcd,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Cache => "cache",
            Target::Etcd => "etcd",
        }
    }
}

/// One read of key `i` and its check; its wait.
async fn read(
    target: Target,
    cache: Cache,
    mut client: etcd_client::Client,
    i: usize,
    acked: Arc<AtomicI64>,
) -> Result<Duration, String> {
    let floor = acked.load(Ordering::SeqCst);
    let t = Instant::now();
    let (value, revision) = match target {
        Target::Cache => {
            let r = bounded("cache get", cache.get(key(i).as_str(), None)).await?;
            (r.kvs().first().map(|kv| kv.value().to_vec()), r.revision())
        }
        Target::Etcd => {
            let r = bounded("etcd get", client.get(key(i), None)).await?;
            let rev = r.header().map_or(0, |h| h.revision());
            (r.kvs().first().map(|kv| kv.value().to_vec()), rev)
        }
    };
    let took = t.elapsed();
    let want = format!("value-{i:05}-");
    match value {
        Some(v) if v.len() == VALUE_SIZE && v.starts_with(want.as_bytes()) => {}
        other => {
            return Err(format!(
                "{} read of {}: {:?}",
                target.name(),
                key(i),
                other.map(|v| String::from_utf8_lossy(&v).into_owned())
            ))
        }
    }
    if revision < floor {
        return Err(format!(
            "{} read of {} at revision {revision}, below the put acknowledged at {floor} \
             before it started",
            target.name(),
            key(i)
        ));
    }
    Ok(took)
}

/// What one round of one target measured.
struct Row {
    round: u32,
    target: Target,
    sent: usize,
    not_sent: usize,
    secs: f64,
    waits: Vec<Duration>,
    fallbacks: u64,
    progress_requests: u64,
    etcd_cpu_s: f64,
}

async fn phase(
    round: u32,
    target: Target,
    o: &Opts,
    cache: &Cache,
    client: &etcd_client::Client,
    acked: &Arc<AtomicI64>,
    etcd_pid: Option<u32>,
) -> Result<Row, String> {
    let stats0 = cache.stats();
    let cpu0 = common::proc::cpu_ticks(etcd_pid);
    let permits = Arc::new(tokio::sync::Semaphore::new(o.in_flight));
    let waits = Arc::new(Mutex::new(Vec::with_capacity(
        (o.reads as u64 * o.seconds) as usize,
    )));
    let mut tasks = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / o.reads);
    let (mut sent, mut not_sent) = (0usize, 0usize);
    let t = Instant::now();
    let end = t + Duration::from_secs(o.seconds);
    while Instant::now() < end {
        tick.tick().await;
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            not_sent += 1;
            continue;
        };
        sent += 1;
        let (cache, client, acked, waits) =
            (cache.clone(), client.clone(), acked.clone(), waits.clone());
        let i = (sent * 104_729) % KEYS;
        tasks.spawn(async move {
            let took = read(target, cache, client, i, acked).await;
            drop(permit);
            waits.lock().expect("not poisoned").push(took?);
            Ok::<_, String>(())
        });
        while let Some(r) = tasks.try_join_next() {
            r.map_err(|e| e.to_string())??;
        }
    }
    while let Some(r) = tasks.join_next().await {
        r.map_err(|e| e.to_string())??;
    }
    let secs = t.elapsed().as_secs_f64();
    let stats1 = cache.stats();
    let waits = std::mem::take(&mut *waits.lock().expect("not poisoned"));
    Ok(Row {
        round,
        target,
        sent,
        not_sent,
        secs,
        waits,
        fallbacks: stats1.fallback_reads - stats0.fallback_reads,
        progress_requests: stats1.progress_requests - stats0.progress_requests,
        etcd_cpu_s: (common::proc::cpu_ticks(etcd_pid) - cpu0) as f64 / common::proc::clk_tck(),
    })
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn print_row(r: &mut Row) {
    r.waits.sort();
    let n = r.waits.len();
    let at = |p: f64| r.waits[((n as f64 * p).ceil() as usize).clamp(1, n) - 1];
    let fresh = r.waits.iter().filter(|w| **w <= FRESH).count();
    println!(
        "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {:.2}% | {} | {} | {:.0} |",
        r.round,
        r.target.name(),
        r.sent as f64 / r.secs,
        r.not_sent,
        ms(at(0.5)),
        ms(at(0.99)),
        ms(at(0.999)),
        ms(at(1.0)),
        fresh as f64 * 100.0 / n as f64,
        if r.target == Target::Cache {
            r.fallbacks.to_string()
        } else {
            "-".into()
        },
        if r.target == Target::Cache {
            r.progress_requests.to_string()
        } else {
            "-".into()
        },
        r.etcd_cpu_s * 1e6 / n as f64,
    );
}

async fn run(o: &Opts, server: &testkit::EtcdServer) -> Result<(), String> {
    let endpoint = server.endpoint();
    load(&endpoint).await?;
    let cache_client = testkit::Connect::plain().try_client(&[&endpoint]).await?;
    let cache = bounded(
        "build the cache",
        Cache::builder(cache_client).prefix(PREFIX).build(),
    )
    .await?;
    bounded("wait_ready", cache.wait_ready()).await?;
    let client = testkit::Connect::plain().try_client(&[&endpoint]).await?;
    let acked = Arc::new(AtomicI64::new(0));
    let writer = Writer::start(endpoint.clone(), o.writes, acked.clone());
    println!(
        "| round | read | reads/s | not sent | p50 ms | p99 ms | p99.9 ms | max ms | within 110 ms | \
         fallbacks | progress requests | etcd CPU per read (us) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut result = Ok(());
    'rounds: for round in 1..=o.rounds {
        for target in [Target::Cache, Target::Etcd] {
            match phase(round, target, o, &cache, &client, &acked, server.pid()).await {
                Ok(mut r) => print_row(&mut r),
                Err(e) => {
                    result = Err(format!("round {round}, {}: {e}", target.name()));
                    break 'rounds;
                }
            }
        }
    }
    let puts = writer.stop()?;
    let stats = cache.stats();
    println!(
        "writer: {puts} puts; cache: progress_trusted {}, revision {}, fallback_reads {}, \
         progress_requests {}",
        stats.progress_trusted, stats.revision, stats.fallback_reads, stats.progress_requests
    );
    cache.close().await;
    result
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("reads_load: skipped (run it with cargo bench --bench reads_load)");
        return;
    }
    let o = match parse_opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("reads_load: {e}");
            std::process::exit(2);
        }
    };
    let server = testkit::EtcdServer::start();
    println!(
        "reads_load: etcd {} at {}, {} CPUs; {KEYS} keys x {VALUE_SIZE} B under {PREFIX}; \
         {} consistent reads/s of one key while {} puts/s land in the prefix; {} round(s) of \
         {} s per target, up to {} reads in flight; load average {}",
        server.binaries().describe(),
        server.endpoint(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        o.reads,
        o.writes,
        o.rounds,
        o.seconds,
        o.in_flight,
        common::proc::loadavg()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = rt.block_on(run(&o, &server));
    drop(rt);
    if let Err(e) = result {
        eprintln!("reads_load: FAILED: {e}");
        eprintln!("etcd log tail:\n{}", server.log_tail(20));
        std::process::exit(1);
    }
}
