//! The cost of a watch from now (`linearizable_watch_start(true)`, the default) against
//! a direct etcd watch: latency per open and etcd CPU per open, opened one after
//! another and all at once, and the requests to etcd (revision probes, RequestProgress
//! messages) the cache sent. Real etcd (`ETCD_VERSION` / `ETCD_BIN`).
//!
//! A watch from now waits for one shared revision probe (a count-only Range sent after
//! the call, shared by every open waiting). A `RequestProgress` on the cache's upstream
//! watch as the barrier instead was measured on 3.7.3 (2026-12-02): 1.33 ms per
//! sequential open against the probe's 0.33 ms, for 160 against 250 µs of etcd CPU per
//! open; etcd spends about as much on any message as on a direct watch create, so no
//! per-open round trip reaches a tenth of a direct open's CPU.
//!
//! Watches added to one stream (`WatchStream::watch`, as the proxy adds a client's
//! creates) do not wait for the probe each: it is asked for as each is added and shared
//! by every watch waiting, and their `created` responses follow in order. `Cache::watch`
//! returns an open watch (as `etcd_client::Client::watch` returns once etcd created it),
//! so opens one after another with it wait one probe each.
//!
//! `cargo bench --bench watch_open` (`ETCD_CACHE_BENCH_QUICK=1`: 500 opens instead of
//! 2,000; `WATCH_OPEN_CONCURRENT=N` sets the all-at-once count, default 10,000).

mod common;

use std::time::{Duration, Instant};

use etcd_cache::WatchOptions;
use testkit::EtcdOptions;

fn etcd_cpu(pid: u32) -> Duration {
    Duration::from_secs_f64(common::proc::cpu_ticks(Some(pid)) as f64 / common::proc::clk_tck())
}

fn row(what: &str, n: usize, took: Duration, cpu: Duration, requests: &str) {
    println!(
        "WATCH_OPEN | {what:<38} | {n:>6} opens | {:>9.1} µs/open | etcd CPU {:>7.3} s ({:>6.1} µs/open) | {requests}",
        took.as_secs_f64() * 1e6 / n as f64,
        cpu.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / n as f64,
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo test --all-targets` runs benches without `--bench`: nothing to measure then.
    if !std::env::args().any(|a| a == "--bench") {
        println!("watch_open: skipped (needs `cargo bench --bench watch_open`)");
        return;
    }
    testkit::init_tracing();
    let n = if common::quick() { 500 } else { 2000 };
    let concurrent: usize = std::env::var("WATCH_OPEN_CONCURRENT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let (etcd, client) = testkit::etcd_with_client(EtcdOptions::default()).await;
    let pid = etcd.pid().expect("etcd runs");
    let mut writer = client.clone();
    writer.put("/w/k", "0", None).await.unwrap();

    // Direct: watches created one after another on one etcd watch stream.
    let mut direct = client.watch_client();
    let mut stream = direct.watch("/w/k", None).await.expect("a watch stream");
    stream.message().await.unwrap().expect("created");
    let (cpu0, t0) = (etcd_cpu(pid), Instant::now());
    for _ in 0..n {
        stream.watch("/w/k", None).await.unwrap();
        let r = stream.message().await.unwrap().expect("created");
        assert!(r.created());
    }
    row(
        "direct etcd watch, one stream",
        n,
        t0.elapsed(),
        etcd_cpu(pid) - cpu0,
        "-",
    );
    // Direct, pipelined: every create sent on one stream, then every `created` read.
    let (cpu0, t0) = (etcd_cpu(pid), Instant::now());
    for _ in 0..n {
        stream.watch("/w/k", None).await.unwrap();
    }
    for _ in 0..n {
        let r = stream.message().await.unwrap().expect("created");
        assert!(r.created());
    }
    row(
        "direct etcd watch, one stream, pipelined",
        n,
        t0.elapsed(),
        etcd_cpu(pid) - cpu0,
        "-",
    );
    drop(stream);
    // Direct, as `Cache::watch` is used: `Client::watch` one after another, each a new
    // stream that returns once etcd has created its watch.
    let mut keep = Vec::with_capacity(n);
    let (cpu0, t0) = (etcd_cpu(pid), Instant::now());
    for _ in 0..n {
        keep.push(direct.watch("/w/k", None).await.unwrap());
    }
    row(
        "direct etcd Client::watch, one after another",
        n,
        t0.elapsed(),
        etcd_cpu(pid) - cpu0,
        "-",
    );
    drop(keep);

    for linearizable in [true, false] {
        let cache = testkit::ready_cache(client.clone(), |b| {
            b.prefix("/w/")
                .linearizable_watch_start(linearizable)
                .max_watchers(concurrent + n + 10)
        })
        .await;
        if linearizable {
            testkit::wait_for_version_verdict(&cache).await;
        }
        // One write after the cache's upstream watch started, as on any etcd in use (etcd
        // answers a RequestProgress only once its revision has reached the watch's start).
        let put = writer.put("/w/k", "1", None).await.unwrap();
        cache
            .wait_for_revision(put.header().unwrap().revision())
            .await
            .unwrap();
        let label = if linearizable {
            "strict"
        } else {
            "linearizable_watch_start(false)"
        };
        let requests = |before: u64| {
            format!(
                "RequestProgress sent: {}",
                cache.stats().progress_requests - before
            )
        };
        let mut keep = Vec::with_capacity(n);
        let (cpu0, t0, p0) = (
            etcd_cpu(pid),
            Instant::now(),
            cache.stats().progress_requests,
        );
        for _ in 0..n {
            keep.push(cache.watch("/w/k", None).await.unwrap());
        }
        row(
            &format!("cache {label}, one after another"),
            n,
            t0.elapsed(),
            etcd_cpu(pid) - cpu0,
            &requests(p0),
        );
        drop(keep);
        // Added one after another to one stream (as the proxy adds a client's creates):
        // `watch()` returns at once; the time runs until every `created` is read.
        let mut stream = cache.watch_stream();
        let (cpu0, t0, p0) = (
            etcd_cpu(pid),
            Instant::now(),
            cache.stats().progress_requests,
        );
        for _ in 0..n {
            stream.watch("/w/k", None).await.unwrap();
        }
        let added = t0.elapsed();
        for _ in 0..n {
            let r = stream.message().await.unwrap().expect("created");
            assert!(r.created());
        }
        row(
            &format!("cache {label}, one stream, one after another"),
            n,
            t0.elapsed(),
            etcd_cpu(pid) - cpu0,
            &format!(
                "{}; watch() {:.1} µs/call",
                requests(p0),
                added.as_secs_f64() * 1e6 / n as f64
            ),
        );
        drop(stream);
        let (cpu0, t0, p0) = (
            etcd_cpu(pid),
            Instant::now(),
            cache.stats().progress_requests,
        );
        let opens: Vec<_> = (0..concurrent)
            .map(|_| {
                let cache = cache.clone();
                tokio::spawn(async move {
                    cache
                        .watch("/w/k", Some(WatchOptions::new()))
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut keep = Vec::with_capacity(concurrent);
        for o in opens {
            keep.push(o.await.unwrap());
        }
        row(
            &format!("cache {label}, all at once"),
            concurrent,
            t0.elapsed(),
            etcd_cpu(pid) - cpu0,
            &requests(p0),
        );
        println!(
            "WATCH_OPEN | cache {label}: trusted progress {}",
            cache.stats().progress_trusted
        );
        drop(keep);
        cache.close().await;
    }
}
