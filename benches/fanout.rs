//! End-to-end fan-out against a real etcd: one cache against direct etcd watches and
//! etcd's gRPC proxy, in process (local) and as a front for remote watchers (remote).
//!
//! ```text
//! cargo xtask bench fanout [--quick]        # builds etcd-cache-proxy, then cargo bench --bench fanout
//! cargo bench --bench fanout -- --n 1,100,1000 --puts 5000 --modes direct,cache
//! cargo bench --bench fanout -- --modes remote --n 1000,10000
//! cargo bench --bench fanout -- --modes remote --n 1000 --rate 500   # paced writers
//! ```
//!
//! One etcd on loopback (started here), N subscribers on one prefix. Writers keep 16 puts in
//! flight (on their own thread, runtime and connection, straight to etcd), 256-byte values
//! whose first 8 bytes are the send time, over 1,000 keys. Each run serves the subscribers
//! one way. Local (the subscribers are in this process):
//! - `none`:   no watcher at all (the baseline for puts/s);
//! - `direct`: N etcd-client watches on one connection, 100 per gRPC watch stream (N <= 1000);
//! - `proxy`:  the same N watches through `etcd grpc-proxy start` (N <= 1000);
//! - `cache`:  N subscribers of one `Cache` (which holds one watch on etcd).
//!
//! Remote (`--modes remote`): N etcd-client watches over M = ceil(N / 100) gRPC
//! connections, one Watch stream of up to 100 watches per connection, the same N and M for
//! the three variants; a proxy is started for its run only and stopped after it:
//! - `etcd`:        straight to etcd;
//! - `grpc-proxy`:  through `etcd grpc-proxy start`;
//! - `cache-proxy`: through `etcd-cache-proxy --prefix <the run's prefix>`, with its
//!   default flags (`--history-window` 2048: a watcher that falls out of the window is
//!   caught up from etcd; a canceled watch fails the run).
//!
//! A remote run writes min(puts, max-deliveries / N) puts (20,000,000 deliveries at most,
//! so N = 10,000 gets 2,000 puts), and each group of N is framed by two no-watcher runs of
//! the same puts, its baseline. `--rate R` paces the writers at R puts/s (every run), for
//! latency at a load the variants can all sustain; unpaced, the writers go as fast as etcd
//! takes 16 puts in flight, which saturates the machine at large N, so that p99 is mostly
//! the time to drain the backlog.
//!
//! Every run reports puts/s (and its ratio to the `none` runs), deliveries/s, put -> delivery
//! latency p50/p99 over every delivery, and CPU seconds and peak RSS of this process, of
//! etcd and of the proxy (from /proc; peaks are reset per run through `clear_refs`).
//! A run fails (exit code 1) if a subscriber misses an event or the run times out; slowness
//! is reported, never failed. SVG charts go to `<target dir>/fanout/fanout.svg` (local) and
//! `fanout-remote.svg` (remote).
//!
//! Run by `cargo test --all-targets` (no `--bench` argument) it only prints that it skipped.
//!
//! This file holds the runs; the latency histograms are `common::latency`, the /proc
//! reading `common::proc`, the tables and comparisons `common::fanout_results`, and the
//! SVG writer `common::chart`.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fanout_results::{
    ms, print_run, remote_comparisons, remote_table, svg, table, Mode, RunResult, LOCAL_LINES,
    REMOTE_LINES,
};
use common::latency::{
    now_ns, percentiles, record, record_response, reset_stats, total_deliveries, total_responses,
};
use common::proc::{clk_tck, cpu_ticks, loadavg, peak_rss_mib, reset_peak};
use etcd_cache::{Cache, WatchOptions};

const VALUE_SIZE: usize = 256;
const IN_FLIGHT: usize = 16;
const KEYS: usize = 1000;
const WATCHES_PER_STREAM: usize = 100;
/// Direct and proxied watches are measured up to this N (ten streams of 100 watches); the
/// cache alone goes further.
const DIRECT_MAX_N: usize = 1000;
/// Remote runs: deliveries per run at most (puts = min(puts, this / N)).
const REMOTE_MAX_DELIVERIES: usize = 20_000_000;
const REMOTE_MAX_DELIVERIES_QUICK: usize = 2_000_000;

/// The send time a writer put in a value's first 8 bytes ([`now_ns`]'s clock).
fn sent_time(value: &[u8]) -> u64 {
    value
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// Runs

/// The gRPC connections of a remote run: one per 100 watches.
fn remote_conns(n: usize) -> usize {
    n.div_ceil(WATCHES_PER_STREAM).max(1)
}

struct Env {
    etcd_pid: Option<u32>,
    proxy_pid: Option<u32>,
    etcd_ep: String,
    proxy_ep: String,
    /// The etcd-cache-proxy binary (remote runs), or why there is none.
    cache_proxy_bin: Result<std::path::PathBuf, String>,
    writer: Writer,
    /// Puts/s the writers are paced at (0: unpaced).
    rate: f64,
    run_no: usize,
}

/// A proxy process started for one remote run.
enum RunProxy {
    Grpc(testkit::ProxyProcess),
    Cache(common::CacheProxy),
}

impl RunProxy {
    fn pid(&self) -> Option<u32> {
        match self {
            RunProxy::Grpc(p) => p.pid(),
            RunProxy::Cache(p) => p.pid(),
        }
    }

    fn endpoint(&self) -> String {
        match self {
            RunProxy::Grpc(p) => p.endpoint(),
            RunProxy::Cache(p) => p.endpoint(),
        }
    }
}

/// Opens N watches on `prefix` through `ep`, 100 per stream, over `conns` connections
/// (stream i on connection i mod `conns`); each stream gets a task that counts and
/// timestamps every event. Returns once every watch is created.
async fn open_direct(
    ep: &str,
    prefix: &str,
    n: usize,
    puts: usize,
    conns: usize,
) -> Result<
    (
        Vec<etcd_client::Client>,
        Vec<tokio::task::JoinHandle<Result<(), String>>>,
    ),
    String,
> {
    let mut clients = Vec::with_capacity(conns);
    for _ in 0..conns.max(1) {
        clients.push(testkit::Connect::plain().try_client(&[ep]).await?);
    }
    let mut tasks = Vec::new();
    let mut left = n;
    let mut stream_no = 0;
    while left > 0 {
        let k = left.min(WATCHES_PER_STREAM);
        left -= k;
        let mut c = clients[stream_no % clients.len()].clone();
        stream_no += 1;
        let opts = || Some(etcd_client::WatchOptions::new().with_prefix());
        let mut stream = c.watch(prefix, opts()).await.map_err(|e| e.to_string())?;
        for _ in 1..k {
            stream
                .watch(prefix, opts())
                .await
                .map_err(|e| e.to_string())?;
        }
        let mut created = 0;
        while created < k {
            match stream.message().await.map_err(|e| e.to_string())? {
                Some(r) if r.created() => created += 1,
                Some(_) => {}
                None => return Err("watch stream ended during set-up".into()),
            }
        }
        let want = (k * puts) as u64;
        tasks.push(tokio::spawn(async move {
            let mut got = 0u64;
            while got < want {
                match stream.message().await {
                    Ok(Some(r)) => {
                        if r.canceled() {
                            return Err(format!("watch cancelled: {}", r.cancel_reason()));
                        }
                        let now = now_ns();
                        for ev in r.events() {
                            if let Some(kv) = ev.kv() {
                                record(sent_time(kv.value()), now, 1);
                            }
                        }
                        if !r.events().is_empty() {
                            record_response();
                        }
                        got += r.events().len() as u64;
                    }
                    Ok(None) => return Err("watch stream ended".into()),
                    Err(e) => return Err(e.to_string()),
                }
            }
            drop(stream);
            Ok(())
        }));
    }
    Ok((clients, tasks))
}

/// Opens one Cache on `prefix` and N subscribers of it.
async fn open_cache(
    ep: &str,
    prefix: &str,
    n: usize,
    puts: usize,
) -> Result<(Cache, Vec<tokio::task::JoinHandle<Result<(), String>>>), String> {
    let client = testkit::Connect::plain().try_client(&[ep]).await?;
    let cache = Cache::builder(client)
        .prefix(prefix)
        .history_window(puts.max(2048) + 1024)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    cache.wait_ready().await.map_err(|e| e.to_string())?;
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = cache
            .watch(prefix, Some(WatchOptions::new().with_prefix()))
            .await
            .map_err(|e| e.to_string())?;
        let want = puts as u64;
        tasks.push(tokio::spawn(async move {
            let mut got = 0u64;
            let mut last = 0i64;
            while got < want {
                match s.message().await {
                    Ok(Some(r)) => {
                        if r.events().is_empty() {
                            continue;
                        }
                        if r.revision() <= last {
                            return Err(format!("revision {} after {last}", r.revision()));
                        }
                        last = r.revision();
                        let now = now_ns();
                        for ev in r.events() {
                            if let Some(kv) = ev.kv() {
                                record(sent_time(kv.value()), now, 1);
                            }
                        }
                        if !r.events().is_empty() {
                            record_response();
                        }
                        got += r.events().len() as u64;
                    }
                    Ok(None) => return Err("cache stream ended".into()),
                    Err(e) => return Err(e.to_string()),
                }
            }
            Ok(())
        }));
    }
    Ok((cache, tasks))
}

/// The writers live on their own thread with their own single-threaded runtime and
/// connection, like another service writing to etcd: they never queue behind the
/// subscriber tasks of the runtime under test (their CPU still counts for this process).
/// A burst to write: prefix, number of puts, puts/s to pace them at (0: as fast as 16 in
/// flight go), where to send the elapsed time.
type WriteJob = (
    String,
    usize,
    f64,
    std::sync::mpsc::Sender<Result<Duration, String>>,
);

struct Writer {
    tx: std::sync::mpsc::Sender<WriteJob>,
}

impl Writer {
    fn start(ep: String) -> Result<Writer, String> {
        let (tx, rx) = std::sync::mpsc::channel::<WriteJob>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("fanout-writer".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let client = match testkit::Connect::plain().try_client(&[&ep]).await {
                        Ok(c) => {
                            let _ = ready_tx.send(Ok(()));
                            c
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return;
                        }
                    };
                    while let Ok((prefix, puts, rate, reply)) = rx.recv() {
                        let _ = reply.send(write_burst(&client, &prefix, puts, rate).await);
                    }
                });
            })
            .map_err(|e| e.to_string())?;
        ready_rx.recv().map_err(|e| e.to_string())??;
        Ok(Writer { tx })
    }

    /// Writes the burst and waits for it without blocking the caller's runtime.
    async fn write(&self, prefix: &str, puts: usize, rate: f64) -> Result<Duration, String> {
        let (reply_tx, reply_rx) = std::sync::mpsc::channel();
        self.tx
            .send((prefix.to_string(), puts, rate, reply_tx))
            .map_err(|e| e.to_string())?;
        tokio::task::spawn_blocking(move || reply_rx.recv().map_err(|e| e.to_string())?)
            .await
            .map_err(|e| e.to_string())?
    }
}

/// 16 writers, `puts` puts in total; with `rate` > 0, put i is not sent before
/// i / `rate` seconds from the start. Returns the elapsed time.
async fn write_burst(
    client: &etcd_client::Client,
    prefix: &str,
    puts: usize,
    rate: f64,
) -> Result<Duration, String> {
    let next = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let start = tokio::time::Instant::now();
    let mut ws = Vec::new();
    for _ in 0..IN_FLIGHT {
        let mut kv = client.kv_client();
        let next = next.clone();
        let prefix = prefix.to_string();
        ws.push(tokio::spawn(async move {
            let mut value = vec![b'v'; VALUE_SIZE];
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= puts as u64 {
                    return Ok::<(), String>(());
                }
                if rate > 0.0 {
                    tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate))
                        .await;
                }
                value[..8].copy_from_slice(&now_ns().to_le_bytes());
                kv.put(
                    format!("{prefix}k{:04}", i as usize % KEYS),
                    value.clone(),
                    None,
                )
                .await
                .map_err(|e| format!("put: {e}"))?;
            }
        }));
    }
    for w in ws {
        w.await.map_err(|e| e.to_string())??;
    }
    Ok(t.elapsed())
}

async fn run_one(
    env: &mut Env,
    mode: Mode,
    n: usize,
    puts: usize,
    group: usize,
) -> Result<RunResult, String> {
    env.run_no += 1;
    let prefix = format!(
        "/fanout/{}/{}-{}/",
        std::process::id(),
        env.run_no,
        mode.name()
    );
    let setup_t = Instant::now();
    let mut cache = None;
    let mut clients = Vec::new();
    // A remote run's proxy, started for this run (its start is not part of the set-up time).
    let run_proxy = match mode {
        Mode::RemoteGrpcProxy => {
            let etcd = env.etcd_ep.clone();
            Some(RunProxy::Grpc(
                tokio::task::spawn_blocking(move || testkit::grpc_proxy(&[etcd]))
                    .await
                    .map_err(|e| format!("grpc-proxy: {e}"))?,
            ))
        }
        Mode::RemoteCacheProxy => {
            let bin = env.cache_proxy_bin.clone()?;
            let etcd = env.etcd_ep.clone();
            // The defaults users run: a burst longer than the window is caught up from
            // etcd, not canceled (a canceled watch fails the run).
            let extra = vec!["--prefix".to_string(), prefix.clone()];
            Some(RunProxy::Cache(
                tokio::task::spawn_blocking(move || common::CacheProxy::start(&bin, &etcd, &extra))
                    .await
                    .map_err(|e| e.to_string())??,
            ))
        }
        _ => None,
    };
    let setup_t = if run_proxy.is_some() {
        Instant::now()
    } else {
        setup_t
    };
    let proxy_pid = match mode {
        Mode::Proxy => env.proxy_pid,
        _ => run_proxy.as_ref().and_then(RunProxy::pid),
    };
    let conns = match mode {
        Mode::None => 0,
        Mode::Cache => 0,
        Mode::Direct | Mode::Proxy => 1,
        _ => remote_conns(n),
    };
    let tasks = match mode {
        Mode::None => Vec::new(),
        Mode::Direct
        | Mode::Proxy
        | Mode::RemoteEtcd
        | Mode::RemoteGrpcProxy
        | Mode::RemoteCacheProxy => {
            let ep = match mode {
                Mode::Direct | Mode::RemoteEtcd => env.etcd_ep.clone(),
                Mode::Proxy => env.proxy_ep.clone(),
                _ => run_proxy
                    .as_ref()
                    .map(RunProxy::endpoint)
                    .unwrap_or_default(),
            };
            let (c, t) = open_direct(&ep, &prefix, n, puts, conns).await?;
            clients = c;
            t
        }
        Mode::Cache => {
            let (c, t) = open_cache(&env.etcd_ep, &prefix, n, puts).await?;
            cache = Some(c);
            t
        }
    };
    let setup = setup_t.elapsed();
    tokio::time::sleep(Duration::from_millis(100)).await;
    reset_stats();
    let peaks_reset = reset_peak(None) & reset_peak(env.etcd_pid);
    if let Some(p) = proxy_pid {
        reset_peak(Some(p));
    }
    if !peaks_reset {
        eprintln!("fanout: cannot reset peak RSS through /proc/*/clear_refs; peaks are since process start");
    }
    let (c0, e0, p0) = (
        cpu_ticks(None),
        cpu_ticks(env.etcd_pid),
        cpu_ticks(proxy_pid),
    );
    let t0 = Instant::now();
    let write_time = env.writer.write(&prefix, puts, env.rate).await?;
    // Wait for every subscriber; generous, and only a failure if nothing moves for 60 s.
    let want = (n * puts) as u64;
    let mut last_progress = (Instant::now(), total_deliveries());
    let mut failed = None;
    // etcd's grpc-proxy cancels a client's whole watch stream when it cannot queue a
    // response to it within 50 ms (`watcher.post` in its proxy/grpcproxy/watcher.go): that
    // is how it treats a slow client, so it is reported (streams cut), not a failure.
    let cuts_streams = matches!(mode, Mode::Proxy | Mode::RemoteGrpcProxy);
    let mut cut = (0usize, None::<String>);
    let streams = tasks.len();
    for t in tasks {
        let mut t = t;
        loop {
            match tokio::time::timeout(Duration::from_secs(1), &mut t).await {
                Ok(Ok(Ok(()))) => break,
                Ok(Ok(Err(e))) if cuts_streams => {
                    cut.0 += 1;
                    cut.1.get_or_insert(e);
                    break;
                }
                Ok(Ok(Err(e))) => {
                    failed.get_or_insert(e);
                    break;
                }
                Ok(Err(e)) => {
                    failed.get_or_insert(e.to_string());
                    break;
                }
                Err(_) => {
                    let d = total_deliveries();
                    if d != last_progress.1 {
                        last_progress = (Instant::now(), d);
                    } else if last_progress.0.elapsed() > Duration::from_secs(60) {
                        t.abort();
                        failed.get_or_insert(format!("stalled at {d} of {want} deliveries"));
                        break;
                    }
                }
            }
        }
    }
    let elapsed = t0.elapsed();
    let (c1, e1, p1) = (
        cpu_ticks(None),
        cpu_ticks(env.etcd_pid),
        cpu_ticks(proxy_pid),
    );
    let deliveries = total_deliveries();
    let responses = total_responses();
    let ps = percentiles(&[0.5, 0.99]);
    let tck = clk_tck();
    let r = RunResult {
        mode,
        n,
        conns,
        group,
        puts,
        puts_per_s: puts as f64 / write_time.as_secs_f64(),
        deliveries,
        responses,
        streams,
        streams_cut: cut.0,
        deliveries_per_s: deliveries as f64 / elapsed.as_secs_f64(),
        p50: ps[0],
        p99: ps[1],
        client_cpu_s: (c1 - c0) as f64 / tck,
        etcd_cpu_s: (e1 - e0) as f64 / tck,
        proxy_cpu_s: if mode.has_proxy() {
            (p1 - p0) as f64 / tck
        } else {
            0.0
        },
        client_peak_mib: peak_rss_mib(None),
        etcd_peak_mib: peak_rss_mib(env.etcd_pid),
        proxy_peak_mib: if mode.has_proxy() {
            peak_rss_mib(proxy_pid)
        } else {
            0.0
        },
        setup,
    };
    if let Some(c) = cache {
        c.close().await;
    }
    drop(clients);
    if let (Some(e), Some(RunProxy::Cache(p))) = (&failed, &run_proxy) {
        eprintln!(
            "fanout: {e}; etcd-cache-proxy's log ends:\n{}",
            p.log_tail(20)
        );
    }
    drop(run_proxy);
    if let Some(e) = failed {
        return Err(format!("{} N={n}: {e}", mode.name()));
    }
    if cut.0 > 0 {
        println!(
            "    {} N={n}: {} of {streams} watch streams cut by the proxy ({}); {deliveries} of {want} deliveries",
            mode.name(),
            cut.0,
            cut.1.as_deref().unwrap_or("")
        );
    }
    if mode != Mode::None && cut.0 == 0 && deliveries != want {
        return Err(format!(
            "{} N={n}: {deliveries} deliveries, want {want}",
            mode.name()
        ));
    }
    // Let etcd drop the closed watches before the next run.
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(r)
}

// ---------------------------------------------------------------------------------------

struct Opts {
    ns: Vec<usize>,
    /// The remote runs' N (the quick form leaves out N > 1000).
    remote_ns: Vec<usize>,
    puts: usize,
    /// Remote runs write min(puts, max_deliveries / N) puts.
    max_deliveries: usize,
    modes: Vec<Mode>,
    /// Puts/s to pace the writers at (0: as fast as 16 puts in flight go).
    rate: f64,
}

const ALL_MODES: [Mode; 6] = [
    Mode::Direct,
    Mode::Proxy,
    Mode::Cache,
    Mode::RemoteEtcd,
    Mode::RemoteGrpcProxy,
    Mode::RemoteCacheProxy,
];

fn parse_opts() -> Result<Opts, String> {
    let quick = common::quick();
    let mut o = if quick {
        Opts {
            ns: vec![1, 100, 1000, 10_000],
            remote_ns: vec![1, 100, 1000],
            puts: 2000,
            max_deliveries: REMOTE_MAX_DELIVERIES_QUICK,
            modes: ALL_MODES.to_vec(),
            rate: 0.0,
        }
    } else {
        Opts {
            ns: vec![1, 100, 1000, 10_000],
            remote_ns: vec![1, 100, 1000, 10_000],
            puts: 10_000,
            max_deliveries: REMOTE_MAX_DELIVERIES,
            modes: ALL_MODES.to_vec(),
            rate: 0.0,
        }
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--bench" => {}
            "--n" => {
                o.ns = it
                    .next()
                    .ok_or("--n needs a list")?
                    .split(',')
                    .map(|v| v.trim().parse().map_err(|_| format!("bad N {v}")))
                    .collect::<Result<_, _>>()?;
                o.remote_ns = o.ns.clone();
            }
            "--puts" => {
                o.puts = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--puts needs a number")?
            }
            "--rate" => {
                o.rate = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--rate needs a number (puts/s)")?
            }
            "--max-deliveries" => {
                o.max_deliveries = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--max-deliveries needs a number")?
            }
            "--modes" => {
                let mut modes = Vec::new();
                for m in it.next().ok_or("--modes needs a list")?.split(',') {
                    match m.trim() {
                        "direct" => modes.push(Mode::Direct),
                        "proxy" => modes.push(Mode::Proxy),
                        "cache" => modes.push(Mode::Cache),
                        "local" => modes.extend(&ALL_MODES[..3]),
                        "etcd" => modes.push(Mode::RemoteEtcd),
                        "grpc-proxy" => modes.push(Mode::RemoteGrpcProxy),
                        "cache-proxy" => modes.push(Mode::RemoteCacheProxy),
                        "remote" => modes.extend(&ALL_MODES[3..]),
                        other => return Err(format!("unknown mode {other} (direct, proxy, cache, local, etcd, grpc-proxy, cache-proxy, remote)")),
                    }
                }
                o.modes = modes;
            }
            // Arguments cargo bench passes to every bench target (filters etc.) are ignored.
            _ => {}
        }
    }
    Ok(o)
}

/// Remote runs write fewer puts at large N, so that a run stays under `max_deliveries`.
fn remote_puts(o: &Opts, n: usize) -> usize {
    o.puts.min(o.max_deliveries / n.max(1)).max(1)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "fanout: skipped (needs `cargo bench --bench fanout` or `cargo xtask bench fanout`)"
        );
        return;
    }
    let opts = match parse_opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("fanout: {e}");
            std::process::exit(2);
        }
    };
    now_ns();
    let started = Instant::now();
    let server = testkit::EtcdServer::start_with(
        testkit::EtcdOptions::default().arg("--quota-backend-bytes=8589934592"),
    );
    let proxy = if opts.modes.contains(&Mode::Proxy) {
        Some(testkit::grpc_proxy(&[server.endpoint()]))
    } else {
        None
    };
    let cache_proxy_bin = if opts.modes.contains(&Mode::RemoteCacheProxy) {
        common::cache_proxy_bin()
    } else {
        Err("not asked for".to_string())
    };
    if let (true, Err(e)) = (
        opts.modes.contains(&Mode::RemoteCacheProxy),
        &cache_proxy_bin,
    ) {
        eprintln!("fanout: {e}");
        std::process::exit(2);
    }
    let version = server.status().map(|s| s.version).unwrap_or_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let code = rt.block_on(async {
        let writer = match Writer::start(server.endpoint()) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("fanout: {e}");
                return 1;
            }
        };
        let mut env = Env {
            etcd_pid: server.pid(),
            proxy_pid: proxy.as_ref().and_then(|p| p.pid()),
            etcd_ep: server.endpoint(),
            proxy_ep: proxy.as_ref().map(|p| p.endpoint()).unwrap_or_default(),
            cache_proxy_bin,
            writer,
            rate: opts.rate,
            run_no: 0,
        };
        let local_modes: Vec<Mode> = opts.modes.iter().copied().filter(|m| !m.is_remote()).collect();
        let remote_modes: Vec<Mode> = opts.modes.iter().copied().filter(|m| m.is_remote()).collect();
        println!(
            "fanout: etcd {version}, {} CPUs, {} puts per run{}, {IN_FLIGHT} in flight, {VALUE_SIZE}-byte values, {KEYS} keys, local N in {:?}, remote N in {:?} (at most {} deliveries per remote run), load average {}",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            opts.puts,
            if opts.rate > 0.0 { format!(" paced at {} puts/s", opts.rate) } else { String::new() },
            if local_modes.is_empty() { &[][..] } else { &opts.ns[..] },
            if remote_modes.is_empty() { &[][..] } else { &opts.remote_ns[..] },
            opts.max_deliveries,
            loadavg()
        );
        if let Ok(bin) = &env.cache_proxy_bin {
            println!("fanout: etcd-cache-proxy is {}", bin.display());
        }
        // Warm-up (connections, etcd's first writes), not reported.
        let _ = run_one(&mut env, Mode::None, 0, opts.puts / 4, 0).await;
        let mut results = Vec::new();
        let mut failures = Vec::new();
        // (mode, N, puts, group): group 0 is the local suite, 1.. the remote groups of N.
        let mut plan = Vec::new();
        if !local_modes.is_empty() {
            plan.push((Mode::None, 0, opts.puts, 0));
            for &n in &opts.ns {
                if n != opts.ns[0] {
                    // A no-watcher run between the groups too, to see the baseline drift.
                    plan.push((Mode::None, 0, opts.puts, 0));
                }
                for &m in &local_modes {
                    if matches!(m, Mode::Direct | Mode::Proxy) && n > DIRECT_MAX_N {
                        continue;
                    }
                    plan.push((m, n, opts.puts, 0));
                }
            }
            // The no-watcher baseline once more at the end, to see drift.
            plan.push((Mode::None, 0, opts.puts, 0));
        }
        if !remote_modes.is_empty() {
            // Each N: a no-watcher run of the same puts before and after the variants.
            for (gi, &n) in opts.remote_ns.iter().enumerate() {
                let puts = remote_puts(&opts, n);
                plan.push((Mode::None, 0, puts, gi + 1));
                for &m in &remote_modes {
                    plan.push((m, n, puts, gi + 1));
                }
                plan.push((Mode::None, 0, puts, gi + 1));
            }
        }
        let mut remote_started = false;
        for (mode, n, puts, group) in plan {
            if group > 0 && !remote_started {
                remote_started = true;
                println!("remote runs (N watchers over M = ceil(N/100) connections), load average {}", loadavg());
            }
            match run_one(&mut env, mode, n, puts, group).await {
                Ok(r) => {
                    print_run(&r);
                    results.push(r);
                }
                Err(e) => {
                    println!("run {:<11} N={:<6} FAILED: {e}", mode.name(), n);
                    failures.push(e);
                }
            }
        }
        let local: Vec<RunResult> = results.iter().filter(|r| r.group == 0).cloned().collect();
        let nones: Vec<f64> = local.iter().filter(|r| r.mode == Mode::None).map(|r| r.puts_per_s).collect();
        let baseline = if nones.is_empty() { f64::NAN } else { nones.iter().sum::<f64>() / nones.len() as f64 };
        let one_watch = local.iter().find(|r| r.mode == Mode::Direct && r.n == 1).map(|r| r.puts_per_s);
        if !local_modes.is_empty() {
            println!();
            println!("comparisons (puts/s ratio to the no-watcher baseline of {baseline:.0} puts/s, mean of the no-watcher runs):");
            for r in local.iter().filter(|r| r.mode != Mode::None) {
                let direct = local.iter().find(|d| d.mode == Mode::Direct && d.n == r.n);
                let extra = match (r.mode, direct) {
                    (Mode::Direct, _) | (_, None) => String::new(),
                    (_, Some(d)) => format!(
                        ", deliveries/s {:.2}x direct, p99 {:+.2} ms vs direct",
                        r.deliveries_per_s / d.deliveries_per_s,
                        ms(r.p99) - ms(d.p99)
                    ),
                };
                let vs1 = one_watch.map_or(String::new(), |b| format!(" ({:.2}x one direct watch)", r.puts_per_s / b));
                println!(
                    "  {:<6} N={:<6} puts/s ratio {:.2}x{vs1}, {:.0} deliveries/s, p99 {:.2} ms{extra}",
                    r.mode.name(), r.n, r.puts_per_s / baseline, r.deliveries_per_s, ms(r.p99)
                );
            }
            println!();
            print!("{}", table(&local, baseline, one_watch));
        }
        if !remote_modes.is_empty() {
            println!();
            print!("{}", remote_comparisons(&results));
            println!();
            print!("{}", remote_table(&results));
        }
        let dir = std::path::PathBuf::from(std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/target").to_string()
        }))
        .join("fanout");
        if std::fs::create_dir_all(&dir).is_ok() {
            println!();
            if !local_modes.is_empty() {
                let _ = std::fs::write(dir.join("fanout.svg"), svg(&local, &LOCAL_LINES));
                let _ = std::fs::write(dir.join("fanout.md"), table(&local, baseline, one_watch));
                println!("chart: {}  table: {}", dir.join("fanout.svg").display(), dir.join("fanout.md").display());
            }
            if !remote_modes.is_empty() {
                let _ = std::fs::write(dir.join("fanout-remote.svg"), svg(&results, &REMOTE_LINES));
                let _ = std::fs::write(
                    dir.join("fanout-remote.md"),
                    format!("{}\n{}", remote_table(&results), remote_comparisons(&results)),
                );
                println!("chart: {}  table: {}", dir.join("fanout-remote.svg").display(), dir.join("fanout-remote.md").display());
            }
        }
        println!("fanout: {} runs in {:.0} s, {} failed, load average {}", results.len() + failures.len(), started.elapsed().as_secs_f64(), failures.len(), loadavg());
        if failures.is_empty() { 0 } else { 1 }
    });
    drop(proxy);
    drop(server);
    std::process::exit(code);
}
