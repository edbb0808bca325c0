//! Typed views (issue 21): decode calls per revision and client CPU per delivery for
//! 1,000 subscribers of 1 KiB JSON values, against the untyped watch and against every
//! subscriber decoding by itself; and the memory a view adds per key at 100,000 keys
//! against one decoded object per key. Real etcd (`ETCD_VERSION` / `ETCD_BIN`), one run.
//!
//! `cargo bench --bench typed` (`ETCD_CACHE_BENCH_QUICK=1`: 200 puts and 20,000 keys;
//! `TYPED_SUBSCRIBERS=N`, default 1,000; `TYPED_PUTS=N`, default 1,000;
//! `TYPED_KEYS=N`, default 100,000; `TYPED_ROUNDS=N`, default 5 (3 quick): rounds of
//! the no-subscriber, untyped and typed runs, interleaved, medians reported).
//!
//! The modes, each with its own subscribers on one cache, the same puts (16 keys,
//! one put per revision, written one after another):
//! - `untyped`: `Cache::watch`, each subscriber reads every event's value length;
//! - `typed`: `TypedView::watch` of a `JsonCodec` view, each subscriber reads a field of
//!   the shared object;
//! - `each-decodes`: `Cache::watch`, each subscriber decodes every value with serde_json
//!   (what a service does without a view);
//! - `none`: no subscriber (the writer and the cache's follower alone).
//!
//! CPU is this process's (subscribers, the cache, the writer's client) from the first put
//! until every subscriber has every event; "per delivery" divides it by N x puts.

mod common;

use std::alloc::System;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use etcd_cache::{Cache, JsonCodec, TypedView, WatchOptions};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use testkit::EtcdOptions;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[derive(Debug, serde::Deserialize)]
#[allow(dead_code)]
struct Config {
    name: String,
    owner: String,
    port: u16,
    replicas: u32,
    labels: Vec<String>,
    blob: String,
}

/// A JSON value of about `size` bytes.
fn value(i: usize, size: usize) -> String {
    let head = format!(
        r#"{{"name":"svc-{i}","owner":"team-{}","port":{},"replicas":{},"labels":["a","b","c"],"blob":""#,
        i % 7,
        8000 + i % 1000,
        i % 5
    );
    let pad = size.saturating_sub(head.len() + 2);
    format!("{head}{}\"}}", "x".repeat(pad))
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn cpu() -> f64 {
    common::proc::cpu_ticks(None) as f64 / common::proc::clk_tck()
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    None,
    Untyped,
    Typed,
    EachDecodes,
}

/// Runs `mode` with `n` subscribers over `puts` puts; returns (CPU s, wall s). With
/// `replay: Some(revision)`, the `puts` revisions from `revision` are in the cache's
/// history already: the subscribers replay them, and no write runs while CPU is counted.
async fn run(
    mode: Mode,
    cache: &Cache,
    view: &TypedView<Config>,
    client: &mut etcd_client::Client,
    n: usize,
    puts: usize,
    replay: Option<i64>,
) -> (f64, f64) {
    let received = Arc::new(AtomicU64::new(0));
    let sink = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let start_rev = replay.unwrap_or(cache.revision() + 1);
    let (c0, t0) = (cpu(), Instant::now());
    let opts = || {
        Some(
            WatchOptions::new()
                .with_prefix()
                .with_start_revision(start_rev),
        )
    };
    for _ in 0..if mode == Mode::None { 0 } else { n } {
        let (received, sink) = (received.clone(), sink.clone());
        match mode {
            Mode::Typed => {
                let mut s = view.watch("/t/", opts()).await.unwrap();
                tasks.push(tokio::spawn(async move {
                    let mut got = 0;
                    while got < puts {
                        let r = s.message().await.unwrap().unwrap();
                        for ev in r.events() {
                            sink.fetch_add(
                                ev.object().map_or(0, |c| c.port as u64),
                                Ordering::Relaxed,
                            );
                            got += 1;
                        }
                    }
                    received.fetch_add(got as u64, Ordering::Relaxed);
                }));
            }
            Mode::Untyped | Mode::EachDecodes => {
                let mut s = cache.watch("/t/", opts()).await.unwrap();
                tasks.push(tokio::spawn(async move {
                    let mut got = 0;
                    while got < puts {
                        let r = s.message().await.unwrap().unwrap();
                        for ev in r.events() {
                            let kv = ev.kv().unwrap();
                            let x = if mode == Mode::EachDecodes {
                                serde_json::from_slice::<Config>(kv.value())
                                    .map_or(0, |c| c.port as u64)
                            } else {
                                kv.value().len() as u64
                            };
                            sink.fetch_add(x, Ordering::Relaxed);
                            got += 1;
                        }
                    }
                    received.fetch_add(got as u64, Ordering::Relaxed);
                }));
            }
            Mode::None => {}
        }
    }
    let (c0, t0) = if replay.is_some() {
        (c0, t0)
    } else {
        (cpu(), Instant::now())
    };
    let mut last = 0;
    for i in 0..if replay.is_some() { 0 } else { puts } {
        last = client
            .put(format!("/t/k{:02}", i % 16), value(i, 1024), None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
    }
    if last > 0 {
        cache.wait_for_revision(last).await.unwrap();
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (c1, t1) = (cpu(), t0.elapsed().as_secs_f64());
    assert_eq!(
        received.load(Ordering::Relaxed),
        if mode == Mode::None {
            0
        } else {
            (n * puts) as u64
        }
    );
    (c1 - c0, t1)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("typed: skipped (needs `cargo bench --bench typed`)");
        return;
    }
    testkit::init_tracing();
    let quick = common::quick();
    let n = env_usize("TYPED_SUBSCRIBERS", 1000);
    let puts = env_usize("TYPED_PUTS", if quick { 200 } else { 1000 });
    let keys = env_usize("TYPED_KEYS", if quick { 20_000 } else { 100_000 });
    let (_etcd, mut client) = testkit::etcd_with_client(EtcdOptions::default()).await;
    // The default window holds the default puts; only a longer run raises it (so that
    // no subscriber's watch ends with the compaction signal), and says so.
    let cache = testkit::ready_cache(client.clone(), |b| {
        let b = b.prefix("/t/");
        if puts + 64 > etcd_cache::DEFAULT_HISTORY_WINDOW {
            println!(
                "typed: history_window raised to {} for {puts} puts",
                puts + 64
            );
            b.history_window(puts + 64)
        } else {
            b
        }
    })
    .await;
    let view = cache.typed(JsonCodec::<Config>::new()).build().unwrap();
    println!("typed: {n} subscribers, {puts} puts of 1 KiB JSON, one put per revision");
    // Rounds of the three modes compared, interleaved (the order rotates each round),
    // so that a slower minute of this shared machine falls on all of them; the figure
    // is each mode's median. Each-decodes runs once (it is 4x, not a close call).
    let rounds = env_usize("TYPED_ROUNDS", if quick { 3 } else { 5 });
    let mut rows = Vec::new();
    let mut order = [Mode::None, Mode::Untyped, Mode::Typed];
    let mut plan = Vec::new();
    for _ in 0..rounds {
        plan.extend(order);
        order.rotate_left(1);
    }
    plan.push(Mode::EachDecodes);
    for mode in plan {
        let d0 = view.decodes().0;
        let (cpu_s, wall) = run(mode, &cache, &view, &mut client, n, puts, None).await;
        let decodes = view.decodes().0 - d0;
        let per = cpu_s * 1e9 / (n * puts) as f64;
        println!(
            "TYPED | {:<12} | N={n} | {puts} puts | {:>7.2} s wall | CPU {:>6.2} s | {:>6.0} ns/delivery | view decodes per revision {:.2}",
            format!("{mode:?}"),
            wall,
            cpu_s,
            if mode == Mode::None { 0.0 } else { per },
            decodes as f64 / puts as f64,
        );
        rows.push((mode, cpu_s));
    }
    let median = |m: Mode| {
        let mut v: Vec<f64> = rows.iter().filter(|r| r.0 == m).map(|r| r.1).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let none = median(Mode::None);
    let per = |m: Mode| (median(m) - none).max(0.0) * 1e9 / (n * puts) as f64;
    println!(
        "TYPED | medians of {rounds} interleaved rounds, net of the no-subscriber runs: untyped {:.0} ns, typed {:.0} ns ({:.2}x untyped), each-decodes {:.0} ns ({:.1}x untyped) per delivery",
        per(Mode::Untyped),
        per(Mode::Typed),
        per(Mode::Typed) / per(Mode::Untyped),
        per(Mode::EachDecodes),
        per(Mode::EachDecodes) / per(Mode::Untyped),
    );

    // The same deliveries replayed from the history: no writer and no follower in the
    // CPU counted, only the subscribers (and the cache's catch-ups for them), so the
    // ratio is the subscribers' own cost.
    let first = cache.revision() + 1;
    for i in 0..puts {
        client
            .put(format!("/t/k{:02}", i % 16), value(i, 1024), None)
            .await
            .unwrap();
    }
    cache
        .wait_for_revision(first + puts as i64 - 1)
        .await
        .unwrap();
    let mut replayed = Vec::new();
    let mut order = [Mode::Untyped, Mode::Typed];
    for _ in 0..rounds {
        for mode in order {
            let (cpu_s, wall) = run(mode, &cache, &view, &mut client, n, puts, Some(first)).await;
            println!(
                "TYPED | replay {:<7} | N={n} | {puts} revisions | {:>7.2} s wall | CPU {:>6.2} s | {:>6.0} ns/delivery",
                format!("{mode:?}"),
                wall,
                cpu_s,
                cpu_s * 1e9 / (n * puts) as f64,
            );
            replayed.push((mode, cpu_s));
        }
        order.reverse();
    }
    let median = |m: Mode| {
        let mut v: Vec<f64> = replayed.iter().filter(|r| r.0 == m).map(|r| r.1).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2] * 1e9 / (n * puts) as f64
    };
    println!(
        "TYPED | replayed from the history, medians of {rounds} interleaved rounds: untyped {:.0} ns, typed {:.0} ns ({:.2}x untyped) per delivery",
        median(Mode::Untyped),
        median(Mode::Typed),
        median(Mode::Typed) / median(Mode::Untyped),
    );
    cache.close().await;

    // Memory at `keys` keys (256-byte values): the cache alone, then with every value
    // decoded through a view, against one decoded object per key.
    let (_etcd2, mut client) = testkit::etcd_with_client(EtcdOptions::default()).await;
    let mut ops = Vec::new();
    for i in 0..keys {
        ops.push(etcd_client::TxnOp::put(
            format!("/m/k{i:07}"),
            value(i, 256),
            None,
        ));
        if ops.len() == 128 || i + 1 == keys {
            client
                .txn(etcd_client::Txn::new().and_then(std::mem::take(&mut ops)))
                .await
                .unwrap();
        }
    }
    let region = Region::new(GLOBAL);
    let cache = testkit::ready_cache(client.clone(), |b| b.prefix("/m/")).await;
    let untyped = region.change();
    let untyped_bytes = untyped.bytes_allocated as i64 - untyped.bytes_deallocated as i64;
    let view = cache.typed(JsonCodec::<Config>::new()).build().unwrap();
    let region = Region::new(GLOBAL);
    let list = view.list().await.unwrap();
    assert_eq!(list.items().len(), keys);
    drop(list);
    let typed = region.change();
    let typed_bytes = typed.bytes_allocated as i64 - typed.bytes_deallocated as i64;
    // One decoded object per key, alone (the object and its strings).
    let region = Region::new(GLOBAL);
    let objects: Vec<Config> = (0..keys)
        .map(|i| serde_json::from_str(&value(i, 256)).unwrap())
        .collect();
    let one = region.change();
    let objects_bytes = one.bytes_allocated as i64
        - one.bytes_deallocated as i64
        - (keys * std::mem::size_of::<Config>()) as i64;
    let per_object = (objects_bytes as f64 / keys as f64) + std::mem::size_of::<Config>() as f64;
    drop(objects);
    println!(
        "TYPED | memory at {keys} keys: cache {:.1} MiB ({:.0} B/key); a view's decoded objects add {:.1} MiB ({:.0} B/key); one object per key alone: {:.0} B/key; so the view costs {:.0} B/key beyond the objects ({:.2}x cache + objects)",
        untyped_bytes as f64 / 1048576.0,
        untyped_bytes as f64 / keys as f64,
        typed_bytes as f64 / 1048576.0,
        typed_bytes as f64 / keys as f64,
        per_object,
        typed_bytes as f64 / keys as f64 - per_object,
        (untyped_bytes + typed_bytes) as f64 / (untyped_bytes as f64 + per_object * keys as f64),
    );
    cache.close().await;
}
