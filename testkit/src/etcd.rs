//! One etcd process on loopback: start, kill, restart, logs.
//!
//! Every server listens on 127.0.0.1 with free ports picked at random (below the kernel's
//! ephemeral range, see [`free_port`]), keeps its data in a temporary directory and its
//! stdout/stderr in `etcd.log` next to the data, and is killed (SIGKILL) when dropped. All
//! calls here block the calling thread (they wait for `/health`); from an async test use a
//! multi-threaded runtime or [`blocking`](crate::blocking).
//!
//! Which binary runs: [`EtcdOptions::version`] when a test picks one, else the run's default,
//! [`EtcdBinaries::default_for_run`] (`$ETCD_VERSION`, default 3.4; `$ETCD_BIN` overrides the
//! binary). Flags whose spelling differs between versions (the watch progress interval) are
//! spelled for the binary that runs, also after [`EtcdServer::restart_on`] switched it.
//!
//! With [`EtcdOptions::tls`] the client URL is `https://`, and the harness checks health on a
//! plain-HTTP metrics listener (`--listen-metrics-urls`) instead, so it needs no TLS client.
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

use crate::etcd_versions::{EtcdBinaries, EtcdVersion};
use crate::http::{is_healthy, member_status, MemberStatus};
use crate::tls::ServerTls;

/// How many times a start is retried when a freshly picked port turns out to be taken.
pub(crate) const START_ATTEMPTS: usize = 5;
/// How long `/health` may take to answer `true` after a start, unless overridden.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines of etcd's log printed when a start fails.
pub(crate) const LOG_TAIL_LINES: usize = 40;

/// The etcd binary of this run: `$ETCD_BIN` when set, otherwise the binary of `$ETCD_VERSION`
/// (default 3.4, Debian's `/usr/bin/etcd` or `etcd` on `PATH`); see
/// [`EtcdBinaries::default_for_run`].
///
/// Panics with installation or build instructions when it does not exist.
pub fn etcd_binary() -> PathBuf {
    EtcdBinaries::default_for_run().etcd.clone()
}

/// A free TCP port on 127.0.0.1, outside the kernel's ephemeral range.
///
/// The port is picked at random below `net.ipv4.ip_local_port_range` and checked by binding
/// it. Outside that range is what lets a killed server restart on its ports: the kernel
/// gives an ephemeral port to every outgoing connection (a client reconnecting, another
/// test's traffic), and one that lands on a dead member's peer port holds it for as long
/// as the connection lives, so `restart` could not bind it (a CI run saw that). A port in
/// this range is only ever taken by a bind of its own; the ports handed out by this process
/// are remembered so that two servers of one test run are never given the same one.
/// Another process may still bind it before etcd does; starts are retried on that.
pub fn free_port() -> u16 {
    use rand::Rng as _;
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};

    static GIVEN: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let given = GIVEN.get_or_init(Mutex::default);
    let (low, high) = port_slot(unreserved_port_range());
    let mut rng = rand::rng();
    for _ in 0..1_000 {
        let port = rng.random_range(low..high);
        let mut given = given.lock().unwrap_or_else(|e| e.into_inner());
        if given.contains(&port) || TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        given.insert(port);
        return port;
    }
    // Every try was taken (a machine with an unusual port range): let the kernel pick.
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("cannot bind 127.0.0.1:0 to find a free port")
}

/// Set by `cargo xtask test` for test binaries it runs side by side: `i/n` gives this
/// process the `i`-th of `n` disjoint slices of the port range, so that two of them never
/// pick the same port (a port checked free, then bound by etcd a moment later, or a killed
/// member's port kept for its restart).
pub const PORT_SLOT_ENV: &str = "ETCD_CACHE_PORT_SLOT";

/// The slice of `(low, high)` that [`PORT_SLOT_ENV`] gives this process (all of it when
/// unset or malformed).
fn port_slot((low, high): (u16, u16)) -> (u16, u16) {
    slice_of(std::env::var(PORT_SLOT_ENV).ok().as_deref(), (low, high))
}

fn slice_of(slot: Option<&str>, (low, high): (u16, u16)) -> (u16, u16) {
    let parsed = slot.and_then(|s| {
        let (i, n) = s.split_once('/')?;
        let (i, n) = (i.trim().parse::<u32>().ok()?, n.trim().parse::<u32>().ok()?);
        (n > 0 && i < n).then_some((i, n))
    });
    let Some((i, n)) = parsed else {
        return (low, high);
    };
    let width = (u32::from(high) - u32::from(low)) / n;
    if width < 500 {
        return (low, high);
    }
    let start = u32::from(low) + i * width;
    (start as u16, (start + width) as u16)
}

/// The ports `free_port` picks from: from 10,000 up to the start of the kernel's ephemeral
/// range (Linux's default starts it at 32,768), or 20,000-30,000 when the range cannot be
/// read or leaves too little room below it.
fn unreserved_port_range() -> (u16, u16) {
    const LOW: u16 = 10_000;
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok());
    match ephemeral_start {
        Some(start) if start >= LOW + 5_000 => (LOW, start),
        _ => (20_000, 30_000),
    }
}

/// Options for [`EtcdServer::start_with`] and [`EtcdCluster::start_with`](crate::EtcdCluster::start_with).
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// The binaries to run; `None`: the run's default ([`EtcdBinaries::default_for_run`]).
    pub binaries: Option<EtcdBinaries>,
    /// TLS on the client URLs (peers stay plain HTTP): certificates, and whether clients must
    /// present one (`--client-cert-auth` with `--trusted-ca-file`).
    pub tls: Option<ServerTls>,
    /// The watch progress notification interval (etcd's default is 10 minutes), spelled
    /// `--experimental-watch-progress-notify-interval` up to 3.5 and
    /// `--watch-progress-notify-interval` from 3.6 on.
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
            binaries: None,
            tls: None,
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
    /// Runs exactly `version`'s binaries, whatever `$ETCD_VERSION` and `$ETCD_BIN` say (for a
    /// test that needs a given version, or two of them). Panics when they are not built.
    pub fn version(self, version: EtcdVersion) -> Self {
        self.binaries(EtcdBinaries::exact(version))
    }

    /// Runs these binaries (for example [`EtcdBinaries::select`], which honours `$ETCD_BIN`).
    pub fn binaries(mut self, binaries: EtcdBinaries) -> Self {
        self.binaries = Some(binaries);
        self
    }

    /// Serves clients over TLS with `tls` (see [`TestPki`](crate::TestPki)).
    pub fn tls(mut self, tls: ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The binaries these options run: the chosen ones, else the run's default.
    pub fn resolved_binaries(&self) -> EtcdBinaries {
        self.binaries
            .clone()
            .unwrap_or_else(|| EtcdBinaries::default_for_run().clone())
    }

    /// Sets the watch progress notification interval (spelled for the binary that runs).
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

    /// The arguments these options add for `binaries` (flag spellings differ by version).
    fn common_args(&self, binaries: &EtcdBinaries) -> Vec<String> {
        let mut args = vec![
            "--logger=zap".to_string(),
            "--log-outputs=stderr".to_string(),
            format!("--log-level={}", self.log_level),
        ];
        if let Some(interval) = self.progress_notify_interval {
            args.push(binaries.watch_progress_notify_interval_arg(interval));
        }
        if let Some(tls) = &self.tls {
            args.push(format!("--cert-file={}", tls.cert_file.display()));
            args.push(format!("--key-file={}", tls.key_file.display()));
            if let Some(ca) = &tls.trusted_ca_file {
                args.push(format!("--trusted-ca-file={}", ca.display()));
            }
            if tls.client_cert_auth {
                args.push("--client-cert-auth".to_string());
            }
            if let Some(crl) = &tls.client_crl_file {
                args.push(format!("--client-crl-file={}", crl.display()));
            }
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
    /// The plain-HTTP `/health` listener of a TLS server (`--listen-metrics-urls`).
    metrics_port: Option<u16>,
    /// The arguments that do not depend on the binary (name, URLs, data dir, cluster).
    base_args: Vec<String>,
    opts: EtcdOptions,
    /// What runs; [`EtcdServer::restart_on`] replaces it.
    binaries: EtcdBinaries,
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

    /// Starts a member `name` that joins the running cluster of `existing` (a single
    /// member started by [`EtcdServer::start_with`]) with its options, on `client_port`
    /// and the peer URL `http://127.0.0.1:{peer_port}`, which must have been added to
    /// the cluster first (`MemberAdd`, as a learner or a voter). Waits until it is
    /// healthy; panics with its log when it cannot start.
    pub fn join(existing: &EtcdServer, name: &str, client_port: u16, peer_port: u16) -> EtcdServer {
        let initial_cluster = format!(
            "{}={},{name}=http://127.0.0.1:{peer_port}",
            existing.name(),
            existing.peer_url()
        );
        let mut server = EtcdServer::new(
            name,
            client_port,
            peer_port,
            &initial_cluster,
            &existing.opts,
        );
        for a in &mut server.base_args {
            if a == "--initial-cluster-state=new" {
                *a = "--initial-cluster-state=existing".to_string();
            }
        }
        if let Err(StartError::PortInUse(msg) | StartError::Failed(msg)) = server
            .spawn()
            .and_then(|()| server.wait_healthy_inner(server.start_timeout))
        {
            panic!("{msg}");
        }
        server
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
        let scheme = if opts.tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let metrics_port = opts.tls.as_ref().map(|_| free_port());
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
        if let Some(port) = metrics_port {
            args.push(format!("--listen-metrics-urls=http://127.0.0.1:{port}"));
        }
        EtcdServer {
            name: name.to_string(),
            client_port,
            peer_port,
            metrics_port,
            base_args: args,
            binaries: opts.resolved_binaries(),
            opts: opts.clone(),
            data_dir,
            log_path,
            start_timeout: opts.start_timeout,
            child: None,
            dir,
        }
    }

    /// Advertises `http://127.0.0.1:{port}` as this member's peer URL (a forwarder in
    /// front of its own peer listener), from its next start on.
    pub(crate) fn advertise_peer_port(&mut self, port: u16) {
        for a in &mut self.base_args {
            if a.starts_with("--initial-advertise-peer-urls=") {
                *a = format!("--initial-advertise-peer-urls=http://127.0.0.1:{port}");
            }
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
        let _ = writeln!(
            log,
            "==== harness: starting etcd {} ({}) ====",
            self.name,
            self.binaries.describe()
        );
        let stderr = log
            .try_clone()
            .map_err(|e| StartError::Failed(format!("cannot clone log file handle: {e}")))?;
        let mut cmd = Command::new(&self.binaries.etcd);
        cmd.args(self.args())
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
            StartError::Failed(format!("cannot run {}: {e}", self.binaries.etcd.display()))
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
            if is_healthy(self.health_addr()) {
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

    /// The full command line after the binary, as the next start uses it.
    pub fn args(&self) -> Vec<String> {
        let mut args = self.base_args.clone();
        args.extend(self.opts.common_args(&self.binaries));
        args
    }

    /// The client URL, `http://127.0.0.1:PORT` (`https://` with TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.opts.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// Where `/health` answers over plain HTTP: the client address, or the metrics
    /// listener of a TLS server.
    pub fn health_addr(&self) -> SocketAddr {
        SocketAddr::from((
            [127, 0, 0, 1],
            self.metrics_port.unwrap_or(self.client_port),
        ))
    }

    /// Whether `/health` answers `true` now.
    pub fn is_healthy(&self) -> bool {
        is_healthy(self.health_addr())
    }

    /// The binaries this server runs (or ran last, or runs at its next start).
    pub fn binaries(&self) -> &EtcdBinaries {
        &self.binaries
    }

    /// The options it was started with.
    pub fn options(&self) -> &EtcdOptions {
        &self.opts
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

    /// Stops the process (SIGTERM, then SIGKILL after 10 s: a clean stop, as an operator's
    /// upgrade does), switches to `binaries`, and starts it again on the same ports and data
    /// directory, waiting until healthy. The flags are spelled for the new binary.
    pub fn restart_on(&mut self, binaries: EtcdBinaries) {
        self.stop();
        self.binaries = binaries;
        self.restart();
    }

    /// Stops the process cleanly: SIGTERM, and SIGKILL if it has not exited within 10 s.
    /// No-op when stopped.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let terminated = rustix::process::kill_process(
            rustix::process::Pid::from_child(&child),
            rustix::process::Signal::TERM,
        )
        .is_ok();
        if terminated {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Spawns the process again without waiting for health (for cluster restarts).
    pub(crate) fn respawn_no_wait(&mut self) {
        self.kill();
        if let Err(StartError::PortInUse(msg) | StartError::Failed(msg)) = self.spawn() {
            panic!("{msg}");
        }
    }

    /// This member's status from `/v3/maintenance/status` (etcd's HTTP gateway), or `None`
    /// when it does not answer. Always `None` for a TLS server (the gateway is on the TLS
    /// listener): ask it with an etcd-client instead.
    pub fn status(&self) -> Option<MemberStatus> {
        if self.opts.tls.is_some() {
            return None;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let (low, high) = unreserved_port_range();
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(
            distinct.len(),
            ports.len(),
            "a port was handed out twice: {ports:?}"
        );
        for port in ports {
            assert!((low..high).contains(&port), "{port} outside {low}..{high}");
            TcpListener::bind(("127.0.0.1", port)).expect("a port handed out is free");
        }
    }

    #[test]
    fn port_slots_are_disjoint_slices_of_the_range() {
        let range = (10_000, 32_768);
        assert_eq!(slice_of(None, range), range);
        assert_eq!(slice_of(Some("x"), range), range);
        assert_eq!(slice_of(Some("3/3"), range), range);
        assert_eq!(slice_of(Some("0/0"), range), range);
        let slices: Vec<_> = (0..3)
            .map(|i| slice_of(Some(&format!("{i}/3")), range))
            .collect();
        assert_eq!(slices[0], (10_000, 17_589));
        for w in slices.windows(2) {
            assert!(w[0].1 <= w[1].0, "{slices:?}");
        }
        assert!(slices[2].1 <= range.1);
        // Too narrow a slice: the whole range.
        assert_eq!(slice_of(Some("1/100"), range), range);
    }

    #[test]
    fn an_outgoing_connection_never_takes_a_port_that_free_port_gives() {
        // The kernel's ephemeral ports are all at or above `high`: a connection's local port
        // cannot be one `free_port` hands out (what let a killed member's restart fail).
        let (_, high) = unreserved_port_range();
        if high == 30_000 {
            eprintln!("the ephemeral range is unusual here; free_port falls back to 20,000-30,000");
            return;
        }
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let conns: Vec<_> = (0..50)
            .map(|_| std::net::TcpStream::connect(listener.local_addr().unwrap()).expect("connect"))
            .collect();
        for conn in &conns {
            let port = conn.local_addr().unwrap().port();
            assert!(port >= high, "ephemeral port {port} below {high}");
        }
    }
}
