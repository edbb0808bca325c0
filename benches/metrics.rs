//! The cost of the `metrics` feature: the same fan-out with a real recorder (the
//! Prometheus exporter's) and with none, in one run, as a ratio.
//!
//! ```text
//! cargo bench --features unstable-bench-internals,metrics --bench metrics
//! cargo xtask bench metrics [--quick]
//! ```
//!
//! A cache over the crate's in-memory upstream (no etcd: the figure is the cache's own
//! CPU), N subscribers on the prefix each drained by its own task, and a burst of puts
//! fed as upstream messages. "off" builds the cache without a recorder installed (the
//! metrics facade's no-op handles: the cost of compiling the feature in is nil, since
//! without the feature every record call is an empty inline function); "on" builds it
//! with a Prometheus recorder, so every record is an atomic add in the exporter. Rounds
//! alternate between the two; the medians are compared.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_cache::internals::{mem_cache, MemCacheOptions};
use etcd_cache::WatchOptions;

fn quick() -> bool {
    std::env::var_os("ETCD_CACHE_BENCH_QUICK").is_some_and(|v| !v.is_empty() && v != "0")
}

/// One round: time from the first put until every subscriber saw every put.
fn round(
    rt: &tokio::runtime::Runtime,
    subscribers: usize,
    puts: usize,
    recorder: bool,
) -> Duration {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let _runtime = rt.enter();
    let start = || {
        mem_cache(
            MemCacheOptions {
                prefix: b"/m/".to_vec(),
                subscriber_buffer: 1024,
                history_window: 4096,
                ..MemCacheOptions::default()
            },
            Vec::new(),
            1,
        )
        .expect("cache")
    };
    let (cache, mut feed) = if recorder {
        metrics::with_local_recorder(&prometheus, start)
    } else {
        start()
    };
    rt.block_on(async move {
        cache.wait_ready().await.expect("ready");
        let done = Arc::new(tokio::sync::Semaphore::new(0));
        for _ in 0..subscribers {
            let mut s = cache
                .watch("/m/", Some(WatchOptions::new().with_prefix()))
                .await
                .expect("watch");
            let done = done.clone();
            tokio::spawn(async move {
                let mut seen = 0;
                while seen < puts {
                    let r = s.message().await.expect("message").expect("open");
                    seen += r.events().len();
                }
                done.add_permits(1);
            });
        }
        let t0 = Instant::now();
        for i in 0..puts {
            feed.put(format!("/m/k{}", i % 100), "v");
            if i % 64 == 63 {
                tokio::task::yield_now().await;
            }
        }
        let _all = done
            .acquire_many(subscribers as u32)
            .await
            .expect("semaphore");
        let took = t0.elapsed();
        cache.close().await;
        took
    })
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    // `cargo test --benches` runs this binary without `--bench`: a smoke run only.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let (subscribers, puts, rounds) = if smoke {
        (10, 100, 1)
    } else if quick() {
        (1_000, 2_000, 5)
    } else {
        (1_000, 10_000, 9)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        off.push(round(&rt, subscribers, puts, false));
        on.push(round(&rt, subscribers, puts, true));
    }
    let (off, on) = (median(off), median(on));
    let deliveries = (subscribers * puts) as f64;
    println!(
        "METRICS | N={subscribers} puts={puts} rounds={rounds} | off {:.1} ms ({:.0} ns/delivery) | on {:.1} ms ({:.0} ns/delivery) | on/off {:.3}x",
        off.as_secs_f64() * 1e3,
        off.as_secs_f64() * 1e9 / deliveries,
        on.as_secs_f64() * 1e3,
        on.as_secs_f64() * 1e9 / deliveries,
        on.as_secs_f64() / off.as_secs_f64()
    );
}
