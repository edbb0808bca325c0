//! A health endpoint for a service that uses the cache: a task follows
//! `cache.status_stream()`, and a tiny HTTP server (std's `TcpListener`, no framework)
//! answers `GET /health` with 200 while the cache is ready and 503 with the reason
//! otherwise, plus the numbers from `cache.stats()` (revision, how far behind etcd, when
//! it last heard from etcd).
//!
//! ```text
//! cargo run --example health                                  # starts a throwaway etcd
//! ETCD_ENDPOINTS=127.0.0.1:2379 cargo run --example health
//! ```
//!
//! The cache reaches etcd through a fault-injecting TCP proxy (from the dev-only
//! `testkit`), so the scenario can cut the connection: the status goes `Ready` →
//! `Reconnecting` (with the error) → `Ready`, and `/health` answers 200, 503, 200. A
//! watch opened before the outage stays open through it (unlike a direct etcd watch,
//! whose stream breaks) and delivers the write made meanwhile once etcd is back. After
//! `close()` the endpoint answers 503 `closed`. It exits with 1 if any step is not seen.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_cache::{Cache, CacheStatus};

/// The status as the follower task last saw it, for the HTTP thread.
type Shared = Arc<Mutex<CacheStatus>>;

/// Follows the cache's status into `shared`, printing each change.
async fn follow_status(cache: Cache, shared: Shared) {
    let mut statuses = cache.status_stream();
    drop(cache); // the stream alone does not keep the cache open
    while let Some(status) = statuses.next().await {
        println!("  status: {status:?}");
        *shared.lock().unwrap() = status;
    }
}

/// The body and code of `/health`.
fn health(cache: &Cache, status: &CacheStatus) -> (u16, String) {
    let stats = cache.stats();
    let heard = stats
        .since_last_heard
        .map_or("never".to_owned(), |d| format!("{} ms ago", d.as_millis()));
    let numbers = format!(
        "revision={} behind={} last_heard={heard} watchers={}",
        stats.revision, stats.behind, stats.watchers
    );
    match status {
        CacheStatus::Ready => (200, format!("ready {numbers}")),
        CacheStatus::Reconnecting { error, attempts } => (
            503,
            format!("reconnecting (attempt {attempts}): {error}; {numbers}"),
        ),
        CacheStatus::Closed => (503, "closed".to_owned()),
        other => (503, format!("{other:?}; {numbers}")),
    }
}

/// Serves `GET /health` on `listener` forever (a thread per process is plenty here).
fn serve(listener: TcpListener, cache: Cache, shared: Shared) {
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let mut request_line = String::new();
        if BufReader::new(&conn).read_line(&mut request_line).is_err() {
            continue;
        }
        let (code, body) = if request_line.starts_with("GET /health ") {
            let status = shared.lock().unwrap().clone();
            health(&cache, &status)
        } else {
            (404, "not found".to_owned())
        };
        let reason = match code {
            200 => "OK",
            404 => "Not Found",
            _ => "Service Unavailable",
        };
        let _ = write!(
            conn,
            "HTTP/1.0 {code} {reason}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
    }
}

/// `GET /health` as a client would: the status code and the body.
async fn get_health(addr: SocketAddr) -> Result<(u16, String), String> {
    tokio::task::spawn_blocking(move || {
        let mut conn = TcpStream::connect(addr).map_err(|e| e.to_string())?;
        conn.write_all(b"GET /health HTTP/1.0\r\n\r\n")
            .map_err(|e| e.to_string())?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer)
            .map_err(|e| e.to_string())?;
        let code = answer
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or(format!("not an HTTP answer: {answer:?}"))?;
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
        println!("  GET /health -> {code} {body}");
        Ok((code, body))
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Waits (up to `limit`) until the followed status satisfies `want`.
async fn wait_status(shared: &Shared, limit: Duration, want: fn(&CacheStatus) -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if want(&shared.lock().unwrap()) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

async fn run(endpoints: Vec<String>) -> Result<(), String> {
    let mut direct = testkit::Connect::new().try_client(&endpoints).await?;
    let proxy = testkit::TcpProxy::start(&endpoints[0]).await;
    let through_proxy = testkit::Connect::new()
        .try_client(&[proxy.endpoint()])
        .await?;
    let prefix = testkit::unique_prefix("health");
    let cache = Cache::builder(through_proxy)
        .prefix(prefix.clone())
        .backoff(Duration::from_millis(50), Duration::from_millis(300))
        .build()
        .await
        .map_err(|e| e.to_string())?;

    let shared: Shared = Arc::default();
    tokio::spawn(follow_status(cache.clone(), shared.clone()));
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let (c, s) = (cache.clone(), shared.clone());
    std::thread::spawn(move || serve(listener, c, s));
    println!("health endpoint on http://{addr}/health");

    cache
        .wait_ready_timeout(Duration::from_secs(10))
        .await
        .map_err(|e| e.to_string())?;
    if !wait_status(&shared, Duration::from_secs(2), CacheStatus::is_ready).await {
        return Err("the status stream did not report Ready".into());
    }
    let (code, _) = get_health(addr).await?;
    if code != 200 {
        return Err(format!("ready, but /health answered {code}"));
    }
    let key = format!("{prefix}config");
    let mut watch = cache
        .watch(key.as_str(), None)
        .await
        .map_err(|e| e.to_string())?;

    println!("cutting the cache off from etcd");
    proxy.set_refuse(true);
    proxy.drop_all_connections();
    let reconnecting = |s: &CacheStatus| matches!(s, CacheStatus::Reconnecting { .. });
    if !wait_status(&shared, Duration::from_secs(10), reconnecting).await {
        return Err("the status stream did not report the outage".into());
    }
    let (code, body) = get_health(addr).await?;
    if code != 503 || !body.starts_with("reconnecting") {
        return Err(format!("during the outage /health answered {code} {body}"));
    }
    // A write the cache cannot see yet.
    direct
        .put(key.as_str(), "written during the outage", None)
        .await
        .map_err(|e| e.to_string())?;

    println!("letting the cache reconnect");
    proxy.set_refuse(false);
    if !wait_status(&shared, Duration::from_secs(15), CacheStatus::is_ready).await {
        return Err("the cache did not become ready again".into());
    }
    let (code, _) = get_health(addr).await?;
    if code != 200 {
        return Err(format!("ready again, but /health answered {code}"));
    }
    // The watch was open all along and delivers what happened meanwhile.
    let value = loop {
        let resp = tokio::time::timeout(Duration::from_secs(10), watch.message())
            .await
            .map_err(|_| "the watch delivered nothing after the outage")?
            .map_err(|e| e.to_string())?
            .ok_or("the watch ended")?;
        if let Some(kv) = resp.events().first().and_then(|ev| ev.kv()) {
            break String::from_utf8_lossy(kv.value()).into_owned();
        }
    };
    println!("  the watch, open through the outage, delivered: {value}");
    if value != "written during the outage" {
        return Err(format!("the watch delivered {value:?}"));
    }

    drop(watch);
    cache.close().await;
    if !wait_status(&shared, Duration::from_secs(2), |s| {
        matches!(s, CacheStatus::Closed)
    })
    .await
    {
        return Err("the status stream did not report Closed".into());
    }
    let (code, body) = get_health(addr).await?;
    if (code, body.as_str()) != (503, "closed") {
        return Err(format!("closed, but /health answered {code} {body}"));
    }
    println!("OK: /health followed ready -> reconnecting -> ready -> closed");
    Ok(())
}

fn main() -> ExitCode {
    testkit::example_main("health", Duration::from_secs(40), run)
}
