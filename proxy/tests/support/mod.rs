//! Test support: real etcd processes (from `testkit`) and the `etcd-cache-proxy` binary
//! as a child process.
#![allow(dead_code, unreachable_pub)]

use std::fs::File;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use testkit::{free_port, EtcdOptions, EtcdServer};
pub mod scrape;

/// How long the proxy may take to serve after it is started.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// One `etcd-cache-proxy` process on a free port; SIGKILLed when dropped.
pub struct Proxy {
    addr: SocketAddr,
    args: Vec<String>,
    child: Option<Child>,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Proxy {
    /// Starts the proxy in front of `etcd` (an endpoint URL) with extra flags (`{self}`
    /// in one stands for the proxy's URL, `{addr}` for its host:port), and waits until
    /// it serves a Range.
    pub fn start(etcd: &str, extra: &[&str]) -> Proxy {
        let mut p = Proxy::starting(etcd, extra);
        p.wait_serving();
        p
    }

    /// Starts the proxy as [`Proxy::start`] does, without waiting until it serves.
    pub fn starting(etcd: &str, extra: &[&str]) -> Proxy {
        Proxy::starting_on(free_addr(), etcd, extra)
    }

    /// Starts the proxy on `addr` as [`Proxy::starting`] does (for a port taken while
    /// etcd still held its own: a port freed by a killed etcd may be handed out again).
    pub fn starting_on(addr: SocketAddr, etcd: &str, extra: &[&str]) -> Proxy {
        let mut args = vec![
            "--endpoints".to_string(),
            etcd.to_string(),
            "--listen-addr".to_string(),
            addr.to_string(),
        ];
        // `{self}` stands for the proxy's own URL (for --advertise-client-url).
        let scheme = if extra.contains(&"--cert-file") {
            "https"
        } else {
            "http"
        };
        let own = format!("{scheme}://{addr}");
        // `{addr}`: its host:port alone (what etcd's naming resolver hands to gRPC).
        args.extend(extra.iter().map(|s| {
            s.replace("{self}", &own)
                .replace("{addr}", &addr.to_string())
        }));
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("proxy.log");
        let mut p = Proxy {
            addr,
            args,
            child: None,
            log,
            _dir: dir,
        };
        p.spawn_process();
        p
    }

    fn spawn(&mut self) {
        self.spawn_process();
        self.wait_serving();
    }

    fn spawn_process(&mut self) {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_etcd-cache-proxy"))
            .args(&self.args)
            .env(
                "RUST_LOG",
                std::env::var("PROXY_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawning etcd-cache-proxy");
        self.child = Some(child);
    }

    /// Waits until the proxy serves (its log says so and its port accepts); panics
    /// after 30 s or when it exits.
    pub fn wait_serving(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!(
                    "etcd-cache-proxy exited with {status}:\n{}",
                    self.log_tail()
                );
            }
            if self.log_text().contains("serving etcd's v3 gRPC API")
                && TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd-cache-proxy did not serve within {START_TIMEOUT:?}:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the proxy's log contains one of `texts`, and returns which; panics
    /// after 30 s or when it exits.
    pub fn wait_for_log(&mut self, texts: &[&str]) -> String {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let log = self.log_text();
            if let Some(t) = texts.iter().find(|t| log.contains(**t)) {
                return t.to_string();
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!(
                    "etcd-cache-proxy exited with {status}:\n{}",
                    self.log_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the proxy's log said none of {texts:?} within {START_TIMEOUT:?}:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGTERM, then waits for the exit (SIGKILL after `limit`). Returns the exit status.
    pub fn terminate(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the same command line again (same port) and waits until it serves.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Starts the same command line again after [`terminate`](Self::terminate) or
    /// [`kill`](Self::kill).
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the proxy is still running");
        self.spawn();
    }

    /// Stops with SIGTERM (graceful), then starts the same command line again.
    pub fn restart_graceful(&mut self) {
        let status = self.terminate(Duration::from_secs(15));
        assert!(
            status.is_some_and(|s| s.success()),
            "graceful stop failed ({status:?}):\n{}",
            self.log_tail()
        );
        self.spawn();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(
            std::env::var("PROXY_LOG_TAIL")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(40),
        )..]
            .join("\n")
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A free port on 127.0.0.1.
pub fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// An etcd-client connected to `endpoint` (the proxy or etcd).
pub async fn client(endpoint: &str) -> etcd_client::Client {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let opts = etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(2));
        match etcd_client::Client::connect([endpoint], Some(opts)).await {
            Ok(mut c) => {
                if c.get("probe", None).await.is_ok() {
                    return c;
                }
            }
            Err(e) => assert!(Instant::now() < deadline, "connect {endpoint}: {e}"),
        }
        assert!(Instant::now() < deadline, "no answer from {endpoint}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts etcd off the async threads.
pub async fn start_etcd(opts: EtcdOptions) -> EtcdServer {
    tokio::task::spawn_blocking(move || EtcdServer::start_with(opts))
        .await
        .unwrap()
}

/// Starts a proxy off the async threads.
pub async fn start_proxy(etcd: String, extra: Vec<String>) -> Proxy {
    tokio::task::spawn_blocking(move || {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        Proxy::start(&etcd, &extra)
    })
    .await
    .unwrap()
}

/// A process's resident memory (`VmRSS` in `/proc/<pid>/status`), in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

/// `etcd_cache_proxy_auth_asks_total` from a proxy's `--metrics-addr` endpoint.
pub fn auth_asks(metrics: std::net::SocketAddr) -> u64 {
    scrape::scrape(metrics)
        .get("etcd_cache_proxy_auth_asks_total", &[])
        .unwrap_or(0.0) as u64
}

/// `etcd_cache_proxy_auth_decisions_dropped_total` of the proxy whose metrics are at
/// `metrics`: how often it dropped every permission decision.
pub fn decisions_dropped(metrics: std::net::SocketAddr) -> u64 {
    scrape::scrape(metrics)
        .get("etcd_cache_proxy_auth_decisions_dropped_total", &[])
        .unwrap_or(0.0) as u64
}

/// Runs the proxy binary in front of `etcd` with `extra` flags, expects it to refuse to
/// start, and returns what it printed on stderr (the reason).
pub fn start_fails(etcd: &str, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_etcd-cache-proxy"))
        .args(["--endpoints", etcd, "--listen-addr", "127.0.0.1:0"])
        .args(extra)
        .output()
        .expect("running etcd-cache-proxy");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "the proxy started: {err}");
    err
}

/// The Go program of `tests/go/` (Go's clientv3 driven per scenario), built with
/// `go build` once per test binary; `None`, with a message, when `go` is not installed.
pub fn go_program() -> Option<PathBuf> {
    static BUILT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            if Command::new("go").arg("version").output().is_err() {
                eprintln!("SKIP: `go` is not installed; the clientv3 tests need it");
                return None;
            }
            let name = format!(
                "etcd-cache-proxy-gotest-{}",
                std::env::current_exe()
                    .ok()
                    .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
                    .unwrap_or_default()
            );
            let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
            let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/go");
            let build = Command::new("go")
                .args(["build", "-o"])
                .arg(&out)
                .arg(".")
                .current_dir(&src)
                .output()
                .expect("running go build");
            assert!(
                build.status.success(),
                "go build failed:\n{}",
                String::from_utf8_lossy(&build.stderr)
            );
            Some(out)
        })
        .clone()
}

/// Revokes role `ro`'s read on `/app/a/` (the `reader` of [`add_users`] loses it).
pub async fn revoke_reader(admin: &mut etcd_client::Client) {
    admin
        .role_revoke_permission(
            "ro",
            "/app/a/",
            Some(etcd_client::RoleRevokePermissionOptions::new().with_prefix()),
        )
        .await
        .unwrap();
}

/// The keys and users of the auth tests, made with `admin` (auth still off): keys under
/// /app/a/, /app/b/ and /other; `root` (root), `cacher` (read on /app/: the proxy's
/// user), `reader` (read on /app/a/), `nobody` (no role); every password `pw` but root's
/// (`rootpw`).
pub async fn add_users(admin: &mut etcd_client::Client) {
    admin.put("/app/a/x", "ax", None).await.unwrap();
    admin.put("/app/b/secret", "s3cret", None).await.unwrap();
    admin.put("/other", "o", None).await.unwrap();
    admin.user_add("root", "rootpw", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    for (user, role, perm) in [
        (
            "cacher",
            "cache",
            etcd_client::Permission::read("/app/").with_prefix(),
        ),
        (
            "reader",
            "ro",
            etcd_client::Permission::read("/app/a/").with_prefix(),
        ),
    ] {
        admin.user_add(user, "pw", None).await.unwrap();
        admin.role_add(role).await.unwrap();
        admin.role_grant_permission(role, perm).await.unwrap();
        admin.user_grant_role(user, role).await.unwrap();
    }
    admin.user_add("nobody", "pw", None).await.unwrap();
}
