//! Helpers shared by the end-to-end benchmarks (`mod common;`): the quick-mode switch and
//! `etcd-cache-proxy` as a child process, here; in its children:
//! - [`proc`]: CPU time, peak RSS and load average from `/proc`;
//! - [`latency`]: per-thread put -> delivery histograms and delivery counters;
//! - [`chart`]: a two-panel log-log SVG chart;
//! - [`fanout_results`]: the fan-out bench's run kinds, a run's figures, and their tables.
//!
//! Their etcd, etcd's grpc-proxy and clients come from `testkit`. Each bench compiles all
//! of it and uses a part, hence `dead_code` allowed.
#![allow(dead_code)]

pub(crate) mod chart;
pub(crate) mod fanout_results;
pub(crate) mod latency;
pub(crate) mod proc;

/// True when the benchmarks should run their short form (`ETCD_CACHE_BENCH_QUICK=1`, set
/// by `cargo xtask bench --quick`).
pub(crate) fn quick() -> bool {
    std::env::var_os("ETCD_CACHE_BENCH_QUICK").is_some_and(|v| !v.is_empty() && v != "0")
}

/// A single call taking longer than this is a hang: the benches that time calls fail.
pub(crate) const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// `f`, bounded by [`CALL_TIMEOUT`]; its error or the hang as text naming `what`.
pub(crate) async fn bounded<T, E: std::fmt::Display>(
    what: &str,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer in {CALL_TIMEOUT:?}")),
    }
}

/// Puts of one load transaction (etcd's default `--max-txn-ops` is 128).
const LOAD_BATCH: usize = 100;

/// Writes `kv(i)` for `i` in `0..n` straight to etcd, [`LOAD_BATCH`] puts a transaction.
pub(crate) async fn load_txns(
    endpoint: &str,
    n: usize,
    kv: impl Fn(usize) -> (String, Vec<u8>),
) -> Result<(), String> {
    let mut client = testkit::Connect::plain().try_client(&[endpoint]).await?;
    for start in (0..n).step_by(LOAD_BATCH) {
        let ops: Vec<etcd_client::TxnOp> = (start..(start + LOAD_BATCH).min(n))
            .map(|i| {
                let (k, v) = kv(i);
                etcd_client::TxnOp::put(k, v, None)
            })
            .collect();
        bounded(
            "load txn",
            client.txn(etcd_client::Txn::new().and_then(ops)),
        )
        .await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// etcd-cache-proxy as a child process (the workspace's `proxy/` crate, built in release)

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// How long the proxy may take to serve after it is started.
const PROXY_START_TIMEOUT: Duration = Duration::from_secs(30);

/// The `etcd-cache-proxy` binary: `ETCD_CACHE_PROXY_BIN` if set, otherwise the release
/// build next to this bench binary (`<target>/release/etcd-cache-proxy`, which
/// `cargo xtask bench` builds first with `cargo build --release -p etcd-cache-proxy`).
/// `Err` says how to get one. A binary older than a source file of the proxy or of the
/// library is used, with a warning on stderr.
pub(crate) fn cache_proxy_bin() -> Result<PathBuf, String> {
    let path = match std::env::var_os("ETCD_CACHE_PROXY_BIN") {
        Some(p) => PathBuf::from(p),
        None => {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            // <target>/release/deps/<bench>-<hash> -> <target>/release/etcd-cache-proxy
            exe.parent()
                .and_then(Path::parent)
                .map(|d| d.join("etcd-cache-proxy"))
                .ok_or("cannot locate the target directory")?
        }
    };
    if !path.is_file() {
        return Err(format!(
            "{} not found: build it with `cargo build --release -p etcd-cache-proxy` \
             (`cargo xtask bench` does) or set ETCD_CACHE_PROXY_BIN",
            path.display()
        ));
    }
    let built = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let newest = [root.join("src"), root.join("proxy/src")]
        .iter()
        .filter_map(|d| newest_mtime(d))
        .max();
    if newest.is_some_and(|t| t > built) {
        eprintln!(
            "warning: {} is older than the sources of the proxy or the library; \
             rebuild it with `cargo build --release -p etcd-cache-proxy`",
            path.display()
        );
    }
    Ok(path)
}

fn newest_mtime(dir: &Path) -> Option<SystemTime> {
    let mut newest = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        let t = if p.is_dir() {
            newest_mtime(&p)
        } else {
            e.metadata().and_then(|m| m.modified()).ok()
        };
        newest = newest.max(t);
    }
    newest
}

/// One `etcd-cache-proxy` process on a free loopback port, SIGKILLed when dropped.
pub(crate) struct CacheProxy {
    addr: SocketAddr,
    child: Option<Child>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl CacheProxy {
    /// Starts `bin --endpoints <etcd> --listen-addr 127.0.0.1:PORT <extra...>` and waits
    /// until it logs that it serves and accepts a TCP connection.
    pub(crate) fn start(bin: &Path, etcd: &str, extra: &[String]) -> Result<CacheProxy, String> {
        let port = testkit::free_port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let dir = tempfile::Builder::new()
            .prefix("etcd-cache-proxy-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let log = dir.path().join("proxy.log");
        let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(bin)
            .args(["--endpoints", etcd, "--listen-addr", &addr.to_string()])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        let mut p = CacheProxy {
            addr,
            child: Some(child),
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + PROXY_START_TIMEOUT;
        loop {
            if let Some(Ok(Some(status))) = p.child.as_mut().map(Child::try_wait) {
                p.child = None;
                return Err(format!(
                    "etcd-cache-proxy exited with {status}:\n{}",
                    p.log_tail(20)
                ));
            }
            let log = std::fs::read_to_string(&p.log).unwrap_or_default();
            if log.contains("serving etcd's v3 gRPC API")
                && TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            {
                return Ok(p);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "etcd-cache-proxy did not serve within {PROXY_START_TIMEOUT:?}:\n{}",
                    p.log_tail(20)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub(crate) fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The last `lines` lines of the proxy's log.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for CacheProxy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
