//! `cargo xtask etcd-bins`: builds etcd 3.5, 3.6 and 3.7 (server and etcdctl) from the Go
//! modules in `testkit/etcd-go/<name>/` into `<etcd dir>/<name>/{etcd,etcdctl,VERSION}`, once.
//!
//! A version is reused when its `VERSION` stamp (release, Go version, a hash of the module's
//! sources and the build flags) matches and both binaries report the pinned release. After a
//! build each server is started once as a single-member cluster with the harness's flags and
//! etcdctl writes and reads a key through it; `VERSION` is written last, so a version with a
//! `VERSION` is complete.

use std::env;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::etcd_versions::{EtcdVersion, ServerVersion, BUILD_COMMAND, VERSION_FILE};
use crate::{root, run};

/// `go build` flags, part of the staleness stamp. `CGO_ENABLED=0` as in etcd's release builds
/// (also: no C compiler needed); `-trimpath` so the binaries do not depend on the module cache's
/// location; `-buildvcs=false` because the sources sit in this repository, not etcd's.
pub const GO_BUILD_FLAGS: &[&str] = &["-trimpath", "-buildvcs=false"];

/// What to do.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Options {
    /// Rebuild even when the stamp matches.
    pub force: bool,
    /// Start each server once even when it was reused.
    pub check: bool,
    /// Only these versions (default: every Go-built one).
    pub versions: Vec<EtcdVersion>,
}

impl Options {
    pub fn parse(args: &[String]) -> Result<Options, String> {
        let mut opts = Options::default();
        for arg in args {
            match arg.as_str() {
                "--force" => opts.force = true,
                "--check" => opts.check = true,
                s if s.starts_with('-') => return Err(format!("unknown option `{s}`")),
                s => {
                    let v = EtcdVersion::parse(s).ok_or_else(|| {
                        format!(
                            "`{s}` is no etcd version; the built ones are {}",
                            EtcdVersion::GO_BUILT.map(EtcdVersion::name).join(", ")
                        )
                    })?;
                    if !v.is_go_built() {
                        return Err(format!(
                            "etcd {v} is Debian's etcd-server package (`cargo xtask prereqs`), not \
                             built from Go"
                        ));
                    }
                    if !opts.versions.contains(&v) {
                        opts.versions.push(v);
                    }
                }
            }
        }
        if opts.versions.is_empty() {
            opts.versions = EtcdVersion::GO_BUILT.to_vec();
        }
        Ok(opts)
    }
}

/// `cargo xtask etcd-bins [--force] [--check] [VERSION...]`.
pub fn command(args: &[String]) -> i32 {
    let opts = match Options::parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("xtask etcd-bins: {e} (see `cargo xtask help`)");
            return 2;
        }
    };
    match ensure(&opts) {
        Ok(_) => 0,
        Err(e) => {
            eprintln!("xtask etcd-bins: {e}");
            1
        }
    }
}

/// One version's result.
#[derive(Debug)]
pub struct Built {
    pub version: EtcdVersion,
    pub release: String,
    pub dir: PathBuf,
    pub rebuilt: bool,
    pub seconds: f64,
}

/// Builds (or reuses) `opts.versions` and prints a summary; the error says what went wrong.
pub fn ensure(opts: &Options) -> Result<Vec<Built>, String> {
    let started = Instant::now();
    let etcd_dir = crate::etcd_dir();
    let go = find_go()?;
    let go_version = go_env(&go, &root(), "GOVERSION")?;
    check_go_version(&go_version)?;
    let mut done = Vec::new();
    for &v in &opts.versions {
        done.push(build_one(v, &go, &etcd_dir, opts).map_err(|e| format!("etcd {v}: {e}"))?);
    }
    for b in &done {
        eprintln!(
            "xtask etcd-bins: etcd {} = v{} in {} ({}, {:.1} s)",
            b.version,
            b.release,
            b.dir.display(),
            if b.rebuilt { "built" } else { "up to date" },
            b.seconds
        );
    }
    eprintln!(
        "xtask etcd-bins: {} version(s) ready in {:.1} s ({go_version}); ETCD_CACHE_ETCD_DIR={}",
        done.len(),
        started.elapsed().as_secs_f64(),
        etcd_dir.display()
    );
    Ok(done)
}

/// The `go` command: `go` on PATH, else Go's default install place.
fn find_go() -> Result<PathBuf, String> {
    if let Some(path) = env::var_os("PATH") {
        if let Some(go) = env::split_paths(&path)
            .map(|d| d.join("go"))
            .find(|p| p.is_file())
        {
            return Ok(go);
        }
    }
    let default = PathBuf::from("/usr/local/go/bin/go");
    if default.is_file() {
        return Ok(default);
    }
    Err(format!(
        "Go is not installed: no `go` on PATH and no {}.\n\
         etcd 3.5, 3.6 and 3.7 are built from etcd's own Go modules (testkit/etcd-go/), which need \
         Go 1.21 or newer (they ask for go 1.26.0; an older Go downloads that toolchain through the \
         Go module proxy when GOTOOLCHAIN=auto) and access to the Go module proxy (GOPROXY).\n\
         Install Go, or run only against Debian's etcd 3.4 with `cargo xtask test --no-matrix`, or \
         point ETCD_BIN at an etcd of your own.",
        default.display()
    ))
}

/// `go env NAME`, run in `dir` (so a module's toolchain line applies).
fn go_env(go: &Path, dir: &Path, name: &str) -> Result<String, String> {
    let out = go_command(go, dir)
        .args(["env", name])
        .output()
        .map_err(|e| format!("cannot run {} env: {e}", go.display()))?;
    if !out.status.success() {
        return Err(format!(
            "`go env {name}` failed in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn go_command(go: &Path, dir: &Path) -> Command {
    let mut cmd = Command::new(go);
    cmd.current_dir(dir)
        .env("CGO_ENABLED", "0")
        // Each module stands alone, whatever go.work may sit above the checkout.
        .env("GOWORK", "off");
    cmd
}

/// Rejects Go older than 1.21 (no toolchain switching; the modules need 1.26).
pub fn check_go_version(go_version: &str) -> Result<(), String> {
    let numbers = go_version.trim().strip_prefix("go").unwrap_or(go_version);
    let mut parts = numbers.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    if (major, minor) < (1, 21) {
        return Err(format!(
            "{go_version} is too old: the etcd modules need go 1.26.0, and Go before 1.21 cannot \
             switch toolchains (Debian 12's golang-go is 1.19). Install Go 1.26 or newer"
        ));
    }
    Ok(())
}

/// The version `go.mod` requires for `module`, e.g. `v3.5.35`.
pub fn go_mod_requirement(go_mod: &str, module: &str) -> Option<String> {
    go_mod.lines().find_map(|line| {
        let line = line.trim().strip_prefix("require ").unwrap_or(line.trim());
        let mut words = line.split_whitespace();
        (words.next()? == module).then(|| words.next().map(str::to_string))?
    })
}

/// FNV-1a, 64 bits: a stable hash without dependencies.
pub fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Every file of a module directory that goes into the build (go.mod, go.sum, *.go), sorted.
fn module_sources(dir: &Path) -> Result<Vec<PathBuf>, String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for entry in fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(&path, out)?;
            } else if path.extension().is_some_and(|e| e == "go")
                || path
                    .file_name()
                    .is_some_and(|n| n == "go.mod" || n == "go.sum")
            {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(dir, &mut files).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    files.sort();
    Ok(files)
}

/// The `VERSION` text: the release on the first line (what the harness reads), then the stamp.
pub fn stamp(release: &str, go_version: &str, goos_goarch: &str, sources_hash: u64) -> String {
    format!(
        "{release}\ngo: {go_version} {goos_goarch}\nflags: CGO_ENABLED=0 {}\nsources: {sources_hash:016x}\n",
        GO_BUILD_FLAGS.join(" ")
    )
}

fn build_one(v: EtcdVersion, go: &Path, etcd_dir: &Path, opts: &Options) -> Result<Built, String> {
    let started = Instant::now();
    let module = root().join("testkit").join("etcd-go").join(v.name());
    let go_mod_path = module.join("go.mod");
    let go_mod = fs::read_to_string(&go_mod_path)
        .map_err(|e| format!("cannot read {}: {e}", go_mod_path.display()))?;
    let release = v.pinned_release();
    for m in ["go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/etcdctl/v3"] {
        let pinned = go_mod_requirement(&go_mod, m);
        if pinned.as_deref() != Some(&format!("v{release}")) {
            return Err(format!(
                "{} requires {m} {}, but testkit/src/etcd_versions.rs pins {v} at {release}; \
                 change both together",
                go_mod_path.display(),
                pinned.as_deref().unwrap_or("(nothing)")
            ));
        }
    }
    let go_version = go_env(go, &module, "GOVERSION")?;
    let goos_goarch = format!(
        "{}/{}",
        go_env(go, &module, "GOOS")?,
        go_env(go, &module, "GOARCH")?
    );
    let mut hash = FNV_OFFSET;
    for file in module_sources(&module)? {
        let rel = file.strip_prefix(&module).unwrap_or(&file);
        hash = fnv1a(hash, rel.to_string_lossy().as_bytes());
        hash = fnv1a(hash, &[0]);
        let bytes = fs::read(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        hash = fnv1a(hash, &bytes);
        hash = fnv1a(hash, &[0]);
    }
    let want = stamp(release, &go_version, &goos_goarch, hash);

    let out = etcd_dir.join(v.name());
    let etcd = out.join("etcd");
    let etcdctl = out.join("etcdctl");
    let version_file = out.join(VERSION_FILE);
    let up_to_date = !opts.force
        && fs::read_to_string(&version_file).is_ok_and(|have| have == want)
        && verify(&etcd, &etcdctl, release).is_ok();
    if up_to_date {
        if opts.check {
            smoke(v, &etcd, &etcdctl)?;
        }
        return Ok(Built {
            version: v,
            release: release.to_string(),
            dir: out,
            rebuilt: false,
            seconds: started.elapsed().as_secs_f64(),
        });
    }

    fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    // Without VERSION the directory counts as unfinished until everything below passed.
    let _ = fs::remove_file(&version_file);
    eprintln!(
        "xtask etcd-bins: building etcd {v} (v{release}) from {} with {go_version}",
        module.display()
    );
    for (binary, package) in [(&etcd, "."), (&etcdctl, "./cmd/etcdctl")] {
        let mut cmd = go_command(go, &module);
        cmd.arg("build")
            .args(GO_BUILD_FLAGS)
            .arg("-o")
            .arg(binary)
            .arg(package);
        let code = run(cmd);
        if code != 0 {
            return Err(format!(
                "`go build {package}` in {} failed (exit code {code}); it needs the Go module proxy \
                 (GOPROXY={}) or a module cache that has etcd's modules",
                module.display(),
                go_env(go, &module, "GOPROXY").unwrap_or_default()
            ));
        }
    }
    verify(&etcd, &etcdctl, release)?;
    smoke(v, &etcd, &etcdctl)?;
    let tmp = out.join(format!("{VERSION_FILE}.tmp"));
    fs::write(&tmp, &want)
        .and_then(|()| fs::rename(&tmp, &version_file))
        .map_err(|e| format!("cannot write {}: {e}", version_file.display()))?;
    Ok(Built {
        version: v,
        release: release.to_string(),
        dir: out,
        rebuilt: true,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Both binaries exist and report `release`.
fn verify(etcd: &Path, etcdctl: &Path, release: &str) -> Result<(), String> {
    let want = ServerVersion::parse(release).ok_or("bad pinned release")?;
    match ServerVersion::of_binary(etcd) {
        Some(got) if got == want => {}
        Some(got) => return Err(format!("{} reports {got}, not {release}", etcd.display())),
        None => {
            return Err(format!(
                "{} does not run or print its version",
                etcd.display()
            ))
        }
    }
    let out = clean_env(Command::new(etcdctl))
        .arg("version")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", etcdctl.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let reported = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("etcdctl version:"))
        .map(str::trim);
    if reported != Some(release) {
        return Err(format!(
            "{} reports {:?}, not {release}",
            etcdctl.display(),
            reported.unwrap_or(text.trim())
        ));
    }
    Ok(())
}

/// `cmd` without any `ETCD*` variable (etcd reads `ETCD_<FLAG>` as flags, etcdctl
/// `ETCDCTL_<FLAG>`; `ETCD_VERSION` would be `--version`).
fn clean_env(mut cmd: Command) -> Command {
    for (key, _) in env::vars_os() {
        if key.to_string_lossy().starts_with("ETCD") {
            cmd.env_remove(key);
        }
    }
    cmd
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free port: {e}"))
}

/// The arguments `tests/support/etcd.rs` passes for a single-member cluster, spelled for `v`.
pub fn single_member_args(
    v: ServerVersion,
    data_dir: &Path,
    client_port: u16,
    peer_port: u16,
) -> Vec<String> {
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    vec![
        "--name=etcd0".to_string(),
        format!("--data-dir={}", data_dir.display()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=etcd0={peer}"),
        "--initial-cluster-state=new".to_string(),
        "--initial-cluster-token=xtask-smoke".to_string(),
        "--logger=zap".to_string(),
        "--log-outputs=stderr".to_string(),
        "--log-level=warn".to_string(),
        v.watch_progress_notify_interval_arg(Duration::from_millis(500)),
        "--auto-compaction-mode=revision".to_string(),
        "--auto-compaction-retention=1000".to_string(),
    ]
}

struct Running {
    child: Child,
    dir: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Starts `etcd` as a single-member cluster with the harness's flags, waits for `/health`, then
/// `etcdctl put` and `get` a key through it.
pub fn smoke(v: EtcdVersion, etcd: &Path, etcdctl: &Path) -> Result<(), String> {
    let started = Instant::now();
    let server_version = ServerVersion::of_binary(etcd).unwrap_or(v.server_version());
    let mut last = String::new();
    for attempt in 0..3 {
        let dir = env::temp_dir().join(format!(
            "xtask-etcd-smoke-{}-{}-{attempt}",
            std::process::id(),
            v.name()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let log_path = dir.join("etcd.log");
        let log = fs::File::create(&log_path).map_err(|e| format!("cannot create log: {e}"))?;
        let log2 = log
            .try_clone()
            .map_err(|e| format!("cannot clone log: {e}"))?;
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let args = single_member_args(server_version, &dir.join("data"), client_port, peer_port);
        let child = clean_env(Command::new(etcd))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2))
            .current_dir(&dir)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", etcd.display()))?;
        let mut running = Running { child, dir };
        let addr = SocketAddr::from(([127, 0, 0, 1], client_port));
        let deadline = Instant::now() + Duration::from_secs(30);
        let healthy = loop {
            if let Ok(Some(status)) = running.child.try_wait() {
                break Err(format!("exited with {status}"));
            }
            if is_healthy(addr) {
                break Ok(());
            }
            if Instant::now() >= deadline {
                break Err("not healthy within 30 s".to_string());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if let Err(why) = healthy {
            let log = fs::read_to_string(&log_path).unwrap_or_default();
            last = format!(
                "etcd {v} did not start ({why}) with {}\nlog:\n{}",
                args.join(" "),
                tail(&log, 30)
            );
            if log.contains("address already in use") {
                continue;
            }
            return Err(last);
        }
        let endpoint = format!("--endpoints=http://127.0.0.1:{client_port}");
        let ctl = |args: &[&str]| -> Result<String, String> {
            let out = clean_env(Command::new(etcdctl))
                .arg(&endpoint)
                .args(args)
                .output()
                .map_err(|e| format!("cannot run {}: {e}", etcdctl.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "`etcdctl {}` failed: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        };
        ctl(&["put", "xtask-smoke", v.pinned_release()])?;
        let got = ctl(&["get", "xtask-smoke", "--print-value-only"])?;
        if got != v.pinned_release() {
            return Err(format!(
                "etcdctl get returned {got:?}, not {:?}",
                v.pinned_release()
            ));
        }
        drop(running);
        eprintln!(
            "xtask etcd-bins: etcd {v} started as a single-member cluster ({}), etcdctl put/get ok \
             ({:.1} s)",
            server_version.watch_progress_notify_interval_flag(),
            started.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    Err(last)
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `GET /health` answers `"health":"true"`.
fn is_healthy(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body);
    body.replace(' ', "").contains(r#""health":"true""#)
}

/// Builds (or reuses) the one version `ETCD_VERSION` names when it is Go-built, so `demo`,
/// `bench` and `soak` work with `ETCD_VERSION=3.6`. Returns false (after saying why) on failure.
pub fn ensure_for_env() -> bool {
    let Some(value) = env::var_os("ETCD_VERSION").filter(|v| !v.is_empty()) else {
        return true;
    };
    if env::var_os("ETCD_BIN").is_some_and(|v| !v.is_empty()) {
        return true; // ETCD_BIN overrides the version's binary anyway
    }
    let text = value.to_string_lossy();
    let Some(v) = EtcdVersion::parse(&text) else {
        eprintln!(
            "xtask: ETCD_VERSION={text:?} names no etcd version; use one of {}",
            EtcdVersion::names()
        );
        return false;
    };
    if !v.is_go_built() {
        return true;
    }
    let opts = Options {
        versions: vec![v],
        ..Options::default()
    };
    match ensure(&opts) {
        Ok(_) => true,
        Err(e) => {
            eprintln!("xtask: ETCD_VERSION={v} needs `{BUILD_COMMAND} {v}`, which failed: {e}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options() {
        let all = Options::parse(&[]).unwrap();
        assert_eq!(all.versions, EtcdVersion::GO_BUILT);
        assert!(!all.force && !all.check);
        let some = Options::parse(&args(&["--force", "3.7", "v3.5", "3.7"])).unwrap();
        assert_eq!(some.versions, [EtcdVersion::V3_7, EtcdVersion::V3_5]);
        assert!(some.force);
        assert!(Options::parse(&args(&["3.4"]))
            .unwrap_err()
            .contains("Debian"));
        assert!(Options::parse(&args(&["3.9"])).is_err());
        assert!(Options::parse(&args(&["--fast"])).is_err());
    }

    #[test]
    fn go_versions() {
        assert!(check_go_version("go1.26.8").is_ok());
        assert!(check_go_version("go1.21.0").is_ok());
        assert!(check_go_version("go1.30rc1").is_ok());
        assert!(check_go_version("go1.19.8")
            .unwrap_err()
            .contains("too old"));
        assert!(check_go_version("devel").is_err());
    }

    #[test]
    fn go_mod_pins() {
        let go_mod = "module x\n\ngo 1.26.0\n\nrequire (\n\tgo.etcd.io/etcd/etcdctl/v3 v3.5.35\n\
                      \tgo.etcd.io/etcd/server/v3 v3.5.35\n)\n\nrequire go.uber.org/zap v1.27.0 // indirect\n";
        assert_eq!(
            go_mod_requirement(go_mod, "go.etcd.io/etcd/server/v3").as_deref(),
            Some("v3.5.35")
        );
        assert_eq!(
            go_mod_requirement(go_mod, "go.uber.org/zap").as_deref(),
            Some("v1.27.0")
        );
        assert_eq!(go_mod_requirement(go_mod, "go.etcd.io/etcd/api/v3"), None);
    }

    /// The committed go.mod files pin what etcd_versions.rs says.
    #[test]
    fn committed_go_mods_match_the_pins() {
        for v in EtcdVersion::GO_BUILT {
            let path = root().join("testkit/etcd-go").join(v.name()).join("go.mod");
            let go_mod = fs::read_to_string(&path).unwrap();
            for m in ["go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/etcdctl/v3"] {
                assert_eq!(
                    go_mod_requirement(&go_mod, m),
                    Some(format!("v{}", v.pinned_release())),
                    "{} {m}",
                    path.display()
                );
            }
        }
    }

    #[test]
    fn stamp_starts_with_the_release() {
        let s = stamp("3.6.16", "go1.26.8", "linux/amd64", 0xabc);
        assert!(s.starts_with("3.6.16\n"));
        assert_eq!(
            crate::etcd_versions::parse_version_file(&s).map(|v| v.to_string()),
            Some("3.6.16".to_string())
        );
        assert!(s.contains("sources: 0000000000000abc\n"));
        assert_ne!(fnv1a(FNV_OFFSET, b"a"), fnv1a(FNV_OFFSET, b"b"));
        assert_eq!(fnv1a(FNV_OFFSET, b""), FNV_OFFSET);
    }

    #[test]
    fn smoke_args_match_the_harness() {
        let v35 = EtcdVersion::V3_5.server_version();
        let v37 = EtcdVersion::V3_7.server_version();
        let a35 = single_member_args(v35, Path::new("/d"), 1, 2);
        let a37 = single_member_args(v37, Path::new("/d"), 1, 2);
        assert!(a35.contains(&"--experimental-watch-progress-notify-interval=500ms".to_string()));
        assert!(a37.contains(&"--watch-progress-notify-interval=500ms".to_string()));
        assert!(a37.contains(&"--initial-cluster=etcd0=http://127.0.0.1:2".to_string()));
        assert!(a37.contains(&"--listen-client-urls=http://127.0.0.1:1".to_string()));
    }
}
