//! The main example: one `Cache`, a few thousand subscribers, a burst of writes.
//!
//! ```text
//! cargo xtask demo                       # starts a throwaway etcd on loopback
//! ETCD_ENDPOINTS=127.0.0.1:2379 cargo run --release --example demo
//! cargo run --release --example demo -- --subscribers 5000 --puts 10000 --in-flight 32
//! ```
//!
//! It starts a cache on a fresh prefix, opens the subscribers (whole-prefix watches,
//! sub-prefix watches and exact-key watches), writes a burst of puts with several in
//! flight, and then checks that every subscriber received exactly the revisions that
//! matched it, in order. It prints what was delivered and how fast, and exits with 1 if any
//! subscriber missed, repeated or reordered anything.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use etcd_cache::{Cache, WatchOptions};
use futures::FutureExt;
use tokio::sync::watch;

/// Clock base of the timestamps carried in the values (same process writes and reads).
static BASE: OnceLock<Instant> = OnceLock::new();

fn now_ns() -> u64 {
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

#[derive(Debug, Clone)]
struct Args {
    subscribers: usize,
    puts: usize,
    keys: usize,
    in_flight: usize,
    value_size: usize,
}

impl Args {
    fn parse() -> Result<Args, String> {
        let mut a = Args {
            subscribers: 3000,
            puts: 5000,
            keys: 500,
            in_flight: 16,
            value_size: 128,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut num = |name: &str| -> Result<usize, String> {
                it.next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&n: &usize| n > 0)
                    .ok_or_else(|| format!("{name} needs a positive number"))
            };
            match flag.as_str() {
                "--subscribers" => a.subscribers = num("--subscribers")?,
                "--puts" => a.puts = num("--puts")?,
                "--keys" => a.keys = num("--keys")?.min(10_000),
                "--in-flight" => a.in_flight = num("--in-flight")?,
                "--value-size" => a.value_size = num("--value-size")?.max(8),
                "-h" | "--help" => {
                    return Err("usage: demo [--subscribers N] [--puts N] [--keys N] [--in-flight N] [--value-size BYTES]\n\
                                ETCD_ENDPOINTS=host:port,... uses that etcd instead of starting one"
                        .into())
                }
                other => return Err(format!("unknown argument `{other}` (try --help)")),
            }
        }
        Ok(a)
    }
}

/// What one subscriber watches.
#[derive(Debug, Clone)]
enum Sub {
    /// The whole demo prefix.
    All,
    /// Keys `key-<d>...` (one tenth of the keys when there are 10, 100 or 1000 of them).
    Group(u8),
    /// One key.
    Key(usize),
}

impl Sub {
    fn matches(&self, key_index: usize, keys: usize) -> bool {
        match self {
            Sub::All => true,
            Sub::Group(d) => key_name(key_index, keys).as_bytes()[4] == b'0' + d,
            Sub::Key(k) => *k == key_index,
        }
    }
}

fn key_width(keys: usize) -> usize {
    (keys.max(2) - 1).to_string().len()
}

fn key_name(i: usize, keys: usize) -> String {
    format!("key-{i:0w$}", w = key_width(keys))
}

/// What one subscriber saw.
struct Seen {
    revisions: Vec<i64>,
    /// Key indices of the events received (parallel to `revisions`).
    keys: Vec<u32>,
    latencies_ns: Vec<u64>,
    error: Option<String>,
}

fn percentile(sorted: &[u64], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Duration::from_nanos(sorted[i])
}

fn main() -> ExitCode {
    let args = match Args::parse() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    // Either the user's etcd or our own (kept alive until the end of main).
    let mut _own_etcd = None;
    let endpoints: Vec<String> = match std::env::var("ETCD_ENDPOINTS") {
        Ok(v) if !v.trim().is_empty() => v.split(',').map(|s| s.trim().to_string()).collect(),
        _ => {
            let started = Instant::now();
            let server = testkit::EtcdServer::start();
            println!(
                "started a throwaway etcd at {} in {:.1} s (set ETCD_ENDPOINTS to use your own)",
                server.endpoint(),
                started.elapsed().as_secs_f64()
            );
            let ep = server.endpoint();
            _own_etcd = Some(server);
            vec![ep]
        }
    };
    // With the `metrics` feature (as `cargo xtask demo` builds it), the cache records
    // into a Prometheus recorder and the demo prints a summary from the same metrics.
    #[cfg(feature = "metrics")]
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("a metrics recorder");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let outcome = runtime.block_on(run(args, endpoints));
    #[cfg(feature = "metrics")]
    print_metrics(&prometheus.render());
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run(args: Args, endpoints: Vec<String>) -> Result<bool, String> {
    let client = testkit::Connect::new()
        .options(etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(2)))
        .try_client(&endpoints)
        .await?;
    let prefix = format!(
        "/etcd-cache-demo/{}-{}/",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0)
    );
    let keys = args.keys;
    println!(
        "demo: prefix {prefix}, {} subscribers, {} puts over {} keys, {} in flight, {}-byte values",
        args.subscribers, args.puts, keys, args.in_flight, args.value_size
    );

    // -- the cache -----------------------------------------------------------------
    let t = Instant::now();
    let cache = Cache::builder(client.clone())
        .prefix(prefix.clone())
        // The whole burst fits in the window, so even a subscriber that lags from the
        // first put catches up from history instead of getting `Compacted`.
        .history_window(args.puts.max(1024) * 2)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    cache.wait_ready().await.map_err(|e| e.to_string())?;
    println!(
        "cache ready at revision {} in {:.1} ms",
        cache.revision(),
        t.elapsed().as_secs_f64() * 1e3
    );

    // -- the subscribers -------------------------------------------------------------
    // 10% whole prefix, 20% one key group, 70% one key each.
    let n = args.subscribers;
    // Key groups by leading digit: key-0.., key-1.., ... as many as the key names have.
    let groups = (key_name(keys - 1, keys).as_bytes()[4] - b'0') as usize + 1;
    let subs: Vec<Sub> = (0..n)
        .map(|i| match i % 10 {
            0 => Sub::All,
            1 | 2 => Sub::Group(((i / 10) % groups) as u8),
            _ => Sub::Key((i * 7919) % keys),
        })
        .collect();
    let (done_tx, done_rx) = watch::channel(0i64);
    let t = Instant::now();
    // Opened all at once, as a service's subscribers open theirs: every watch from now
    // waiting at the same time shares one barrier read to etcd.
    let opens = subs.iter().enumerate().map(|(i, sub)| {
        let (key, opts) = match sub {
            Sub::All => (prefix.clone(), WatchOptions::new().with_prefix()),
            Sub::Group(d) => (
                format!("{prefix}key-{d}"),
                WatchOptions::new().with_prefix(),
            ),
            Sub::Key(k) => (
                format!("{prefix}{}", key_name(*k, keys)),
                WatchOptions::new(),
            ),
        };
        // Every fourth subscriber also asks for previous key-values.
        let opts = if i % 4 == 3 {
            opts.with_prev_key()
        } else {
            opts
        };
        cache.watch(key, Some(opts))
    });
    let streams = futures_util::future::try_join_all(opens)
        .await
        .map_err(|e| e.to_string())?;
    let mut tasks = Vec::with_capacity(n);
    for mut stream in streams {
        let mut done = done_rx.clone();
        let key_prefix_len = prefix.len() + 4;
        tasks.push(tokio::spawn(async move {
            let mut seen = Seen {
                revisions: Vec::new(),
                keys: Vec::new(),
                latencies_ns: Vec::new(),
                error: None,
            };
            let record = |resp: etcd_cache::WatchResponse, seen: &mut Seen| {
                let now = now_ns();
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    let idx = std::str::from_utf8(&kv.key()[key_prefix_len..])
                        .ok()
                        .and_then(|s| s.parse::<u32>().ok())
                        .unwrap_or(u32::MAX);
                    let sent = kv
                        .value()
                        .get(..8)
                        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                        .unwrap_or(now);
                    seen.revisions.push(resp.revision());
                    seen.keys.push(idx);
                    seen.latencies_ns.push(now.saturating_sub(sent));
                }
            };
            loop {
                tokio::select! {
                    biased;
                    msg = stream.message() => match msg {
                        Ok(Some(resp)) => record(resp, &mut seen),
                        Ok(None) => { seen.error = Some("stream ended early".into()); break }
                        Err(e) => { seen.error = Some(e.to_string()); break }
                    },
                    _ = done.changed() => {
                        // Everything up to the final revision is queued (or in the
                        // history for a lagging stream): take what is ready, then stop.
                        while let Some(msg) = stream.message().now_or_never() {
                            match msg {
                                Ok(Some(resp)) => record(resp, &mut seen),
                                Ok(None) => break,
                                Err(e) => { seen.error = Some(e.to_string()); break }
                            }
                        }
                        break;
                    }
                }
            }
            seen
        }));
    }
    println!(
        "{n} subscribers open in {:.1} ms ({} whole prefix, {} key groups, {} single keys; every 4th with prev_kv)",
        t.elapsed().as_secs_f64() * 1e3,
        subs.iter().filter(|s| matches!(s, Sub::All)).count(),
        subs.iter().filter(|s| matches!(s, Sub::Group(_))).count(),
        subs.iter().filter(|s| matches!(s, Sub::Key(_))).count(),
    );

    // -- the burst ----------------------------------------------------------------------
    let next = Arc::new(AtomicI64::new(0));
    let t_burst = Instant::now();
    let mut writers = Vec::new();
    for _ in 0..args.in_flight {
        let mut kv = client.kv_client();
        let next = next.clone();
        let (puts, value_size, prefix) = (args.puts as i64, args.value_size, prefix.clone());
        writers.push(tokio::spawn(async move {
            let mut written: Vec<(i64, u32)> = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= puts {
                    return Ok::<_, String>(written);
                }
                let k = (i as usize) % keys;
                let mut value = vec![b'x'; value_size];
                value[..8].copy_from_slice(&now_ns().to_le_bytes());
                let resp = kv
                    .put(format!("{prefix}{}", key_name(k, keys)), value, None)
                    .await
                    .map_err(|e| format!("put failed: {e}"))?;
                let rev = resp.header().map_or(0, |h| h.revision());
                written.push((rev, k as u32));
            }
        }));
    }
    let mut written: Vec<(i64, u32)> = Vec::with_capacity(args.puts);
    for w in writers {
        written.extend(w.await.map_err(|e| e.to_string())??);
    }
    let burst = t_burst.elapsed();
    written.sort_unstable();
    let last_rev = written.last().map_or(0, |w| w.0);
    tokio::time::timeout(Duration::from_secs(20), cache.wait_for_revision(last_rev))
        .await
        .map_err(|_| format!("the cache did not reach revision {last_rev} within 20 s"))?
        .map_err(|e| e.to_string())?;
    let _ = done_tx.send(last_rev);
    let mut seen = Vec::with_capacity(n);
    for t in tasks {
        seen.push(t.await.map_err(|e| e.to_string())?);
    }
    let delivered_in = t_burst.elapsed();

    // -- check ---------------------------------------------------------------------------
    let rev_key: HashMap<i64, u32> = written.iter().copied().collect();
    let mut failures = Vec::new();
    let mut deliveries = 0usize;
    let mut latencies: Vec<u64> = Vec::new();
    for (i, (sub, s)) in subs.iter().zip(&seen).enumerate() {
        deliveries += s.revisions.len();
        latencies.extend_from_slice(&s.latencies_ns);
        let want: Vec<i64> = written
            .iter()
            .filter(|(_, k)| sub.matches(*k as usize, keys))
            .map(|(r, _)| *r)
            .collect();
        let keys_ok = s
            .revisions
            .iter()
            .zip(&s.keys)
            .all(|(r, k)| rev_key.get(r) == Some(k));
        if let Some(e) = &s.error {
            failures.push(format!("subscriber {i} ({sub:?}): error {e}"));
        } else if s.revisions != want || !keys_ok {
            let ordered = s.revisions.windows(2).all(|w| w[0] < w[1]);
            failures.push(format!(
                "subscriber {i} ({sub:?}): got {} events, want {} (in order: {ordered}, keys right: {keys_ok})",
                s.revisions.len(),
                want.len()
            ));
        }
    }
    latencies.sort_unstable();
    let stats = cache.stats();
    cache.close().await;

    println!();
    println!(
        "wrote      {} puts in {:.2} s: {:.0} puts/s (revisions {}..={last_rev})",
        written.len(),
        burst.as_secs_f64(),
        written.len() as f64 / burst.as_secs_f64(),
        written.first().map_or(0, |w| w.0)
    );
    println!(
        "delivered  {deliveries} events to {n} subscribers in {:.2} s: {:.0} deliveries/s",
        delivered_in.as_secs_f64(),
        deliveries as f64 / delivered_in.as_secs_f64()
    );
    println!(
        "latency    put -> delivery p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        percentile(&latencies, 0.50).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        percentile(&latencies, 1.0).as_secs_f64() * 1e3
    );
    println!(
        "cache      {} keys, {} revisions in history, {} upstream connect(s), {} list(s)",
        stats.keys, stats.history_len, stats.connects, stats.lists
    );
    let per_kind = |f: fn(&Sub) -> bool| {
        let (c, d): (usize, usize) = subs
            .iter()
            .zip(&seen)
            .filter(|(s, _)| f(s))
            .fold((0, 0), |(c, d), (_, s)| (c + 1, d + s.revisions.len()));
        (c, d)
    };
    for (name, f) in [
        (
            "whole prefix",
            (|s: &Sub| matches!(s, Sub::All)) as fn(&Sub) -> bool,
        ),
        ("key group", |s: &Sub| matches!(s, Sub::Group(_))),
        ("single key", |s: &Sub| matches!(s, Sub::Key(_))),
    ] {
        let (c, d) = per_kind(f);
        println!("  {name:<13} {c:>6} subscribers, {d:>9} events");
    }
    if failures.is_empty() {
        println!("check      OK: every subscriber got exactly its matching revisions, in order, no gap, no duplicate");
        Ok(true)
    } else {
        println!(
            "check      FAILED for {} of {n} subscribers:",
            failures.len()
        );
        for f in failures.iter().take(20) {
            println!("  {f}");
        }
        Ok(false)
    }
}

/// A summary of the cache's own metrics (the Prometheus text the recorder renders).
#[cfg(feature = "metrics")]
fn print_metrics(text: &str) {
    let value = |name: &str, label: &str| -> f64 {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| l.split(['{', ' ']).next() == Some(name) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    println!("metrics    (from the cache's metrics, Prometheus names in docs/METRICS.md)");
    println!(
        "  upstream   {} events in {} revisions, {} connects, {} lists",
        value("etcd_cache_upstream_events_total", ""),
        value("etcd_cache_upstream_revisions_total", ""),
        value("etcd_cache_upstream_connects_total", ""),
        value("etcd_cache_list_pages_total", ""),
    );
    println!(
        "  fan-out    {} deliveries, {} watches opened, {} lagged, {} ended (dropped {})",
        value("etcd_cache_deliveries_total", ""),
        value("etcd_cache_watches_opened_total", ""),
        value("etcd_cache_lagging_total", ""),
        value("etcd_cache_watches_ended_total", ""),
        value("etcd_cache_watches_ended_total", "reason=\"dropped\""),
    );
    println!(
        "  state      revision {}, {} keys, {} bytes, history {} revisions",
        value("etcd_cache_revision", ""),
        value("etcd_cache_store_keys", ""),
        value("etcd_cache_store_bytes", ""),
        value("etcd_cache_history_revisions", ""),
    );
    println!(
        "  reads      {} consistent from memory, {} by etcd",
        value("etcd_cache_consistent_reads_total", "served=\"memory\""),
        value("etcd_cache_consistent_reads_total", "served=\"etcd\""),
    );
}
