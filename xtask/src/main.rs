//! `cargo xtask <command>`: the project's tasks, each with its own set-up (std only).
//!
//! Every command first checks the system prerequisites (etcd 3.4, etcdctl, protoc and the
//! well-known protos; see `prereqs.rs`) and, when they are missing and the user is root,
//! installs them with apt. `test` also builds etcd 3.5, 3.6 and 3.7 from etcd's Go modules
//! (`etcd_bins.rs`) and runs the version matrix.

// Also the harness's (std only); it allows its own dead code.
#[path = "../../testkit/src/etcd_versions.rs"]
mod etcd_versions;

mod cycles;
mod doc_refs;
mod etcd_bins;
mod kubernetes;
mod machine;
mod msrv;
mod prereqs;
mod robustness;
mod side_by_side;
mod sizes;
mod soak;
mod test_cmd;

use std::env;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{exit, Command};
use std::sync::OnceLock;
use std::time::Instant;

pub(crate) const HELP: &str = "\
cargo xtask <command> [options] [-- <args>]

Commands:
  test [--full-matrix | --no-matrix] [--jobs N] [cargo-args] [-- test-args]
        Runs every test. First `cargo xtask etcd-bins` (below), then, with ETCD_VERSION=3.4
        (Debian's etcd; or the ETCD_VERSION you set):
          `cargo test --workspace --features etcd-cache/metrics --tests` (unit, with
          the metrics feature's, and integration against real etcd processes; the
          examples built and run by tests/examples.rs; benches are checked by clippy),
          `cargo test --workspace --doc`,
          `cargo xtask cycles`, `cargo xtask sizes`, `cargo xtask doc-refs`, `cargo fmt --all -- --check`, `cargo clippy --workspace --all-targets
          --all-features -- -D warnings`, a
          no-feature `cargo check`, `cargo doc` of both crates (RUSTDOCFLAGS=-D warnings); `cargo package -p etcd-cache --locked` (builds the
          packaged crate; `--allow-dirty` added, with a note, only when git reports
          uncommitted changes); `cargo xtask msrv`;
        then the version matrix:
          every integration test target (tests/*.rs) again with ETCD_VERSION=3.7 (and with
          3.4 when another primary ETCD_VERSION is set);
        then etcd's own e2e suites (v3.6.16) through etcd-cache-proxy, the short set:
          `proxy/tests/e2e/run.sh --set short --retries 1` (see its README; failures that
          proxy/tests/e2e/exceptions.tsv lists, with their reasons, are expected).
        --full-matrix  every integration test target on 3.5, 3.6 and 3.7, and every e2e
                       suite (`--set all`) (CI's run), then etcd's robustness suite's CI set
                       through the proxy (`cargo xtask robustness`, below).
        --no-matrix    only the 3.4 steps (and the 3.5 and 3.7 that rolling_upgrade and
                       range_stream start).
        Arguments before `--` go to cargo (e.g. --release); when they select targets (e.g.
        --test harness) only `cargo test --workspace <them>` runs, without the matrix.
        --jobs N       run N test binaries at once (default: cores + 1, 2 to 4; or
                       ETCD_CACHE_TEST_JOBS): built by `cargo test --no-run`, each run as
                       cargo runs it, with ETCD_CACHE_PORT_SLOT=i/N (disjoint port ranges),
                       its output printed when it ends; every binary runs, the failed ones
                       are listed last; one running over 20 minutes is killed. --jobs 1:
                       plain `cargo test`.
        Arguments after `--` go to the test binaries (e.g. --nocapture, a name filter).
        Every cargo run gets ETCD_CACHE_ETCD_DIR=<target>/etcd and ETCD_VERSION.
  etcd-bins [--force] [--check] [VERSION...]
        Builds etcd and etcdctl 3.5 (v3.5.35), 3.6 (v3.6.16) and 3.7 (v3.7.3), or only the
        VERSIONs named, from the Go modules in testkit/etcd-go/<version>/ into
        target/etcd/<version>/{etcd,etcdctl,VERSION}: `CGO_ENABLED=0 go build -trimpath
        -buildvcs=false`, then checks both report the pinned release and starts the server
        once (single member, the harness's flags). A version whose VERSION stamp matches
        (release, Go version, module sources) is reused. --force rebuilds; --check also
        starts the reused ones. Needs Go (1.26, or 1.21+ with GOTOOLCHAIN=auto) and the Go
        module proxy.
  demo [-- args]
        Runs the main example, `cargo run --release --example demo -- <args>`. It uses
        ETCD_ENDPOINTS when set (comma-separated), otherwise it starts its own etcd.
  bench [name] [--quick] [-- args]
        No name: `cargo bench --features unstable-bench-internals` (every bench target: the
        criterion micro-benchmarks `micro` and the end-to-end `fanout` against real etcd).
        With a name: `cargo bench --features unstable-bench-internals --bench <name>` if
        benches/<name>.rs exists, otherwise
        `cargo run --release --example bench_<name>` if examples/bench_<name>.rs exists.
        e.g. `cargo xtask bench fanout`. For `fanout`, `million` (and no name) it first runs
        `cargo build --release -p etcd-cache-proxy`: the fan-out bench's remote mode and the
        million-watch bench run it.
        --quick sets ETCD_CACHE_BENCH_QUICK=1, which every benchmark reads to run a short form.
        Arguments after `--` go to the benchmark binary.
  soak [--duration SECS] [-- test-args]
        The long fault-injection run: ETCD_CACHE_SOAK_SECS=<SECS> (default 600)
        `cargo test --release --test reliability -- --ignored --nocapture`, then the
        seeded model test's long form (`cargo test --release --lib model -- --ignored`,
        ETCD_CACHE_MODEL_SEEDS seeds, default 20,000).
  soak --proxy [--duration SECS] [--busy N] [--filter NAME]
        The proxy's short reliability tests (`remote_watches`: one proxy, a pair, a tier;
        a new seed each run), built as CI builds them (debug), run again and again until
        SECS (default 600) have passed or one fails, beside N busy threads (default 1: the
        load of a CI machine, under which the faults CI found showed). PROXY_LOG defaults to
        `info,etcd_cache_proxy::watch=trace`. A failing run's output is kept in
        target/xtask/soak/ and its tail printed (with the seed and the proxy log's path).
  msrv
        Checks that no locked dependency (normal or build, transitively; from
        `cargo metadata --format-version 1 --locked`) of a workspace crate declares a higher
        rust-version than the crate's, and that README.md states the root crate's
        (`Rust 1.x`). Prints the highest, also with dev-dependencies.
  cycles
        Lists import circles among the files of src/ and proxy/src/, counted from every
        path (crate::, super::, self::, a child module's name; inline paths and brace
        groups too, not only `use` lines); fails if there is one. `test` runs it with the
        lints.
  sizes
        Checks the house's bounds in src/ and proxy/src/: no file over 800 lines, no
        function over 120 (from its `fn` to its closing brace, literals and comments
        blanked); prints what is over and the largest of each; fails if one is over.
        `test` runs it with the lints.
  doc-refs
        Checks that every `file.rs: Item` or `file.rs: Type::item` the docs cite (docs/*.md,
        README.md, CONTRIBUTING.md, proxy/tests/*/README.md) names a file and an item that
        exist; fails otherwise. `test` runs it with the lints.
  prereqs [--check]
        Only checks (and, as root, installs) the system prerequisites; --check never installs
        and exits with 1 when a required one is missing.
  help
        This text.

System prerequisites (installed with `apt-get install --no-install-recommends` as root):
  etcd-server        etcd 3.4.23, the default test server (ETCD_BIN may point at another)
  etcd-client        etcdctl 3.4 (ETCDCTL_BIN may point at another)
  protobuf-compiler  protoc, for etcd-client's build (PROTOC may point at another)
  libprotobuf-dev    the well-known protos google/protobuf/*.proto next to protoc
                     (PROTOC_INCLUDE may point at another include directory)
Go (for `etcd-bins`, and so `test`) is not installed by xtask.

Environment read by the tests: ETCD_VERSION (3.4, 3.5, 3.6, 3.7: the server a run uses),
ETCD_BIN / ETCDCTL_BIN (any binary; overrides the version), ETCD_CACHE_ETCD_DIR (where
etcd-bins put the Go-built versions).
";

/// Whether `key` is one of the variables `cargo run` (the `cargo xtask` alias) and `cargo
/// test` set for the program they run, which are not settings of a build.
fn set_by_cargo_for_a_run(key: &str) -> bool {
    key.starts_with("CARGO_PKG_")
        || key.starts_with("CARGO_BIN_")
        || [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
        ]
        .contains(&key)
}

fn main() {
    // Every cargo xtask starts (and every script, whose cargo builds) runs without them:
    // ring's build script watches CARGO_MANIFEST_DIR, so a build with xtask's
    // (`.../xtask`) compiled ring and the ten crates above it apart from a plain `cargo
    // test`'s and from tests/examples.rs's build (104 s of a fresh `cargo xtask test`).
    // Single-threaded here: nothing reads the environment meanwhile.
    for (key, _) in env::vars_os() {
        if set_by_cargo_for_a_run(&key.to_string_lossy()) {
            env::remove_var(&key);
        }
    }
    let args: Vec<String> = env::args().skip(1).collect();
    let (cmd, rest) = match args.split_first() {
        Some((cmd, rest)) => (cmd.as_str(), rest.to_vec()),
        None => ("help", Vec::new()),
    };
    let code = match cmd {
        "help" | "-h" | "--help" => {
            print!("{HELP}{}{}", robustness::HELP, kubernetes::HELP);
            0
        }
        "prereqs" => match rest.as_slice() {
            [] => i32::from(!prereqs::ensure(false)),
            [flag] if flag == "--check" => i32::from(!prereqs::ensure(true)),
            _ => {
                eprintln!("xtask prereqs: the only option is --check\n\n{HELP}");
                2
            }
        },
        "etcd-bins" => etcd_bins::command(&rest),
        // --full-matrix ends with etcd's robustness suite's CI set (robustness.rs).
        "test" => match test_cmd::test(rest.clone()) {
            0 if split_dashes(&rest).0.iter().any(|a| a == "--full-matrix") => {
                robustness::full_matrix_step(&rest)
            }
            code => code,
        },
        "robustness" => robustness::command(&rest),
        "kubernetes" => kubernetes::command(&rest),
        "msrv" => msrv::command(&rest),
        "cycles" => cycles::command(&rest),
        "sizes" => sizes::command(&rest),
        "doc-refs" => doc_refs::command(&rest),
        "demo" => demo(rest),
        "bench" => bench(rest),
        "soak" => soak::command(&rest),
        other => {
            eprintln!("xtask: unknown command `{other}`\n");
            eprint!("{HELP}");
            2
        }
    };
    exit(code);
}

/// The workspace root (the parent of this crate's directory).
pub(crate) fn root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// Cargo's target directory: `target_directory` of `cargo metadata` (which honours
/// CARGO_TARGET_DIR and `build.target-dir`), else `<root>/target`.
pub(crate) fn target_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .current_dir(root())
            .args([
                "metadata",
                "--format-version",
                "1",
                "--no-deps",
                "--offline",
            ])
            .stderr(std::process::Stdio::null())
            .output();
        out.ok()
            .filter(|o| o.status.success())
            .and_then(|o| {
                json_string_field(&String::from_utf8_lossy(&o.stdout), "target_directory")
            })
            .map(PathBuf::from)
            .unwrap_or_else(|| root().join("target"))
    })
    .clone()
}

/// Where `etcd-bins` puts the Go-built versions: `$ETCD_CACHE_ETCD_DIR` (made absolute), else
/// `<target>/etcd`. Every cargo run xtask starts gets it as ETCD_CACHE_ETCD_DIR.
pub(crate) fn etcd_dir() -> PathBuf {
    if let Some(dir) = env::var_os(etcd_versions::ETCD_DIR_ENV).filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        return if dir.is_absolute() {
            dir
        } else {
            env::current_dir().unwrap_or_else(|_| root()).join(dir)
        };
    }
    target_dir().join("etcd")
}

/// The string value of `"name":"…"` in JSON text (no escapes other than `\\` and `\"`).
fn json_string_field(json: &str, name: &str) -> Option<String> {
    let key = format!("\"{name}\"");
    let at = json.find(&key)? + key.len();
    let rest = json[at..].trim_start().strip_prefix(':')?.trim_start();
    let rest = rest.strip_prefix('"')?;
    let mut out = String::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => out.push(chars.next()?),
            c => out.push(c),
        }
    }
    None
}

pub(crate) fn cargo() -> Command {
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root())
        .env(etcd_versions::ETCD_DIR_ENV, etcd_dir());
    cmd
}

/// Splits `args` at the first `--`: (before, after).
pub(crate) fn split_dashes(args: &[String]) -> (Vec<String>, Vec<String>) {
    match args.iter().position(|a| a == "--") {
        Some(i) => (args[..i].to_vec(), args[i + 1..].to_vec()),
        None => (args.to_vec(), Vec::new()),
    }
}

/// Runs `cmd`, echoing it first; returns its exit code (1 when it could not run, 101 when it
/// was killed by a signal).
pub(crate) fn run(mut cmd: Command) -> i32 {
    let shown: Vec<String> = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    let envs: Vec<String> = cmd
        .get_envs()
        .filter_map(|(k, v)| Some(format!("{}={}", k.to_string_lossy(), v?.to_string_lossy())))
        .collect();
    let prefix = if envs.is_empty() {
        String::new()
    } else {
        format!("{} ", envs.join(" "))
    };
    eprintln!("xtask: running {prefix}{}", shown.join(" "));
    match cmd.status() {
        Ok(status) => status.code().unwrap_or(101),
        Err(e) => {
            eprintln!("xtask: could not run {}: {e}", shown[0]);
            1
        }
    }
}

/// Whether xtask runs as root: the real uid in /proc/self/status (Linux), else `id -u`.
pub(crate) fn is_root() -> bool {
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        if let Some(uid) = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|rest| rest.split_whitespace().next())
        {
            return uid == "0";
        }
    }
    Command::new("id")
        .arg("-u")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .is_some_and(|s| s.trim() == "0")
}

fn target_exists(kind: &str, name: &str) -> bool {
    let dir = root().join(kind);
    dir.join(format!("{name}.rs")).is_file() || dir.join(name).join("main.rs").is_file()
}

fn demo(args: Vec<String>) -> i32 {
    if !prereqs::ensure(false) || !etcd_bins::ensure_for_env() {
        return 1;
    }
    if !target_exists("examples", "demo") {
        eprintln!("xtask demo: examples/demo.rs does not exist (yet)");
        return 1;
    }
    let (before, after) = split_dashes(&args);
    let mut cmd = cargo();
    cmd.args([
        "run",
        "--release",
        "--features",
        "metrics",
        "--example",
        "demo",
        "--",
    ])
    .args(before)
    .args(after);
    let code = run(cmd);
    if code != 0 {
        println!("xtask demo: FAILED (exit code {code})");
    }
    code
}

fn bench(args: Vec<String>) -> i32 {
    let (opts, passthrough) = split_dashes(&args);
    let mut quick = false;
    let mut name: Option<String> = None;
    for opt in opts {
        match opt.as_str() {
            "--quick" => quick = true,
            s if s.starts_with('-') => {
                eprintln!("xtask bench: unknown option `{s}`\n\n{HELP}");
                return 2;
            }
            _ if name.is_some() => {
                eprintln!("xtask bench: only one benchmark name may be given");
                return 2;
            }
            _ => name = Some(opt),
        }
    }
    if !prereqs::ensure(false) || !etcd_bins::ensure_for_env() {
        return 1;
    }
    // The fan-out bench (its remote mode) and the million-watch bench run
    // etcd-cache-proxy; a bench cannot build it while cargo holds the target directory's
    // lock.
    if matches!(name.as_deref(), None | Some("fanout") | Some("million")) {
        let mut build = cargo();
        build.args(["build", "--release", "-p", "etcd-cache-proxy"]);
        let code = run(build);
        if code != 0 {
            println!("xtask bench: building etcd-cache-proxy FAILED (exit code {code})");
            return code;
        }
    }
    let mut cmd = cargo();
    match &name {
        // The micro-benchmarks need the hidden `internals` module (feature
        // `unstable-bench-internals`); without it cargo would skip them silently.
        None => {
            cmd.args(["bench", "--features", "unstable-bench-internals,metrics"]);
        }
        Some(n) if target_exists("benches", n) => {
            cmd.args([
                "bench",
                "--features",
                "unstable-bench-internals,metrics",
                "--bench",
                n,
            ]);
        }
        Some(n) if target_exists("examples", &format!("bench_{n}")) => {
            cmd.args(["run", "--release", "--example", &format!("bench_{n}")]);
        }
        Some(n) => {
            eprintln!(
                "xtask bench: no benchmark `{n}`: neither benches/{n}.rs nor examples/bench_{n}.rs exists.\n\
                 Available: {}",
                available_benches().join(", ")
            );
            return 1;
        }
    }
    if !passthrough.is_empty() {
        cmd.arg("--").args(&passthrough);
    }
    if quick {
        cmd.env("ETCD_CACHE_BENCH_QUICK", "1");
    }
    let started = Instant::now();
    let code = run(cmd);
    let what = name.as_deref().unwrap_or("all");
    if code == 0 {
        println!(
            "xtask bench {what}: done in {:.0} s",
            started.elapsed().as_secs_f64()
        );
    } else {
        println!("xtask bench {what}: FAILED (exit code {code})");
    }
    code
}

fn available_benches() -> Vec<String> {
    let mut names = Vec::new();
    for (kind, prefix) in [("benches", ""), ("examples", "bench_")] {
        let Ok(entries) = std::fs::read_dir(root().join(kind)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let stem = if path.extension() == Some(OsStr::new("rs")) {
                path.file_stem().map(|s| s.to_string_lossy().into_owned())
            } else if path.join("main.rs").is_file() {
                path.file_name().map(|s| s.to_string_lossy().into_owned())
            } else {
                None
            };
            if let Some(stem) = stem.and_then(|s| s.strip_prefix(prefix).map(str::to_string)) {
                names.push(stem);
            }
        }
    }
    names.sort();
    names.dedup();
    if names.is_empty() {
        names.push("(none yet)".to_string());
    }
    names
}
