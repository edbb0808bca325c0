//! In-process delivery cost, without etcd: CPU per delivery of N subscribers, each one
//! `Cache::watch` on the prefix drained by its own task, on a two-worker runtime, while
//! a writer thread feeds puts through the crate's in-memory upstream at a fixed rate.
//!
//! ```text
//! cargo bench --features unstable-bench-internals --bench deliver
//! cargo bench --features unstable-bench-internals --bench deliver -- --n 1000 --puts 20000 --rate 5000 --rounds 3 --recv one,batch
//! ```
//!
//! Each round runs "none" (no subscriber: the writer, the follower, the store and the
//! history) and then each receive mode at the same rate; CPU per delivery is the
//! process's CPU of the round less that of "none", over N x puts. The paced writer keeps
//! every subscriber live (none lags), so the figure is the live path: the producer's
//! push into each mailbox, the wake-up, the consumer's poll and the response, as in
//! `benches/fanout.rs`'s in-process mode but without etcd and gRPC on the same two cores
//! (whose noise there is larger than the differences this bench is for). Receive modes:
//! `one` is `WatchStream::message` per response, `batch` is `WatchStream::messages` (up
//! to 64 at a time).
//!
//! Without `--bench` (`cargo test --features unstable-bench-internals --bench deliver`) it
//! does a small smoke run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_cache::internals::{mem_cache, MemCacheOptions};
use etcd_cache::WatchOptions;

mod common;
use common::proc::{clk_tck, cpu_ticks};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Recv {
    One,
    Batch,
}

struct Args {
    n: usize,
    puts: usize,
    rate: usize,
    rounds: usize,
    recv: Vec<Recv>,
    /// Watches per `WatchStream` (each stream one task): 1, or e.g. 100 as
    /// etcd-cache-proxy's streams at N = 10,000 over 100 connections.
    per_stream: usize,
}

fn args() -> Args {
    let mut a = Args {
        n: 1000,
        puts: 20_000,
        rate: 5_000,
        rounds: 3,
        recv: vec![Recv::One, Recv::Batch],
        per_stream: 1,
    };
    if common::quick() {
        a.puts = 4_000;
        a.rounds = 1;
    }
    let bench = std::env::args().any(|x| x == "--bench");
    if !bench {
        // Under `cargo test`: a smoke run, on streams of five watches.
        a.n = 10;
        a.per_stream = 5;
        a.puts = 200;
        a.rounds = 1;
    }
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_default();
        match flag.as_str() {
            "--n" => a.n = value().parse().expect("--n N"),
            "--puts" => a.puts = value().parse().expect("--puts P"),
            "--rate" => a.rate = value().parse().expect("--rate PUTS_PER_S"),
            "--rounds" => a.rounds = value().parse().expect("--rounds R"),
            "--per-stream" => a.per_stream = value().parse().expect("--per-stream K"),
            "--recv" => {
                a.recv = value()
                    .split(',')
                    .map(|m| match m {
                        "one" => Recv::One,
                        "batch" => Recv::Batch,
                        other => panic!("--recv one,batch, not {other}"),
                    })
                    .collect()
            }
            _ => {}
        }
    }
    a
}

/// One run's figures.
struct Run {
    cpu_s: f64,
    wall: Duration,
    /// Streams that saw a cancel.
    canceled: usize,
}

/// N subscribers (none if `recv` is `None`), `puts` puts at `rate` puts/s.
fn run(n: usize, per_stream: usize, puts: usize, rate: usize, recv: Option<Recv>) -> Run {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (cache, mut feed) = {
        let _in = rt.enter();
        mem_cache(
            MemCacheOptions {
                prefix: b"/d/".to_vec(),
                ..MemCacheOptions::default()
            },
            Vec::new(),
            1,
        )
        .expect("cache")
    };
    let n = if recv.is_some() { n } else { 0 };
    let mut subscribers = Vec::new();
    // Streams that saw a watch canceled (fell behind the history window): the round's
    // figure is then not the live path's, and is reported as such.
    let canceled = Arc::new(AtomicUsize::new(0));
    rt.block_on(async {
        cache.wait_ready().await.expect("ready");
        let mut left = n;
        while left > 0 {
            let k = left.min(per_stream.max(1));
            left -= k;
            let mut s = cache
                .watch("/d/", Some(WatchOptions::new().with_prefix()))
                .await
                .expect("watch");
            for _ in 1..k {
                s.watch("/d/", Some(WatchOptions::new().with_prefix()))
                    .await
                    .expect("watch");
            }
            // Every watch open (its `created` taken) before the writer starts.
            let mut created = 0;
            while created < k {
                let r = s.message().await.expect("message").expect("open");
                created += usize::from(r.created());
            }
            let puts = puts * k;
            let canceled = canceled.clone();
            let recv = recv.expect("subscribers have a mode");
            subscribers.push(tokio::spawn(async move {
                let mut seen = 0usize;
                let mut bytes = 0usize;
                let mut out = Vec::with_capacity(64);
                while seen < puts {
                    match recv {
                        Recv::One => {
                            let r = s.message().await.expect("message").expect("open");
                            if r.canceled() {
                                canceled.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            for ev in r.events() {
                                bytes += ev.kv().map_or(0, |kv| kv.value().len());
                            }
                            seen += r.events().len();
                        }
                        Recv::Batch => {
                            let got = s.messages(&mut out, 64).await.expect("messages");
                            assert!(got > 0, "stream ended");
                            if out.iter().any(|r| r.canceled()) {
                                canceled.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            for r in out.drain(..) {
                                for ev in r.events() {
                                    bytes += ev.kv().map_or(0, |kv| kv.value().len());
                                }
                                seen += r.events().len();
                            }
                        }
                    }
                }
                std::hint::black_box(bytes);
            }));
        }
    });
    let value = vec![b'v'; 256];
    let cpu0 = cpu_ticks(None);
    let t0 = Instant::now();
    // The writer: bursts of 16 puts (as 16 in flight against etcd), paced to `rate`.
    let writer = std::thread::spawn(move || {
        let start = Instant::now();
        let mut sent = 0usize;
        while sent < puts {
            for _ in 0..16.min(puts - sent) {
                feed.put(format!("/d/k{}", sent % 1000), value.clone());
                sent += 1;
            }
            let due = start + Duration::from_secs_f64(sent as f64 / rate as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        feed
    });
    let feed = writer.join().expect("writer");
    rt.block_on(async {
        // A subscriber that failed fails the run here (no hang waiting for it).
        for subscriber in subscribers.drain(..) {
            subscriber.await.expect("a subscriber failed");
        }
        // "none": wait for the cache itself to have taken every put.
        while cache.revision() < feed.revision() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    let wall = t0.elapsed();
    let cpu_s = (cpu_ticks(None) - cpu0) as f64 / clk_tck();
    drop(cache);
    rt.shutdown_timeout(Duration::from_secs(5));
    Run {
        cpu_s,
        wall,
        canceled: canceled.load(Ordering::Relaxed),
    }
}

fn main() {
    let a = args();
    println!(
        "deliver: N = {} ({} per stream), {} puts at {} puts/s (256-byte values, 1,000 keys), {} rounds, modes {:?}",
        a.n, a.per_stream, a.puts, a.rate, a.rounds, a.recv
    );
    let deliveries = (a.n * a.puts) as f64;
    let mut per: Vec<(Recv, Vec<f64>)> = a.recv.iter().map(|&m| (m, Vec::new())).collect();
    for round in 1..=a.rounds {
        let none = run(a.n, a.per_stream, a.puts, a.rate, None);
        println!(
            "round {round} none      CPU {:.2} s  wall {:.2} s",
            none.cpu_s,
            none.wall.as_secs_f64()
        );
        for (mode, figures) in per.iter_mut() {
            let r = run(a.n, a.per_stream, a.puts, a.rate, Some(*mode));
            let ns = (r.cpu_s - none.cpu_s).max(0.0) * 1e9 / deliveries;
            figures.push(ns);
            println!(
                "round {round} {:<9} CPU {:.2} s  wall {:.2} s  {:.0} ns CPU per delivery  {:.2}M deliveries/s{}",
                format!("{mode:?}").to_lowercase(),
                r.cpu_s,
                r.wall.as_secs_f64(),
                ns,
                deliveries / r.wall.as_secs_f64() / 1e6,
                if r.canceled > 0 {
                    format!("  ({} streams saw a watch canceled: not the live path)", r.canceled)
                } else {
                    String::new()
                }
            );
        }
    }
    for (mode, mut figures) in per {
        figures.sort_by(f64::total_cmp);
        println!(
            "{:<6} CPU per delivery: median {:.0} ns (min {:.0}, max {:.0})",
            format!("{mode:?}").to_lowercase(),
            figures[figures.len() / 2],
            figures[0],
            figures[figures.len() - 1]
        );
    }
}
