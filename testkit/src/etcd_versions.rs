//! Which etcd a test runs against: a version name (`"3.4"`, `"3.5"`, `"3.6"`, `"3.7"`) mapped to
//! an `etcd` and an `etcdctl` binary, and the command-line spellings that differ between them.
//!
//! Std only and self-contained: the test harness uses it, and `xtask` includes the same file with
//! `#[path]` for the list of versions, the pinned releases and the binary layout, so the two
//! cannot disagree.
//!
//! | name  | server                         | binaries                                              |
//! |-------|--------------------------------|-------------------------------------------------------|
//! | `3.4` | Debian's `etcd-server` 3.4.23  | `/usr/bin/etcd` (else `etcd` on `PATH`); `/usr/bin/etcdctl` from `etcd-client` (else `etcdctl` on `PATH`) |
//! | `3.5` | etcd v3.5.35 (Go module)       | `<etcd dir>/3.5/{etcd,etcdctl,VERSION}`               |
//! | `3.6` | etcd v3.6.16 (Go module)       | `<etcd dir>/3.6/{etcd,etcdctl,VERSION}`               |
//! | `3.7` | etcd v3.7.3 (Go module)        | `<etcd dir>/3.7/{etcd,etcdctl,VERSION}`               |
//!
//! The Go-built ones come from `testkit/etcd-go/<name>/` (etcd's own `etcdmain` and `ctlv3`
//! entry points, pinned in `go.mod`); `cargo xtask etcd-bins` builds them (`cargo xtask test`
//! does so first). `VERSION` is written last, its first line is the exact release
//! (`3.5.35`); further `key: value` lines are xtask's staleness stamp.
//!
//! `<etcd dir>` is `$ETCD_CACHE_ETCD_DIR` (xtask sets it to the absolute `target/etcd` for every
//! cargo run it starts), else `$CARGO_TARGET_DIR/etcd`, else `<workspace>/target/etcd`.
//!
//! Environment:
//! - `ETCD_VERSION`: the default version of a test run ([`EtcdVersion::from_env`],
//!   [`EtcdBinaries::default_for_run`]); unset means `3.4`.
//! - `ETCD_BIN` / `ETCDCTL_BIN`: any binary; they override the version's binaries in
//!   [`EtcdBinaries::select`] and so in [`EtcdBinaries::default_for_run`]. Only
//!   [`EtcdBinaries::exact`] (for a test that needs two versions at once, e.g. a rolling upgrade)
//!   ignores them.
//!
//! Caution: etcd reads every `ETCD_*` environment variable as a flag. `ETCD_VERSION=3.6` in a
//! child's environment is `--version=3.6`: etcd 3.4 refuses to start, newer ones warn. Spawn
//! etcd with every `ETCD*` variable removed (as `tests/support/etcd.rs` does).
#![allow(dead_code)]

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// Overrides the etcd binary of every version chosen through [`EtcdBinaries::select`].
pub const ETCD_BIN_ENV: &str = "ETCD_BIN";
/// Overrides the etcdctl binary the same way.
pub const ETCDCTL_BIN_ENV: &str = "ETCDCTL_BIN";
/// The default version of a test run, a version name such as `3.6`.
pub const ETCD_VERSION_ENV: &str = "ETCD_VERSION";
/// The directory holding `<name>/{etcd,etcdctl,VERSION}` for the Go-built versions.
pub const ETCD_DIR_ENV: &str = "ETCD_CACHE_ETCD_DIR";
/// The name of the file, next to the binaries, that records the exact release built.
pub const VERSION_FILE: &str = "VERSION";
/// The `cargo xtask` command that builds the Go-built versions.
pub const BUILD_COMMAND: &str = "cargo xtask etcd-bins";

/// An etcd minor version the tests know how to get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EtcdVersion {
    /// Debian 12's `etcd-server` package, 3.4.23.
    V3_4,
    /// etcd v3.5.35, built from `testkit/etcd-go/3.5`.
    V3_5,
    /// etcd v3.6.16, built from `testkit/etcd-go/3.6`.
    V3_6,
    /// etcd v3.7.3, built from `testkit/etcd-go/3.7`.
    V3_7,
}

impl EtcdVersion {
    /// Every known version, oldest first.
    pub const ALL: [EtcdVersion; 4] = [Self::V3_4, Self::V3_5, Self::V3_6, Self::V3_7];
    /// The versions built from etcd's Go modules by `cargo xtask etcd-bins`, oldest first.
    pub const GO_BUILT: [EtcdVersion; 3] = [Self::V3_5, Self::V3_6, Self::V3_7];
    /// The version of a run without `ETCD_VERSION`.
    pub const DEFAULT: EtcdVersion = Self::V3_4;
    /// The newest version (the second full integration run of `cargo xtask test`).
    pub const NEWEST: EtcdVersion = Self::V3_7;

    /// The version name, `"3.4"` … `"3.7"`; also the directory name under the etcd dir and
    /// under `testkit/etcd-go/`.
    pub fn name(self) -> &'static str {
        match self {
            Self::V3_4 => "3.4",
            Self::V3_5 => "3.5",
            Self::V3_6 => "3.6",
            Self::V3_7 => "3.7",
        }
    }

    /// The exact release this name stands for: Debian's package for 3.4, the `go.mod` pin for
    /// the others (xtask refuses to build when a `go.mod` disagrees).
    pub fn pinned_release(self) -> &'static str {
        match self {
            Self::V3_4 => "3.4.23",
            Self::V3_5 => "3.5.35",
            Self::V3_6 => "3.6.16",
            Self::V3_7 => "3.7.3",
        }
    }

    /// `(major, minor)`.
    pub fn major_minor(self) -> (u32, u32) {
        match self {
            Self::V3_4 => (3, 4),
            Self::V3_5 => (3, 5),
            Self::V3_6 => (3, 6),
            Self::V3_7 => (3, 7),
        }
    }

    /// Whether `cargo xtask etcd-bins` builds it (all but Debian's 3.4).
    pub fn is_go_built(self) -> bool {
        self != Self::V3_4
    }

    /// Parses a version name: `3.5`, `v3.5`, or a release such as `3.5.35` / `v3.6.0-rc.1`
    /// (the patch part is not checked). Surrounding whitespace is ignored.
    pub fn parse(s: &str) -> Option<EtcdVersion> {
        let s = s.trim();
        let s = s.strip_prefix('v').unwrap_or(s);
        let mut parts = s.splitn(3, '.');
        let major = parts.next()?;
        let minor = parts.next()?;
        if let Some(patch) = parts.next() {
            let digits = patch.split(['-', '+']).next().unwrap_or("");
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
        }
        match (major, minor) {
            ("3", "4") => Some(Self::V3_4),
            ("3", "5") => Some(Self::V3_5),
            ("3", "6") => Some(Self::V3_6),
            ("3", "7") => Some(Self::V3_7),
            _ => None,
        }
    }

    /// The names of every version, for messages: `3.4, 3.5, 3.6, 3.7`.
    pub fn names() -> String {
        Self::ALL.map(Self::name).join(", ")
    }

    /// The default version of this run: `$ETCD_VERSION`, or [`EtcdVersion::DEFAULT`] when it is
    /// unset or empty. Panics on a value that names no known version.
    pub fn from_env() -> EtcdVersion {
        Self::from_env_value(std::env::var_os(ETCD_VERSION_ENV))
    }

    fn from_env_value(value: Option<OsString>) -> EtcdVersion {
        let Some(value) = value.filter(|v| !v.is_empty()) else {
            return Self::DEFAULT;
        };
        let text = value.to_string_lossy();
        Self::parse(&text).unwrap_or_else(|| {
            panic!(
                "{ETCD_VERSION_ENV}={text:?} names no etcd version these tests know; use one of {} \
                 (or unset it for {}; ETCD_BIN runs any other binary)",
                Self::names(),
                Self::DEFAULT
            )
        })
    }

    /// The flag that sets the periodic watch progress notification interval on this version;
    /// see [`ServerVersion::watch_progress_notify_interval_flag`].
    pub fn watch_progress_notify_interval_flag(self) -> &'static str {
        self.server_version().watch_progress_notify_interval_flag()
    }

    /// The pinned release as a [`ServerVersion`].
    pub fn server_version(self) -> ServerVersion {
        ServerVersion::parse(self.pinned_release()).expect("pinned releases parse")
    }
}

impl fmt::Display for EtcdVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An etcd release as `etcd --version` prints it (`etcd Version: 3.5.35`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServerVersion {
    /// 3.
    pub major: u32,
    /// e.g. 5 for 3.5.35.
    pub minor: u32,
    /// e.g. 35 for 3.5.35 (0 when missing; a pre-release suffix is dropped).
    pub patch: u32,
}

/// etcd 3.6 renamed these non-boolean `--experimental-<name>` flags to `--<name>`: 3.6 accepts
/// both spellings (the old one with a deprecation warning at start), 3.7 only the new one, 3.5
/// and older only the old one. (From `experimentalFlagMigrationMap` in etcd's
/// `server/embed/config.go` of v3.6.) The boolean experimental flags became `--feature-gates`
/// in 3.6 instead and are not covered here.
pub const RENAMED_IN_3_6: &[&str] = &[
    "compact-hash-check-time",
    "corrupt-check-time",
    "compaction-batch-limit",
    "watch-progress-notify-interval",
    "warning-apply-duration",
    "bootstrap-defrag-threshold-megabytes",
    "memory-mlock",
    "snapshot-catchup-entries",
    "compaction-sleep-interval",
    "downgrade-check-time",
    "peer-skip-client-san-verification",
    "enable-distributed-tracing",
    "distributed-tracing-address",
    "distributed-tracing-service-name",
    "distributed-tracing-instance-id",
    "distributed-tracing-sampling-rate",
];

impl ServerVersion {
    /// Parses `3.5.35`, `v3.6.16`, `3.7.0-rc.0` or `3.4` (patch 0).
    pub fn parse(s: &str) -> Option<ServerVersion> {
        let s = s.trim();
        let s = s.strip_prefix('v').unwrap_or(s);
        let core = s.split(['-', '+']).next()?;
        let mut parts = core.split('.');
        let number = |p: Option<&str>| -> Option<u32> {
            let p = p?;
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            p.parse().ok()
        };
        let major = number(parts.next())?;
        let minor = number(parts.next())?;
        let patch = match parts.next() {
            None => 0,
            p => number(p)?,
        };
        if parts.next().is_some() {
            return None;
        }
        Some(ServerVersion {
            major,
            minor,
            patch,
        })
    }

    /// The release in the output of `etcd --version` (the line `etcd Version: 3.5.35`).
    pub fn from_version_output(output: &str) -> Option<ServerVersion> {
        output.lines().find_map(|line| {
            let rest = line.trim().strip_prefix("etcd Version:")?;
            ServerVersion::parse(rest)
        })
    }

    /// Runs `<etcd> --version` (with every `ETCD*` variable removed from its environment) and
    /// parses the release; `None` when it cannot run or prints no version.
    pub fn of_binary(etcd: &Path) -> Option<ServerVersion> {
        let mut cmd = Command::new(etcd);
        cmd.arg("--version")
            .stdin(Stdio::null())
            .stderr(Stdio::null());
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("ETCD") {
                cmd.env_remove(key);
            }
        }
        let out = cmd.output().ok()?;
        if !out.status.success() {
            return None;
        }
        Self::from_version_output(&String::from_utf8_lossy(&out.stdout))
    }

    /// The known version of the same minor, if any.
    pub fn known(self) -> Option<EtcdVersion> {
        EtcdVersion::ALL
            .into_iter()
            .find(|v| v.major_minor() == (self.major, self.minor))
    }

    /// Whether this release has the 3.6 spellings (see [`RENAMED_IN_3_6`]).
    fn has_3_6_flag_names(self) -> bool {
        (self.major, self.minor) >= (3, 6)
    }

    /// The flag that sets the periodic watch progress notification interval
    /// (etcd's default is 10 minutes):
    /// - up to 3.5: `--experimental-watch-progress-notify-interval` (the only spelling; 3.4 and
    ///   3.5 reject the other with `flag provided but not defined`);
    /// - 3.6: `--watch-progress-notify-interval` (3.6 also takes the experimental one, with a
    ///   deprecation warning);
    /// - 3.7 and later: `--watch-progress-notify-interval` (the experimental one is rejected).
    pub fn watch_progress_notify_interval_flag(self) -> &'static str {
        if self.has_3_6_flag_names() {
            "--watch-progress-notify-interval"
        } else {
            "--experimental-watch-progress-notify-interval"
        }
    }

    /// `<flag>=<ms>ms` for [`Self::watch_progress_notify_interval_flag`] (at least 1 ms).
    pub fn watch_progress_notify_interval_arg(self, interval: Duration) -> String {
        format!(
            "{}={}ms",
            self.watch_progress_notify_interval_flag(),
            interval.as_millis().max(1)
        )
    }

    /// The spelling this release accepts for a flag that 3.6 renamed: `name` may be given with or
    /// without the `--` and the `experimental-` prefix (`"experimental-compaction-batch-limit"`,
    /// `"--compaction-batch-limit"`). Returns `--<name>` from 3.6 on and
    /// `--experimental-<name>` before. A flag not in [`RENAMED_IN_3_6`] is returned as given,
    /// with `--` in front.
    pub fn flag(self, name: &str) -> String {
        let bare = name.trim_start_matches('-');
        let stem = bare.strip_prefix("experimental-").unwrap_or(bare);
        if !RENAMED_IN_3_6.contains(&stem) {
            return format!("--{bare}");
        }
        if self.has_3_6_flag_names() {
            format!("--{stem}")
        } else {
            format!("--experimental-{stem}")
        }
    }
}

impl fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The arguments of `etcd grpc-proxy start` in front of any others. `--advertise-client-url` is
/// set to the listen address because the 3.5 and 3.6 proxies dial that address (default
/// `127.0.0.1:23790`) for their own health check and exit with `context deadline exceeded` when
/// nothing answers there; 3.4 and 3.7 do not need it, and accept it.
pub fn grpc_proxy_start_args(endpoints: &str, listen_addr: &str, data_dir: &Path) -> Vec<String> {
    vec![
        "grpc-proxy".to_string(),
        "start".to_string(),
        format!("--endpoints={endpoints}"),
        format!("--listen-addr={listen_addr}"),
        format!("--advertise-client-url={listen_addr}"),
        format!("--data-dir={}", data_dir.display()),
    ]
}

/// The workspace root: the first directory holding a `Cargo.lock`, from the directory of the
/// crate that compiled this file upwards (falling back to the current directory).
pub fn workspace_root() -> PathBuf {
    let start = option_env!("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_else(|| PathBuf::from("."));
    start
        .ancestors()
        .find(|dir| dir.join("Cargo.lock").is_file())
        .unwrap_or(&start)
        .to_path_buf()
}

/// Where the Go-built versions live: `$ETCD_CACHE_ETCD_DIR`, else `$CARGO_TARGET_DIR/etcd`
/// (relative to the workspace root when relative), else `<workspace>/target/etcd`.
pub fn etcd_dir() -> PathBuf {
    etcd_dir_from(
        std::env::var_os(ETCD_DIR_ENV),
        std::env::var_os("CARGO_TARGET_DIR"),
        &workspace_root(),
    )
}

fn etcd_dir_from(
    etcd_dir: Option<OsString>,
    target_dir: Option<OsString>,
    workspace: &Path,
) -> PathBuf {
    if let Some(dir) = etcd_dir.filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = target_dir.filter(|d| !d.is_empty()) {
        return workspace.join(dir).join("etcd");
    }
    workspace.join("target").join("etcd")
}

/// The exact release recorded in a `VERSION` file's text (its first line).
pub fn parse_version_file(text: &str) -> Option<ServerVersion> {
    ServerVersion::parse(text.lines().next()?)
}

/// The binaries of one version, found.
#[derive(Debug, Clone)]
pub struct EtcdBinaries {
    /// The version asked for.
    pub requested: EtcdVersion,
    /// The server binary.
    pub etcd: PathBuf,
    etcdctl: Result<PathBuf, String>,
    /// The exact release of [`Self::etcd`] when known: from `VERSION` for a Go-built version,
    /// from `etcd --version` for Debian's and for `ETCD_BIN`.
    pub server_version: Option<ServerVersion>,
    /// Whether `ETCD_BIN` replaced the requested version's server.
    pub overridden: bool,
}

/// What [`EtcdBinaries::resolve`] reads from the environment, apart for testing.
#[derive(Debug, Clone, Default)]
struct Overrides {
    etcd_bin: Option<PathBuf>,
    etcdctl_bin: Option<PathBuf>,
}

impl Overrides {
    fn from_env() -> Overrides {
        let path = |var: &str| {
            std::env::var_os(var)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Overrides {
            etcd_bin: path(ETCD_BIN_ENV),
            etcdctl_bin: path(ETCDCTL_BIN_ENV),
        }
    }
}

impl EtcdBinaries {
    /// The binaries for `version`, with `ETCD_BIN` / `ETCDCTL_BIN` taking precedence when set.
    /// Panics saying how to get a missing binary (e.g. `cargo xtask etcd-bins`).
    pub fn select(version: EtcdVersion) -> EtcdBinaries {
        Self::resolve(version, &Overrides::from_env(), &etcd_dir(), &system_dirs())
    }

    /// Exactly `version`'s binaries, ignoring `ETCD_BIN` / `ETCDCTL_BIN`: for a test that needs
    /// two versions at once (a rolling upgrade). Panics like [`Self::select`].
    pub fn exact(version: EtcdVersion) -> EtcdBinaries {
        Self::resolve(version, &Overrides::default(), &etcd_dir(), &system_dirs())
    }

    /// [`Self::select`] of [`EtcdVersion::from_env`], resolved once per process.
    pub fn default_for_run() -> &'static EtcdBinaries {
        static DEFAULT: OnceLock<EtcdBinaries> = OnceLock::new();
        DEFAULT.get_or_init(|| Self::select(EtcdVersion::from_env()))
    }

    fn resolve(
        version: EtcdVersion,
        overrides: &Overrides,
        etcd_dir: &Path,
        system: &SystemDirs,
    ) -> EtcdBinaries {
        let (etcd, mut etcdctl, mut server_version) = match &overrides.etcd_bin {
            Some(bin) => {
                if !bin.is_file() {
                    panic!(
                        "{ETCD_BIN_ENV} is set to {}, which is not a file; unset it or point it \
                         at an etcd binary",
                        bin.display()
                    );
                }
                let sibling = bin.with_file_name("etcdctl");
                let etcdctl = if sibling.is_file() {
                    Ok(sibling)
                } else {
                    Self::version_etcdctl(version, etcd_dir, system)
                };
                (bin.clone(), etcdctl, None)
            }
            None if version.is_go_built() => {
                let (etcd, release) = Self::go_built_etcd(version, etcd_dir);
                let etcdctl = Self::version_etcdctl(version, etcd_dir, system);
                (etcd, etcdctl, Some(release))
            }
            None => {
                let etcd = system.find("etcd").unwrap_or_else(|| {
                    panic!(
                        "etcd {version} (Debian's etcd-server 3.4.23) was not found: no {} and no \
                         `etcd` on PATH. Install it with `apt-get install etcd-server`, or run \
                         `cargo xtask prereqs` (it installs the prerequisites as root), or set \
                         {ETCD_BIN_ENV}",
                        system.usr_bin.join("etcd").display()
                    )
                });
                let etcdctl = Self::version_etcdctl(version, etcd_dir, system);
                (etcd, etcdctl, None)
            }
        };
        if let Some(bin) = &overrides.etcdctl_bin {
            etcdctl = if bin.is_file() {
                Ok(bin.clone())
            } else {
                Err(format!(
                    "{ETCDCTL_BIN_ENV} is set to {}, which is not a file; unset it or point it at an \
                     etcdctl binary",
                    bin.display()
                ))
            };
        }
        if server_version.is_none() {
            server_version = ServerVersion::of_binary(&etcd);
        }
        EtcdBinaries {
            requested: version,
            etcd,
            etcdctl,
            server_version,
            overridden: overrides.etcd_bin.is_some(),
        }
    }

    /// `<dir>/<name>/etcd` and the release in its `VERSION`; panics when the build is missing or
    /// incomplete.
    fn go_built_etcd(version: EtcdVersion, etcd_dir: &Path) -> (PathBuf, ServerVersion) {
        let dir = etcd_dir.join(version.name());
        let etcd = dir.join("etcd");
        let stamp = dir.join(VERSION_FILE);
        if !etcd.is_file() || !stamp.is_file() {
            let what = if etcd.is_file() {
                format!("{} is missing (an unfinished build)", stamp.display())
            } else {
                format!("{} does not exist", etcd.display())
            };
            panic!(
                "etcd {version} (v{}) is not built: {what}. Build it with `{BUILD_COMMAND}` (needs Go \
                 and the Go module proxy; `cargo xtask test` runs it first), or point \
                 {ETCD_DIR_ENV} at a directory holding {version}/etcd, or set {ETCD_BIN_ENV}",
                version.pinned_release()
            );
        }
        let text = std::fs::read_to_string(&stamp).unwrap_or_default();
        let release = parse_version_file(&text).unwrap_or_else(|| {
            panic!(
                "{} does not start with an etcd release (it reads {:?}); rebuild with `{BUILD_COMMAND}`",
                stamp.display(),
                text.lines().next().unwrap_or("")
            )
        });
        if release.known() != Some(version) {
            panic!(
                "{} says {release}, which is not etcd {version}; rebuild with `{BUILD_COMMAND}`",
                stamp.display()
            );
        }
        (etcd, release)
    }

    fn version_etcdctl(
        version: EtcdVersion,
        etcd_dir: &Path,
        system: &SystemDirs,
    ) -> Result<PathBuf, String> {
        if version.is_go_built() {
            let path = etcd_dir.join(version.name()).join("etcdctl");
            if path.is_file() {
                Ok(path)
            } else {
                Err(format!(
                    "etcdctl {version} is not built: {} does not exist. Build it with \
                     `{BUILD_COMMAND}`, or set {ETCDCTL_BIN_ENV}",
                    path.display()
                ))
            }
        } else {
            system.find("etcdctl").ok_or_else(|| {
                format!(
                    "etcdctl {version} was not found: no {} and no `etcdctl` on PATH. Install \
                     Debian's etcd-client (`apt-get install etcd-client`; `cargo xtask prereqs` does \
                     as root), or set {ETCDCTL_BIN_ENV}",
                    system.usr_bin.join("etcdctl").display()
                )
            })
        }
    }

    /// The etcdctl binary; panics saying how to get it when there is none.
    pub fn etcdctl(&self) -> &Path {
        match &self.etcdctl {
            Ok(path) => path,
            Err(msg) => panic!("{msg}"),
        }
    }

    /// The etcdctl binary, or why there is none.
    pub fn try_etcdctl(&self) -> Result<&Path, &str> {
        self.etcdctl.as_deref().map_err(String::as_str)
    }

    /// The release to pick flag spellings for: the one found, else the requested version's pin.
    pub fn effective_version(&self) -> ServerVersion {
        self.server_version
            .unwrap_or_else(|| self.requested.server_version())
    }

    /// The flag for etcd's watch progress notification interval on this binary.
    pub fn watch_progress_notify_interval_flag(&self) -> &'static str {
        self.effective_version()
            .watch_progress_notify_interval_flag()
    }

    /// `<flag>=<ms>ms` for this binary.
    pub fn watch_progress_notify_interval_arg(&self, interval: Duration) -> String {
        self.effective_version()
            .watch_progress_notify_interval_arg(interval)
    }

    /// The spelling of a flag that 3.6 renamed, for this binary (see [`ServerVersion::flag`]).
    pub fn flag(&self, name: &str) -> String {
        self.effective_version().flag(name)
    }

    /// For logs and panics: `etcd 3.5.35 (/…/target/etcd/3.5/etcd)`, with `ETCD_BIN` noted.
    pub fn describe(&self) -> String {
        let release = self
            .server_version
            .map_or_else(|| "of unknown version".to_string(), |v| v.to_string());
        let via = if self.overridden {
            format!(", from {ETCD_BIN_ENV}")
        } else {
            String::new()
        };
        format!("etcd {release} ({}{via})", self.etcd.display())
    }
}

/// Where the system's (Debian's) binaries are looked for: `/usr/bin`, then `PATH`.
#[derive(Debug, Clone)]
struct SystemDirs {
    usr_bin: PathBuf,
    path: Option<OsString>,
}

fn system_dirs() -> SystemDirs {
    SystemDirs {
        usr_bin: PathBuf::from("/usr/bin"),
        path: std::env::var_os("PATH"),
    }
}

impl SystemDirs {
    fn find(&self, name: &str) -> Option<PathBuf> {
        let direct = self.usr_bin.join(name);
        if direct.is_file() {
            return Some(direct);
        }
        let path = self.path.as_ref()?;
        std::env::split_paths(path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn version_names_round_trip() {
        for v in EtcdVersion::ALL {
            assert_eq!(EtcdVersion::parse(v.name()), Some(v));
            assert_eq!(EtcdVersion::parse(&format!("v{}", v.name())), Some(v));
            assert_eq!(EtcdVersion::parse(v.pinned_release()), Some(v));
            assert_eq!(v.server_version().known(), Some(v));
            assert_eq!(v.to_string(), v.name());
        }
        assert_eq!(EtcdVersion::names(), "3.4, 3.5, 3.6, 3.7");
        assert_eq!(EtcdVersion::GO_BUILT.len(), 3);
        assert!(EtcdVersion::GO_BUILT.iter().all(|v| v.is_go_built()));
        assert!(!EtcdVersion::DEFAULT.is_go_built());
        assert_eq!(EtcdVersion::NEWEST, *EtcdVersion::ALL.last().unwrap());
    }

    #[test]
    fn version_parse_accepts_releases_and_rejects_the_rest() {
        assert_eq!(EtcdVersion::parse(" 3.6 "), Some(EtcdVersion::V3_6));
        assert_eq!(EtcdVersion::parse("v3.7.0-rc.0"), Some(EtcdVersion::V3_7));
        assert_eq!(EtcdVersion::parse("3.5.99"), Some(EtcdVersion::V3_5));
        for bad in [
            "", "3", "3.", "3.3", "3.8", "4.0", "3.5.", "3.5.x", "35", "latest", "3.4.23.1",
        ] {
            assert_eq!(EtcdVersion::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn from_env_value_defaults_and_panics_clearly() {
        assert_eq!(EtcdVersion::from_env_value(None), EtcdVersion::V3_4);
        assert_eq!(
            EtcdVersion::from_env_value(Some("".into())),
            EtcdVersion::V3_4
        );
        assert_eq!(
            EtcdVersion::from_env_value(Some("3.6".into())),
            EtcdVersion::V3_6
        );
        let msg = panic_message(|| {
            EtcdVersion::from_env_value(Some("3.9".into()));
        });
        assert!(msg.contains("ETCD_VERSION=\"3.9\""), "{msg}");
        assert!(msg.contains("3.4, 3.5, 3.6, 3.7"), "{msg}");
    }

    #[test]
    fn server_version_parses_etcd_output() {
        let out34 =
            "etcd Version: 3.4.23\nGit SHA: Not provided (use ./build instead of go build)\n\
                     Go Version: go1.19.8\nGo OS/Arch: linux/amd64\n";
        assert_eq!(
            ServerVersion::from_version_output(out34),
            Some(ServerVersion {
                major: 3,
                minor: 4,
                patch: 23
            })
        );
        let out37 = "etcd Version: 3.7.3\nGit SHA: Not provided\nGo Version: go1.26.8\n";
        assert_eq!(
            ServerVersion::from_version_output(out37).map(|v| v.to_string()),
            Some("3.7.3".to_string())
        );
        assert_eq!(
            ServerVersion::from_version_output("etcdctl version: 3.5.35"),
            None
        );
        assert_eq!(
            ServerVersion::parse("v3.6.0-rc.1").unwrap().to_string(),
            "3.6.0"
        );
        assert_eq!(ServerVersion::parse("3.4").unwrap().patch, 0);
        assert_eq!(ServerVersion::parse("3.4.23.1"), None);
        assert_eq!(ServerVersion::parse("3.x.1"), None);
        assert_eq!(ServerVersion::parse("3.8.0").unwrap().known(), None);
        assert!(ServerVersion::parse("3.5.35") < ServerVersion::parse("3.6.0"));
    }

    #[test]
    fn watch_progress_flag_per_version() {
        let old = "--experimental-watch-progress-notify-interval";
        let new = "--watch-progress-notify-interval";
        let expected = [
            (EtcdVersion::V3_4, old),
            (EtcdVersion::V3_5, old),
            (EtcdVersion::V3_6, new),
            (EtcdVersion::V3_7, new),
        ];
        for (v, flag) in expected {
            assert_eq!(v.watch_progress_notify_interval_flag(), flag, "{v}");
        }
        let v = |s| ServerVersion::parse(s).unwrap();
        assert_eq!(v("3.3.27").watch_progress_notify_interval_flag(), old);
        assert_eq!(v("3.8.0").watch_progress_notify_interval_flag(), new);
        assert_eq!(
            v("3.5.35").watch_progress_notify_interval_arg(Duration::from_millis(250)),
            "--experimental-watch-progress-notify-interval=250ms"
        );
        assert_eq!(
            v("3.7.3").watch_progress_notify_interval_arg(Duration::from_micros(10)),
            "--watch-progress-notify-interval=1ms"
        );
    }

    #[test]
    fn renamed_flags_follow_the_version() {
        let v35 = EtcdVersion::V3_5.server_version();
        let v36 = EtcdVersion::V3_6.server_version();
        for name in [
            "compaction-batch-limit",
            "experimental-compaction-batch-limit",
            "--experimental-compaction-batch-limit",
            "--compaction-batch-limit",
        ] {
            assert_eq!(
                v35.flag(name),
                "--experimental-compaction-batch-limit",
                "{name}"
            );
            assert_eq!(v36.flag(name), "--compaction-batch-limit", "{name}");
        }
        // Not renamed: returned as given.
        assert_eq!(v36.flag("quota-backend-bytes"), "--quota-backend-bytes");
        assert_eq!(
            v36.flag("--experimental-initial-corrupt-check"),
            "--experimental-initial-corrupt-check"
        );
        assert_eq!(
            v35.flag("watch-progress-notify-interval"),
            v35.watch_progress_notify_interval_flag()
        );
        assert_eq!(
            v36.flag("watch-progress-notify-interval"),
            v36.watch_progress_notify_interval_flag()
        );
    }

    #[test]
    fn grpc_proxy_args_advertise_the_listen_address() {
        let args = grpc_proxy_start_args(
            "127.0.0.1:2379,127.0.0.1:2479",
            "127.0.0.1:4000",
            Path::new("/tmp/p"),
        );
        assert_eq!(
            args,
            [
                "grpc-proxy",
                "start",
                "--endpoints=127.0.0.1:2379,127.0.0.1:2479",
                "--listen-addr=127.0.0.1:4000",
                "--advertise-client-url=127.0.0.1:4000",
                "--data-dir=/tmp/p",
            ]
        );
    }

    #[test]
    fn etcd_dir_precedence() {
        let ws = Path::new("/ws");
        assert_eq!(
            etcd_dir_from(Some("/abs/etcd".into()), Some("/t".into()), ws),
            PathBuf::from("/abs/etcd")
        );
        assert_eq!(
            etcd_dir_from(Some("".into()), Some("/t".into()), ws),
            PathBuf::from("/t/etcd")
        );
        assert_eq!(
            etcd_dir_from(None, Some("tgt".into()), ws),
            PathBuf::from("/ws/tgt/etcd")
        );
        assert_eq!(
            etcd_dir_from(None, None, ws),
            PathBuf::from("/ws/target/etcd")
        );
    }

    #[test]
    fn version_file_first_line() {
        assert_eq!(
            parse_version_file("3.6.16\ngo: go1.26.8\nsources: 0123\n").map(|v| v.to_string()),
            Some("3.6.16".to_string())
        );
        assert_eq!(parse_version_file(""), None);
        assert_eq!(parse_version_file("garbage\n3.6.16"), None);
    }

    /// A scratch directory under the system temp dir, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new() -> Scratch {
            static N: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "etcd-versions-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }

        fn file(&self, rel: &str, text: &str) -> PathBuf {
            let path = self.0.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
            path
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn panic_message(f: impl FnOnce() + std::panic::UnwindSafe) -> String {
        let err = std::panic::catch_unwind(f).expect_err("expected a panic");
        err.downcast_ref::<String>()
            .cloned()
            .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    }

    fn no_system(s: &Scratch) -> SystemDirs {
        SystemDirs {
            usr_bin: s.0.join("no-usr-bin"),
            path: Some(OsString::new()),
        }
    }

    #[test]
    fn go_built_version_is_found_with_its_release() {
        let s = Scratch::new();
        let dir = s.0.join("etcd");
        s.file("etcd/3.6/etcd", "");
        s.file("etcd/3.6/etcdctl", "");
        s.file("etcd/3.6/VERSION", "3.6.16\ngo: go1.26.8\n");
        let b = EtcdBinaries::resolve(
            EtcdVersion::V3_6,
            &Overrides::default(),
            &dir,
            &no_system(&s),
        );
        assert_eq!(b.etcd, dir.join("3.6/etcd"));
        assert_eq!(b.etcdctl(), dir.join("3.6/etcdctl"));
        assert_eq!(
            b.server_version.map(|v| v.to_string()).as_deref(),
            Some("3.6.16")
        );
        assert!(!b.overridden);
        assert_eq!(
            b.watch_progress_notify_interval_flag(),
            "--watch-progress-notify-interval"
        );
        assert!(
            b.describe().starts_with("etcd 3.6.16 ("),
            "{}",
            b.describe()
        );
    }

    #[test]
    fn missing_or_unfinished_build_says_which_command_builds_it() {
        let s = Scratch::new();
        let dir = s.0.join("etcd");
        let sys = no_system(&s);
        let msg = panic_message(|| {
            EtcdBinaries::resolve(EtcdVersion::V3_5, &Overrides::default(), &dir, &sys);
        });
        assert!(msg.contains("etcd 3.5 (v3.5.35) is not built"), "{msg}");
        assert!(msg.contains("cargo xtask etcd-bins"), "{msg}");
        assert!(msg.contains("3.5/etcd does not exist"), "{msg}");

        s.file("etcd/3.5/etcd", "");
        let msg = panic_message(|| {
            EtcdBinaries::resolve(EtcdVersion::V3_5, &Overrides::default(), &dir, &sys);
        });
        assert!(msg.contains("VERSION is missing"), "{msg}");

        s.file("etcd/3.5/VERSION", "3.6.16\n");
        let msg = panic_message(|| {
            EtcdBinaries::resolve(EtcdVersion::V3_5, &Overrides::default(), &dir, &sys);
        });
        assert!(msg.contains("not etcd 3.5"), "{msg}");

        // The server without its etcdctl resolves; asking for etcdctl panics with the command.
        s.file("etcd/3.5/VERSION", "3.5.35\n");
        let b = EtcdBinaries::resolve(EtcdVersion::V3_5, &Overrides::default(), &dir, &sys);
        let err = b.try_etcdctl().unwrap_err().to_string();
        assert!(err.contains("cargo xtask etcd-bins"), "{err}");
        let msg = panic_message(|| {
            b.etcdctl();
        });
        assert_eq!(msg, err);
    }

    #[test]
    fn debian_version_comes_from_usr_bin_then_path() {
        let s = Scratch::new();
        let dir = s.0.join("etcd");
        let msg = panic_message(|| {
            EtcdBinaries::resolve(
                EtcdVersion::V3_4,
                &Overrides::default(),
                &dir,
                &no_system(&s),
            );
        });
        assert!(msg.contains("apt-get install etcd-server"), "{msg}");

        let on_path = s.file("bin/etcd", "");
        let sys = SystemDirs {
            usr_bin: s.0.join("no-usr-bin"),
            path: Some(s.0.join("bin").into_os_string()),
        };
        let b = EtcdBinaries::resolve(EtcdVersion::V3_4, &Overrides::default(), &dir, &sys);
        assert_eq!(b.etcd, on_path);
        assert!(b.try_etcdctl().unwrap_err().contains("etcd-client"));
        // An empty file is no etcd: the version is unknown, flags follow the requested version.
        assert_eq!(b.server_version, None);
        assert_eq!(
            b.watch_progress_notify_interval_flag(),
            "--experimental-watch-progress-notify-interval"
        );

        let usr = s.file("usr/bin/etcd", "");
        let usr_ctl = s.file("usr/bin/etcdctl", "");
        let sys = SystemDirs {
            usr_bin: s.0.join("usr/bin"),
            ..sys
        };
        let b = EtcdBinaries::resolve(EtcdVersion::V3_4, &Overrides::default(), &dir, &sys);
        assert_eq!(b.etcd, usr);
        assert_eq!(b.etcdctl(), usr_ctl);
    }

    #[test]
    fn overrides_win_over_every_version() {
        let s = Scratch::new();
        let dir = s.0.join("etcd"); // nothing built: the override must not need it
        let bin = s.file("mine/etcd", "");
        let ctl = s.file("mine/etcdctl", "");
        let over = Overrides {
            etcd_bin: Some(bin.clone()),
            etcdctl_bin: None,
        };
        for v in EtcdVersion::ALL {
            let b = EtcdBinaries::resolve(v, &over, &dir, &no_system(&s));
            assert_eq!(b.etcd, bin);
            assert_eq!(b.etcdctl(), ctl, "the etcdctl next to ETCD_BIN");
            assert!(b.overridden);
            assert_eq!(b.requested, v);
            assert!(b.describe().contains("from ETCD_BIN"));
        }
        let other_ctl = s.file("other/etcdctl", "");
        let over = Overrides {
            etcd_bin: Some(bin.clone()),
            etcdctl_bin: Some(other_ctl.clone()),
        };
        let b = EtcdBinaries::resolve(EtcdVersion::V3_7, &over, &dir, &no_system(&s));
        assert_eq!(b.etcdctl(), other_ctl);

        let over = Overrides {
            etcd_bin: Some(s.0.join("nope")),
            etcdctl_bin: None,
        };
        let msg = panic_message(|| {
            EtcdBinaries::resolve(EtcdVersion::V3_5, &over, &dir, &no_system(&s));
        });
        assert!(msg.contains("ETCD_BIN is set to"), "{msg}");
    }
}
