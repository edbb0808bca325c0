//! The cache's traces, wired with `tracing-subscriber`.
//!
//! ```text
//! cargo run --example traces                         # starts a throwaway etcd
//! ETCD_ENDPOINTS=127.0.0.1:2379 cargo run --example traces
//! RUST_LOG=etcd_cache=trace cargo run --example traces   # more detail
//! ```
//!
//! The cache logs through `tracing`, quietly by default (debug and trace). This example
//! turns `etcd_cache=debug` on and does what produces each kind of trace: the follower's
//! connect and list (info, inside the span `etcd_cache{prefix}`), a consistent read (the
//! span `etcd_cache.get` with `served`), watch registrations and their ends (`watch
//! ended` with `reason`: canceled, dropped), and a slow subscriber falling behind
//! (`subscribers fell behind`). It checks that the reads and the watch behaved, and exits
//! non-zero otherwise.

use std::process::ExitCode;
use std::time::Duration;

use etcd_cache::{Cache, WatchOptions};

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("etcd_cache=debug"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .init();
    testkit::example_main("traces", Duration::from_secs(60), run)
}

async fn run(endpoints: Vec<String>) -> Result<(), String> {
    let mut client = testkit::Connect::plain()
        .try_client(&endpoints)
        .await
        .map_err(String::from)?;
    let prefix = testkit::unique_prefix("traces");
    let cache = Cache::builder(client.clone())
        .prefix(prefix.clone())
        .subscriber_buffer(1)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    cache
        .wait_ready_timeout(Duration::from_secs(20))
        .await
        .map_err(|e| e.to_string())?;

    let key = format!("{prefix}a");
    let put = client
        .put(key.clone(), "1", None)
        .await
        .map_err(|e| e.to_string())?;
    let written = put.header().map_or(0, |h| h.revision());

    // A consistent read: the span etcd_cache.get, served from memory or by etcd.
    let read = cache
        .get(key.clone(), None)
        .await
        .map_err(|e| e.to_string())?;
    if read.kvs().first().map(|kv| kv.value()) != Some(&b"1"[..]) {
        return Err(format!("the read missed the write at {written}: {read:?}"));
    }

    // Two watches on one stream; one canceled (reason canceled), one slow.
    let mut stream = cache
        .watch(prefix.clone(), Some(WatchOptions::new().with_prefix()))
        .await
        .map_err(|e| e.to_string())?;
    stream
        .watch(key.clone(), None)
        .await
        .map_err(|e| e.to_string())?;
    for _ in 0..2 {
        let created = stream.message().await.map_err(|e| e.to_string())?;
        if !created.is_some_and(|r| r.created()) {
            return Err("expected two created responses".into());
        }
    }
    stream.cancel(1).await.map_err(|e| e.to_string())?;
    // Not read while a burst arrives: its buffer of one fills (it falls behind).
    let mut last = 0;
    for i in 0..20 {
        last = client
            .put(format!("{prefix}b{i}"), "x", None)
            .await
            .map_err(|e| e.to_string())?
            .header()
            .map_or(0, |h| h.revision());
    }
    cache
        .wait_for_revision(last)
        .await
        .map_err(|e| e.to_string())?;
    let mut seen = 0;
    let mut canceled = false;
    while seen < 20 {
        let Some(r) = stream.message().await.map_err(|e| e.to_string())? else {
            return Err("the stream ended early".into());
        };
        canceled |= r.canceled() && r.watch_id() == 1;
        seen += r.events().len();
    }
    if !canceled {
        return Err("the canceled watch got no canceled response".into());
    }
    drop(stream); // reason dropped
    cache.close().await;
    println!("traces: ok ({seen} events caught up after falling behind)");
    Ok(())
}
