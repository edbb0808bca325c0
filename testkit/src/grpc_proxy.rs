//! etcd's own gRPC proxy (`etcd grpc-proxy start`) as a process, for comparisons.

use std::fs::File;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::etcd::{
    etcd_binary, file_tail, free_port, DEFAULT_START_TIMEOUT, LOG_TAIL_LINES, START_ATTEMPTS,
};
use crate::http::is_healthy;

/// An `etcd grpc-proxy start` process, killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct ProxyProcess {
    port: u16,
    log_path: PathBuf,
    child: Option<Child>,
    /// Holds the data directory and log until the proxy is dropped (after the process).
    _dir: tempfile::TempDir,
}

impl ProxyProcess {
    /// The proxy's client URL, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The process id while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The last `lines` lines of the proxy's log.
    pub fn log_tail(&self, lines: usize) -> String {
        file_tail(&self.log_path, lines)
    }

    /// Kills the proxy with SIGKILL and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `etcd grpc-proxy start --endpoints=<endpoints> --listen-addr=127.0.0.1:PORT` and waits
/// until its `/health` answers `true`. Endpoints may be given with or without `http://`.
pub fn grpc_proxy<S: AsRef<str>>(endpoints: &[S]) -> ProxyProcess {
    assert!(
        !endpoints.is_empty(),
        "grpc_proxy needs at least one endpoint"
    );
    let eps = endpoints
        .iter()
        .map(|e| {
            let e = e.as_ref();
            e.strip_prefix("http://")
                .unwrap_or(e)
                .trim_end_matches('/')
                .to_string()
        })
        .collect::<Vec<_>>()
        .join(",");
    let mut last = String::new();
    for _ in 0..START_ATTEMPTS {
        let dir = tempfile::Builder::new()
            .prefix("etcd-grpc-proxy-")
            .tempdir()
            .expect("cannot create a temporary directory for the grpc proxy");
        let log_path = dir.path().join("grpc-proxy.log");
        let log = File::create(&log_path).expect("cannot create the grpc proxy log");
        let stderr = log.try_clone().expect("cannot clone log file handle");
        let port = free_port();
        let mut cmd = Command::new(etcd_binary());
        cmd.args([
            "grpc-proxy".to_string(),
            "start".to_string(),
            format!("--endpoints={eps}"),
            format!("--listen-addr=127.0.0.1:{port}"),
            format!("--data-dir={}", dir.path().join("data").display()),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(stderr))
        .current_dir(dir.path());
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("ETCD") {
                cmd.env_remove(key);
            }
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run etcd grpc-proxy: {e}"));
        let mut proxy = ProxyProcess {
            port,
            log_path,
            child: Some(child),
            _dir: dir,
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + DEFAULT_START_TIMEOUT;
        loop {
            if let Some(Ok(Some(status))) = proxy.child.as_mut().map(Child::try_wait) {
                proxy.child = None;
                let tail = proxy.log_tail(LOG_TAIL_LINES);
                last = format!("etcd grpc-proxy exited with {status}; log:\n{tail}");
                if tail.contains("address already in use") {
                    break; // retry with another port
                }
                panic!("{last}");
            }
            if is_healthy(addr) {
                return proxy;
            }
            if Instant::now() >= deadline {
                panic!(
                    "etcd grpc-proxy on {addr} did not become healthy within {DEFAULT_START_TIMEOUT:?}; log:\n{}",
                    proxy.log_tail(LOG_TAIL_LINES)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    panic!("etcd grpc-proxy could not start after {START_ATTEMPTS} attempts: {last}");
}
