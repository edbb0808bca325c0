//! Several etcd-cache-proxies (issue 20): etcd's CPU per put with remote watchers on one
//! proxy, spread over two proxies, and over a two-level tree (etcd -> A -> {B1, B2}),
//! against one watcher; and the put-to-delivery latency per level at a paced load all
//! setups sustain. Real etcd and proxy processes (release build), one run.
//!
//! `cargo bench --bench tiers` (`ETCD_CACHE_BENCH_QUICK=1`: N = 2,000 and 150 puts;
//! `TIERS_N`, default 10,000; `TIERS_PUTS`, default 500, `TIERS_CPU_RATE` puts/s,
//! default 50, for the CPU runs; `TIERS_PACED_N`, default
//! 1,000; `TIERS_RATE` puts/s, default 200).
//!
//! Watchers are etcd-client watches in this process, 100 per stream, one connection per
//! 100 watches (as `benches/fanout.rs` remote mode). Each value carries the time it was
//! sent; a delivery's latency is its receipt time minus that. The writer has its own
//! thread, runtime and connection to etcd.
//!
//! Setups, each started fresh with the proxies' default flags:
//! - `one`: etcd -> P, every watcher on P;
//! - `two`: etcd -> {P1, P2}, half the watchers on each;
//! - `tree`: etcd -> A -> {B1, B2}, half the watchers on each B, and 100 on A (level 1,
//!   for the latency of one level against two in the same run).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testkit::EtcdOptions;

static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

fn now_ns() -> u64 {
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ticks(pid: Option<u32>) -> f64 {
    common::proc::cpu_ticks(pid) as f64 / common::proc::clk_tck()
}

/// Latencies (ns) of one level, gathered from its streams.
#[derive(Default)]
struct Level {
    lat: Mutex<Vec<u64>>,
    deliveries: AtomicU64,
}

impl Level {
    fn percentile(&self, q: f64) -> f64 {
        let mut v = self.lat.lock().unwrap().clone();
        if v.is_empty() {
            return 0.0;
        }
        v.sort_unstable();
        v[((v.len() - 1) as f64 * q) as usize] as f64 / 1e6
    }
}

/// Opens `n` watches of `prefix` through `ep` (100 per stream, one connection each);
/// each stream's task records every delivery into `level` until it has `puts` per watch.
async fn watchers(
    ep: &str,
    prefix: &str,
    n: usize,
    puts: usize,
    level: Arc<Level>,
) -> (Vec<etcd_client::Client>, Vec<tokio::task::JoinHandle<()>>) {
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    let mut left = n;
    while left > 0 {
        let k = left.min(100);
        left -= k;
        let mut c = testkit::Connect::plain().try_client(&[ep]).await.unwrap();
        let opts = || Some(etcd_client::WatchOptions::new().with_prefix());
        let mut stream = c.watch(prefix, opts()).await.unwrap();
        for _ in 1..k {
            stream.watch(prefix, opts()).await.unwrap();
        }
        let mut created = 0;
        while created < k {
            if stream.message().await.unwrap().unwrap().created() {
                created += 1;
            }
        }
        clients.push(c);
        let level = level.clone();
        let want = (k * puts) as u64;
        tasks.push(tokio::spawn(async move {
            let mut got = 0;
            let mut local = Vec::with_capacity(want as usize);
            while got < want {
                let r = stream.message().await.unwrap().expect("watch stream ended");
                assert!(!r.canceled(), "watch canceled: {}", r.cancel_reason());
                let now = now_ns();
                for ev in r.events() {
                    let v = ev.kv().unwrap().value();
                    let sent: u64 = std::str::from_utf8(&v[..20]).unwrap().parse().unwrap();
                    local.push(now.saturating_sub(sent));
                }
                got += r.events().len() as u64;
            }
            level.deliveries.fetch_add(got, Ordering::Relaxed);
            level.lat.lock().unwrap().extend(local);
        }));
    }
    (clients, tasks)
}

/// Writes `puts` 256-byte values stamped with their send time, from its own thread:
/// paced at `rate` puts/s (0: 16 in flight, as fast as etcd takes them).
fn write(ep: String, prefix: String, puts: usize, rate: f64) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let client = testkit::Connect::plain().try_client(&[&ep]).await.unwrap();
            let next = Arc::new(AtomicU64::new(0));
            let start = tokio::time::Instant::now();
            let mut ws = Vec::new();
            for _ in 0..16 {
                let (mut c, next, prefix) = (client.clone(), next.clone(), prefix.clone());
                ws.push(tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                        if i >= puts {
                            return;
                        }
                        if rate > 0.0 {
                            tokio::time::sleep_until(
                                start + Duration::from_secs_f64(i as f64 / rate),
                            )
                            .await;
                        }
                        let value = format!("{:020}{}", now_ns(), "v".repeat(236));
                        c.put(format!("{prefix}k{}", i % 1000), value, None)
                            .await
                            .unwrap();
                    }
                }));
            }
            for w in ws {
                w.await.unwrap();
            }
        });
    })
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Setup {
    One,
    Two,
    Tree,
}

struct Outcome {
    etcd_us_per_put: f64,
    proxies_cpu_s: f64,
    levels: Vec<(&'static str, Arc<Level>)>,
    wall: f64,
}

async fn run(
    setup: Setup,
    etcd: &testkit::EtcdServer,
    n: usize,
    puts: usize,
    rate: f64,
    run_no: usize,
) -> Outcome {
    let bin = common::cache_proxy_bin().expect("etcd-cache-proxy built");
    let prefix = format!("/tiers/{}/{run_no}/", std::process::id());
    let extra = vec!["--prefix".to_string(), prefix.clone()];
    let start = |ep: String| {
        let (bin, extra) = (bin.clone(), extra.clone());
        tokio::task::spawn_blocking(move || common::CacheProxy::start(&bin, &ep, &extra).unwrap())
    };
    let mut proxies = Vec::new();
    let mut placements: Vec<(String, usize, &'static str)> = Vec::new();
    match setup {
        Setup::One => {
            let p = start(etcd.endpoint()).await.unwrap();
            placements.push((p.endpoint(), n, "level 1"));
            proxies.push(p);
        }
        Setup::Two => {
            for share in [n / 2, n - n / 2] {
                let p = start(etcd.endpoint()).await.unwrap();
                placements.push((p.endpoint(), share, "level 1"));
                proxies.push(p);
            }
        }
        Setup::Tree => {
            let a = start(etcd.endpoint()).await.unwrap();
            for share in [n / 2, n - n / 2] {
                let b = start(a.endpoint()).await.unwrap();
                placements.push((b.endpoint(), share, "level 2"));
                proxies.push(b);
            }
            if n >= 200 {
                placements.push((a.endpoint(), 100, "level 1"));
            }
            proxies.push(a);
        }
    }
    let mut levels: Vec<(&'static str, Arc<Level>)> = Vec::new();
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for (ep, k, name) in placements {
        let level = match levels.iter().find(|l| l.0 == name) {
            Some(l) => l.1.clone(),
            None => {
                let l = Arc::new(Level::default());
                levels.push((name, l.clone()));
                l
            }
        };
        let (c, t) = watchers(&ep, &prefix, k, puts, level).await;
        clients.extend(c);
        tasks.extend(t);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pids: Vec<Option<u32>> = proxies.iter().map(|p| p.pid()).collect();
    let cpu = |pids: &[Option<u32>]| pids.iter().map(|p| ticks(*p)).sum::<f64>();
    let (e0, p0, t0) = (ticks(etcd.pid()), cpu(&pids), Instant::now());
    let writer = write(etcd.endpoint(), prefix.clone(), puts, rate);
    tokio::task::spawn_blocking(move || writer.join().unwrap())
        .await
        .unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .expect("deliveries within 120 s")
            .unwrap();
    }
    let (e1, p1, wall) = (ticks(etcd.pid()), cpu(&pids), t0.elapsed().as_secs_f64());
    drop(clients);
    drop(proxies);
    tokio::time::sleep(Duration::from_millis(300)).await;
    Outcome {
        etcd_us_per_put: (e1 - e0) * 1e6 / puts as f64,
        proxies_cpu_s: p1 - p0,
        levels,
        wall,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("tiers: skipped (needs `cargo bench --bench tiers`)");
        return;
    }
    testkit::init_tracing();
    let quick = common::quick();
    let n = env_usize("TIERS_N", if quick { 2000 } else { 10_000 });
    let puts = env_usize("TIERS_PUTS", if quick { 150 } else { 500 });
    let paced_n = env_usize("TIERS_PACED_N", 1000);
    let rate = env_usize("TIERS_RATE", 200) as f64;
    let (etcd, _client) = testkit::etcd_with_client(EtcdOptions::default()).await;
    println!(
        "tiers: etcd {:?}, load average {}",
        etcd.status().map(|s| s.version),
        common::proc::loadavg()
    );
    let mut run_no = 0;
    // Paced, so that N = 1 and N = n take the same wall time: etcd's time-based CPU
    // (raft ticks, the proxies' progress requests) weighs the same on both.
    let cpu_rate = env_usize("TIERS_CPU_RATE", 50) as f64;
    println!(
        "\n## etcd CPU per put, paced at {cpu_rate} puts/s, {puts} puts (N watchers against 1)\n"
    );
    println!("| setup | N | etcd CPU µs/put | proxies CPU s | wall s | N / 1 etcd CPU per put |");
    println!("|---|---:|---:|---:|---:|---:|");
    for setup in [Setup::One, Setup::Two, Setup::Tree] {
        let mut per = Vec::new();
        for k in [1, n] {
            run_no += 1;
            let o = run(setup, &etcd, k, puts, cpu_rate, run_no).await;
            per.push(o.etcd_us_per_put);
            println!(
                "| {setup:?} | {k} | {:.0} | {:.2} | {:.2} | {} |",
                o.etcd_us_per_put,
                o.proxies_cpu_s,
                o.wall,
                if per.len() == 2 {
                    format!("{:.2}x", per[1] / per[0])
                } else {
                    "-".into()
                }
            );
        }
    }
    let paced_puts = (rate * 5.0) as usize;
    println!("\n## Latency per level, paced at {rate} puts/s, N = {paced_n}, {paced_puts} puts\n");
    println!("| setup | level | deliveries | p50 ms | p99 ms | etcd CPU µs/put |");
    println!("|---|---|---:|---:|---:|---:|");
    for setup in [Setup::One, Setup::Two, Setup::Tree] {
        run_no += 1;
        let o = run(setup, &etcd, paced_n, paced_puts, rate, run_no).await;
        for (name, level) in &o.levels {
            println!(
                "| {setup:?} | {name} | {} | {:.2} | {:.2} | {:.0} |",
                level.deliveries.load(Ordering::Relaxed),
                level.percentile(0.5),
                level.percentile(0.99),
                o.etcd_us_per_put
            );
        }
    }
    println!("\ntiers: load average {}", common::proc::loadavg());
}
