//! Per-tenant watch budgets with `WatchScope`: each tenant (or client connection) gets
//! `cache.scope(limit)`, opens its watches through it, and dropping the scope ends all of
//! them at once.
//!
//! ```text
//! cargo run --example tenants                                 # starts a throwaway etcd
//! ETCD_ENDPOINTS=127.0.0.1:2379 cargo run --example tenants
//! ```
//!
//! Two tenants share one cache. Tenant `a` may hold 2 watches, tenant `b` 3. The
//! scenario opens watches up to each budget, checks that one more fails with
//! `Error::WatchLimit` naming the tenant's limit (and leaves the other tenant alone),
//! writes to both tenants' keys, and checks that each watch saw only its own tenant's
//! writes. Then tenant `a` disconnects (its scope is dropped): its streams end with `None`
//! after what was already delivered, the cache's watch count drops by its watches, and
//! tenant `b` keeps receiving. Any deviation exits with 1.

use std::process::ExitCode;
use std::time::Duration;

use etcd_cache::{Cache, Error, WatchOptions, WatchScope, WatchStream};

/// The values delivered on `stream` until `n` events came (created responses skipped).
async fn values(stream: &mut WatchStream, n: usize) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    while out.len() < n {
        let resp = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .map_err(|_| format!("only {} of {n} events within 5 s: {out:?}", out.len()))?
            .map_err(|e| e.to_string())?
            .ok_or("the stream ended early")?;
        for ev in resp.events() {
            let kv = ev.kv().ok_or("an event without a key-value")?;
            out.push(String::from_utf8_lossy(kv.value()).into_owned());
        }
    }
    Ok(out)
}

/// Opens `n` prefix watches on the tenant's keys through its scope.
async fn open(scope: &WatchScope, prefix: &str, n: usize) -> Result<Vec<WatchStream>, String> {
    let mut streams = Vec::new();
    for _ in 0..n {
        let opts = WatchOptions::new().with_prefix();
        streams.push(
            scope
                .watch(prefix, Some(opts))
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(streams)
}

async fn run(endpoints: Vec<String>) -> Result<(), String> {
    let mut client = testkit::Connect::new().try_client(&endpoints).await?;
    let prefix = testkit::unique_prefix("tenants");
    let cache = Cache::builder(client.clone())
        .prefix(prefix.clone())
        .build()
        .await
        .map_err(|e| e.to_string())?;
    cache
        .wait_ready_timeout(Duration::from_secs(10))
        .await
        .map_err(|e| e.to_string())?;
    let (a_keys, b_keys) = (format!("{prefix}a/"), format!("{prefix}b/"));

    let tenant_a = cache.scope(2);
    let tenant_b = cache.scope(3);
    let mut a_streams = open(&tenant_a, &a_keys, 2).await?;
    let mut b_streams = open(&tenant_b, &b_keys, 3).await?;
    println!(
        "tenant a: {}/{} watches, tenant b: {}/{}; the cache: {}",
        tenant_a.open(),
        tenant_a.limit(),
        tenant_b.open(),
        tenant_b.limit(),
        cache.watcher_count()
    );

    // Over budget: refused with the tenant's own limit; the other tenant is unaffected.
    match tenant_a.watch(a_keys.as_str(), None).await {
        Err(e @ Error::WatchLimit { limit: 2 }) => println!("tenant a, one more watch: {e}"),
        other => {
            return Err(format!(
                "tenant a's third watch: expected WatchLimit, got {other:?}"
            ))
        }
    }
    if tenant_b.open() != 3 || cache.watcher_count() != 5 {
        return Err(format!(
            "a refused watch changed the counts: b {}, cache {}",
            tenant_b.open(),
            cache.watcher_count()
        ));
    }

    for (keys, tenant) in [(&a_keys, "a"), (&b_keys, "b")] {
        for i in 1..=2 {
            client
                .put(format!("{keys}k{i}"), format!("{tenant}{i}"), None)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    for s in a_streams.iter_mut() {
        let got = values(s, 2).await?;
        if got != ["a1", "a2"] {
            return Err(format!("a tenant a watch saw {got:?}"));
        }
    }
    for s in b_streams.iter_mut() {
        let got = values(s, 2).await?;
        if got != ["b1", "b2"] {
            return Err(format!("a tenant b watch saw {got:?}"));
        }
    }
    println!("each watch saw exactly its own tenant's two writes");

    // Tenant a disconnects: dropping its scope ends its watches.
    client
        .put(format!("{a_keys}k3"), "a3", None)
        .await
        .map_err(|e| e.to_string())?;
    let put = client
        .put(format!("{a_keys}k4"), "a4", None)
        .await
        .map_err(|e| e.to_string())?;
    cache
        .wait_for_revision(put.header().map_or(0, |h| h.revision()))
        .await
        .map_err(|e| e.to_string())?;
    drop(tenant_a);
    for s in a_streams.iter_mut() {
        // What was delivered before the drop is still read, then the stream ends.
        let mut rest = Vec::new();
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(5), s.message())
                .await
                .map_err(|_| "a dropped tenant's stream did not end within 5 s")?
                .map_err(|e| e.to_string())?;
            let Some(resp) = msg else { break };
            for kv in resp.events().iter().filter_map(|ev| ev.kv()) {
                rest.push(String::from_utf8_lossy(kv.value()).into_owned());
            }
        }
        if rest != ["a3", "a4"] {
            return Err(format!(
                "a dropped tenant's stream ended after {rest:?}, want [a3, a4]"
            ));
        }
    }
    println!("tenant a's streams delivered a3 and a4, then ended");
    if cache.watcher_count() != 3 {
        return Err(format!(
            "after tenant a left the cache still counts {} watches, want 3",
            cache.watcher_count()
        ));
    }
    client
        .put(format!("{b_keys}k3"), "b3", None)
        .await
        .map_err(|e| e.to_string())?;
    for s in b_streams.iter_mut() {
        let got = values(s, 1).await?;
        if got != ["b3"] {
            return Err(format!("tenant b after a left: {got:?}"));
        }
    }
    drop(b_streams);
    println!("OK: budgets held, tenants isolated, a dropped scope freed its watches");
    drop(tenant_b);
    cache.close().await;
    Ok(())
}

fn main() -> ExitCode {
    testkit::example_main("tenants", Duration::from_secs(30), run)
}
