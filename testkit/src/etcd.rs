//! One etcd process on loopback: start, kill, restart, logs.
//!
//! Every server listens on 127.0.0.1 with free ports picked at random, keeps its data in a
//! temporary directory and its stdout/stderr in `etcd.log` next to the data, and is killed
//! (SIGKILL) when dropped. All calls here block the calling thread (they wait for `/health`);
//! from an async test use a multi-threaded runtime or [`blocking`](crate::blocking).
//!
//! ```no_run
//! # use testkit::EtcdServer;
//! let mut etcd = EtcdServer::start();
//! let endpoint = etcd.endpoint(); // "http://127.0.0.1:PORT"
//! etcd.kill(); // kill -9
//! etcd.restart(); // same ports, same data dir, waits until healthy
//! ```

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::http::{is_healthy, member_status, MemberStatus};

/// How many times a start is retried when a freshly picked port turns out to be taken.
pub(crate) const START_ATTEMPTS: usize = 5;
/// How long `/health` may take to answer `true` after a start, unless overridden.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines of etcd's log printed when a start fails.
pub(crate) const LOG_TAIL_LINES: usize = 40;

/// The etcd binary: `$ETCD_BIN` when set, otherwise `etcd` on `PATH`.
///
/// Panics with installation instructions when neither exists.
pub fn etcd_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("ETCD_BIN").filter(|s| !s.is_empty()) {
        let bin = PathBuf::from(bin);
        if bin.is_file() {
            return bin;
        }
        panic!(
            "ETCD_BIN is set to {}, which is not a file; unset it or point it at an etcd binary",
            bin.display()
        );
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("etcd");
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "the `etcd` binary was not found on PATH (and ETCD_BIN is not set). \
         Install it with `apt-get install etcd-server` (Debian/Ubuntu), or run `cargo xtask test`, \
         which installs the prerequisites when run as root"
    );
}

/// A free TCP port on 127.0.0.1 (bind port 0, read it, release it).
///
/// Another process may take it before etcd binds it; starts are retried on that.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("cannot bind 127.0.0.1:0 to find a free port")
}

/// Options for [`EtcdServer::start_with`] and [`EtcdCluster::start_with`](crate::EtcdCluster::start_with).
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// `--experimental-watch-progress-notify-interval` (etcd's default is 10 minutes).
    pub progress_notify_interval: Option<Duration>,
    /// `--auto-compaction-mode` (`periodic` or `revision`). Only used with a retention.
    pub auto_compaction_mode: Option<String>,
    /// `--auto-compaction-retention`, e.g. `"1000"` with mode `revision`, `"5m"` with `periodic`.
    pub auto_compaction_retention: Option<String>,
    /// `--log-level` (default `warn`, to keep logs small).
    pub log_level: String,
    /// More command-line arguments, appended last (so they win over the ones set here).
    pub extra_args: Vec<String>,
    /// How long to wait for `/health` to answer `true` after a start or restart.
    pub start_timeout: Duration,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            progress_notify_interval: None,
            auto_compaction_mode: None,
            auto_compaction_retention: None,
            log_level: "warn".to_string(),
            extra_args: Vec::new(),
            start_timeout: DEFAULT_START_TIMEOUT,
        }
    }
}

impl EtcdOptions {
    /// Sets `--experimental-watch-progress-notify-interval`.
    pub fn progress_notify_interval(mut self, interval: Duration) -> Self {
        self.progress_notify_interval = Some(interval);
        self
    }

    /// Sets `--auto-compaction-mode=revision --auto-compaction-retention=<revisions>`.
    pub fn auto_compaction_revisions(mut self, revisions: u64) -> Self {
        self.auto_compaction_mode = Some("revision".to_string());
        self.auto_compaction_retention = Some(revisions.to_string());
        self
    }

    /// Appends one raw command-line argument, e.g. `"--quota-backend-bytes=8589934592"`.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    fn common_args(&self) -> Vec<String> {
        let mut args = vec![
            "--logger=zap".to_string(),
            "--log-outputs=stderr".to_string(),
            format!("--log-level={}", self.log_level),
        ];
        if let Some(interval) = self.progress_notify_interval {
            args.push(format!(
                "--experimental-watch-progress-notify-interval={}ms",
                interval.as_millis().max(1)
            ));
        }
        if let Some(retention) = &self.auto_compaction_retention {
            if let Some(mode) = &self.auto_compaction_mode {
                args.push(format!("--auto-compaction-mode={mode}"));
            }
            args.push(format!("--auto-compaction-retention={retention}"));
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }
}

/// Why a start did not give a healthy server.
pub(crate) enum StartError {
    /// The process exited and its log says a port was taken: pick new ports and retry.
    PortInUse(String),
    /// Anything else; the message includes the log tail.
    Failed(String),
}

/// One etcd process (a single-member cluster, or one member of an [`EtcdCluster`](crate::EtcdCluster)).
///
/// Killed with SIGKILL when dropped; its temporary directory is removed then.
#[derive(Debug)]
pub struct EtcdServer {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Full argument list; reused as is by `restart`.
    args: Vec<String>,
    data_dir: PathBuf,
    log_path: PathBuf,
    start_timeout: Duration,
    child: Option<Child>,
    // Last, so the directory is removed after the process is gone.
    dir: tempfile::TempDir,
}

impl EtcdServer {
    /// Starts a single-member etcd with default options and waits until it is healthy.
    pub fn start() -> EtcdServer {
        Self::start_with(EtcdOptions::default())
    }

    /// Starts a single-member etcd with `opts` and waits until it is healthy.
    ///
    /// Retries with new ports when a picked port was taken meanwhile; panics with the tail of
    /// etcd's log when it cannot start.
    pub fn start_with(opts: EtcdOptions) -> EtcdServer {
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            let (client_port, peer_port) = (free_port(), free_port());
            let initial_cluster = format!("etcd0=http://127.0.0.1:{peer_port}");
            let mut server =
                EtcdServer::new("etcd0", client_port, peer_port, &initial_cluster, &opts);
            match server
                .spawn()
                .and_then(|()| server.wait_healthy_inner(server.start_timeout))
            {
                Ok(()) => return server,
                Err(StartError::PortInUse(msg)) => last = msg,
                Err(StartError::Failed(msg)) => panic!("{msg}"),
            }
        }
        panic!("etcd could not start after {START_ATTEMPTS} attempts (ports in use): {last}");
    }

    pub(crate) fn new(
        name: &str,
        client_port: u16,
        peer_port: u16,
        initial_cluster: &str,
        opts: &EtcdOptions,
    ) -> EtcdServer {
        let dir = tempfile::Builder::new()
            .prefix(&format!("etcd-test-{name}-"))
            .tempdir()
            .expect("cannot create a temporary directory for etcd");
        let data_dir = dir.path().join("data");
        let log_path = dir.path().join("etcd.log");
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut args = vec![
            format!("--name={name}"),
            format!("--data-dir={}", data_dir.display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster={initial_cluster}"),
            "--initial-cluster-state=new".to_string(),
            format!("--initial-cluster-token=etcd-test-{}", std::process::id()),
        ];
        args.extend(opts.common_args());
        EtcdServer {
            name: name.to_string(),
            client_port,
            peer_port,
            args,
            data_dir,
            log_path,
            start_timeout: opts.start_timeout,
            child: None,
            dir,
        }
    }

    /// Starts the process (does not wait for health).
    pub(crate) fn spawn(&mut self) -> Result<(), StartError> {
        assert!(
            self.child.is_none(),
            "etcd {} is already running",
            self.name
        );
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| {
                StartError::Failed(format!("cannot open {}: {e}", self.log_path.display()))
            })?;
        let _ = writeln!(log, "==== harness: starting etcd {} ====", self.name);
        let stderr = log
            .try_clone()
            .map_err(|e| StartError::Failed(format!("cannot clone log file handle: {e}")))?;
        let mut cmd = Command::new(etcd_binary());
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr))
            .current_dir(self.dir.path());
        // etcd reads ETCD_* variables as flags; ETCD_ENDPOINTS or the like from the caller's
        // environment would be rejected or change the configuration.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("ETCD") {
                cmd.env_remove(key);
            }
        }
        let child = cmd.spawn().map_err(|e| {
            StartError::Failed(format!("cannot run {}: {e}", etcd_binary().display()))
        })?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits until `/health` says true, the process exits, or `timeout` passes.
    pub(crate) fn wait_healthy_inner(&mut self, timeout: Duration) -> Result<(), StartError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    let tail = self.log_tail(LOG_TAIL_LINES);
                    let msg = format!(
                        "etcd {} (client port {}, peer port {}) exited during start with {status}; \
                         log {}:\n{tail}",
                        self.name,
                        self.client_port,
                        self.peer_port,
                        self.log_path.display()
                    );
                    return Err(if tail.contains("address already in use") {
                        StartError::PortInUse(msg)
                    } else {
                        StartError::Failed(msg)
                    });
                }
            } else {
                return Err(StartError::Failed(format!(
                    "etcd {} is not running",
                    self.name
                )));
            }
            if is_healthy(self.client_addr()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let msg = format!(
                    "etcd {} at {} did not become healthy within {:?}; log {}:\n{}",
                    self.name,
                    self.endpoint(),
                    timeout,
                    self.log_path.display(),
                    self.log_tail(LOG_TAIL_LINES)
                );
                return Err(StartError::Failed(msg));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until `/health` answers `true`; panics with the log tail after the start timeout.
    pub fn wait_healthy(&mut self) {
        if let Err(StartError::PortInUse(msg) | StartError::Failed(msg)) =
            self.wait_healthy_inner(self.start_timeout)
        {
            panic!("{msg}");
        }
    }

    /// The client URL, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// The client address, `127.0.0.1:PORT` (for a `TcpProxy` upstream, for example).
    pub fn client_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }

    /// The peer URL, `http://127.0.0.1:PORT`.
    pub fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    /// The member name (`etcd0`, `etcd1`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The data directory (kept across `kill` and `restart`).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The log file holding etcd's stdout and stderr (appended across restarts).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last `lines` lines of etcd's log.
    pub fn log_tail(&self, lines: usize) -> String {
        file_tail(&self.log_path, lines)
    }

    /// The process id while running (for CPU and memory figures from `/proc`).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is alive (reaps it if it exited by itself).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                false
            }
            None => false,
        }
    }

    /// Kills the process with SIGKILL (`kill -9`) and waits for it to exit. No-op when stopped.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again with the same ports and data directory and waits until
    /// healthy. Kills it first if it is still running.
    ///
    /// In a cluster, a restarted member is healthy only once a quorum is up; use
    /// [`EtcdCluster::restart_all`](crate::EtcdCluster::restart_all) to bring back several members at once.
    pub fn restart(&mut self) {
        self.kill();
        let mut last = String::new();
        // The same ports must be reused; if one was taken meanwhile (or is still being
        // released), try a few times before giving up.
        for attempt in 0..START_ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(200 * attempt as u64));
            }
            if let Err(StartError::PortInUse(msg) | StartError::Failed(msg)) = self.spawn() {
                panic!("{msg}");
            }
            match self.wait_healthy_inner(self.start_timeout) {
                Ok(()) => return,
                Err(StartError::PortInUse(msg)) => last = msg,
                Err(StartError::Failed(msg)) => panic!("restart failed: {msg}"),
            }
        }
        panic!("etcd {} could not restart on its ports: {last}", self.name);
    }

    /// Spawns the process again without waiting for health (for cluster restarts).
    pub(crate) fn respawn_no_wait(&mut self) {
        self.kill();
        if let Err(StartError::PortInUse(msg) | StartError::Failed(msg)) = self.spawn() {
            panic!("{msg}");
        }
    }

    /// This member's status from `/v3/maintenance/status`, or `None` when it does not answer.
    pub fn status(&self) -> Option<MemberStatus> {
        member_status(self.client_addr())
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of a file (at most the last 64 KiB are read).
pub(crate) fn file_tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
