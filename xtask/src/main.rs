//! `cargo xtask <command>`: the project's tasks, each with its own set-up (std only).
//!
//! Every command first checks the prerequisites (`etcd`, `protoc`) and, when they are missing
//! and the user is root, installs them with apt.

use std::env;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{exit, Command};
use std::time::Instant;

const HELP: &str = "\
cargo xtask <command> [options] [-- <args>]

Commands:
  test [cargo-args] [-- test-args]
        Runs every test: `cargo test --workspace --all-targets` (unit, integration against
        real etcd processes, benches and examples are built), then
        `cargo test --workspace --doc`. Arguments before `--` go to cargo (e.g. --release);
        when they select targets (e.g. --test harness) only `cargo test --workspace <them>`
        runs. Arguments after `--` go to the test binaries (e.g. --nocapture, a name filter).
  demo [-- args]
        Runs the main example, `cargo run --release --example demo -- <args>`. It uses
        ETCD_ENDPOINTS when set (comma-separated), otherwise it starts its own etcd.
  bench [name] [--quick] [-- args]
        No name: `cargo bench --features bench-internals` (every bench target: the
        criterion micro-benchmarks `micro` and the end-to-end `fanout` against real etcd).
        With a name: `cargo bench --features bench-internals --bench <name>` if
        benches/<name>.rs exists, otherwise
        `cargo run --release --example bench_<name>` if examples/bench_<name>.rs exists.
        e.g. `cargo xtask bench fanout`.
        --quick sets ETCD_CACHE_BENCH_QUICK=1, which every benchmark reads to run a short form.
        Arguments after `--` go to the benchmark binary.
  soak [--duration SECS] [-- test-args]
        The long fault-injection run: ETCD_CACHE_SOAK_SECS=<SECS> (default 600)
        `cargo test --release --test reliability -- --ignored --nocapture`.
  prereqs
        Only checks (and, as root, installs) the prerequisites.
  help
        This text.

Prerequisites: `etcd` (Debian package etcd-server; ETCD_BIN may point at another binary)
and `protoc` (Debian package protobuf-compiler; PROTOC may point at another binary).
";

fn main() {
    let args: Vec<String> = env::args().skip(1).collect();
    let (cmd, rest) = match args.split_first() {
        Some((cmd, rest)) => (cmd.as_str(), rest.to_vec()),
        None => ("help", Vec::new()),
    };
    let code = match cmd {
        "help" | "-h" | "--help" => {
            print!("{HELP}");
            0
        }
        "prereqs" => {
            prereqs();
            0
        }
        "test" => test(rest),
        "demo" => demo(rest),
        "bench" => bench(rest),
        "soak" => soak(rest),
        other => {
            eprintln!("xtask: unknown command `{other}`\n");
            eprint!("{HELP}");
            2
        }
    };
    exit(code);
}

/// The workspace root (the parent of this crate's directory).
fn root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

fn cargo() -> Command {
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// Splits `args` at the first `--`: (before, after).
fn split_dashes(args: &[String]) -> (Vec<String>, Vec<String>) {
    match args.iter().position(|a| a == "--") {
        Some(i) => (args[..i].to_vec(), args[i + 1..].to_vec()),
        None => (args.to_vec(), Vec::new()),
    }
}

/// Runs `cmd`, echoing it first; returns its exit code (1 when it could not run, 101 when it
/// was killed by a signal).
fn run(mut cmd: Command) -> i32 {
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

/// Whether `name` is an executable file in a PATH directory.
fn on_path(name: &str) -> bool {
    let Some(path) = env::var_os("PATH") else {
        return false;
    };
    env::split_paths(&path).any(|dir| dir.join(name).is_file())
}

fn env_file(var: &str) -> Option<bool> {
    let value = env::var_os(var).filter(|v| !v.is_empty())?;
    Some(Path::new(&value).is_file())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .is_some_and(|s| s.trim() == "0")
}

/// Checks for `etcd` and `protoc`; installs the missing ones with apt as root, otherwise
/// says what to install and exits with 1.
fn prereqs() {
    let mut missing: Vec<(&str, &str)> = Vec::new();
    if !env_file("ETCD_BIN").unwrap_or_else(|| on_path("etcd")) {
        missing.push(("etcd", "etcd-server"));
    }
    if !env_file("PROTOC").unwrap_or_else(|| on_path("protoc")) {
        missing.push(("protoc", "protobuf-compiler"));
    }
    if missing.is_empty() {
        return;
    }
    let tools: Vec<&str> = missing.iter().map(|m| m.0).collect();
    let packages: Vec<&str> = missing.iter().map(|m| m.1).collect();
    if !is_root() {
        eprintln!(
            "xtask: missing {}. Install the packages first, e.g.:\n\n    sudo apt-get update && sudo apt-get install -y {}\n\n\
             (or set ETCD_BIN / PROTOC to existing binaries)",
            tools.join(" and "),
            packages.join(" ")
        );
        exit(1);
    }
    eprintln!(
        "xtask: missing {}; installing {} with apt-get",
        tools.join(" and "),
        packages.join(" ")
    );
    let apt = |args: &[&str]| {
        let mut cmd = Command::new("apt-get");
        cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        run(cmd)
    };
    if apt(&["update"]) != 0 {
        eprintln!("xtask: apt-get update failed");
        exit(1);
    }
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend(&packages);
    if apt(&install) != 0 {
        eprintln!("xtask: apt-get install {} failed", packages.join(" "));
        exit(1);
    }
    for tool in &tools {
        if !on_path(tool) {
            eprintln!(
                "xtask: `{tool}` is still not on PATH after installing; please install it by hand"
            );
            exit(1);
        }
    }
}

/// cargo test options that select targets (then xtask runs only them, without `--doc`).
const TARGET_FLAGS: &[&str] = &[
    "--lib",
    "--bin",
    "--bins",
    "--example",
    "--examples",
    "--test",
    "--tests",
    "--bench",
    "--benches",
    "--all-targets",
    "--doc",
];

fn test(args: Vec<String>) -> i32 {
    prereqs();
    let started = Instant::now();
    let (cargo_args, test_args) = split_dashes(&args);
    let steps: [(&str, &[&str]); 2] = [
        ("all targets", &["test", "--workspace", "--all-targets"]),
        ("doc tests", &["test", "--workspace", "--doc"]),
    ];
    // `--doc` cannot be combined with target selection; when targets are chosen, only they run.
    let selects_targets = cargo_args.iter().any(|a| {
        let flag = a.split('=').next().unwrap_or(a);
        TARGET_FLAGS.contains(&flag)
    });
    for (name, base) in steps {
        let base = if selects_targets {
            if name == "doc tests" {
                continue;
            }
            &base[..2]
        } else {
            base
        };
        let mut cmd = cargo();
        cmd.args(base).args(&cargo_args);
        if !test_args.is_empty() {
            cmd.arg("--").args(&test_args);
        }
        let code = run(cmd);
        if code != 0 {
            println!(
                "xtask test: FAILED in {name} (exit code {code}) after {:.0} s",
                started.elapsed().as_secs_f64()
            );
            return code;
        }
    }
    if !selects_targets {
        let code = lints();
        if code != 0 {
            println!(
                "xtask test: FAILED in lints (exit code {code}) after {:.0} s",
                started.elapsed().as_secs_f64()
            );
            return code;
        }
    }
    let what = if selects_targets {
        "selected targets"
    } else {
        "all targets, doc tests, lints"
    };
    println!(
        "xtask test: all tests passed ({what}) in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    0
}

/// `cargo fmt --check` and `cargo clippy -D warnings` (every target, every feature), when
/// the toolchain has those components; a toolchain without them only gets a note.
fn lints() -> i32 {
    let steps: [(&str, &[&str]); 2] = [
        ("fmt", &["fmt", "--all", "--", "--check"]),
        (
            "clippy",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--features",
                "bench-internals",
                "--",
                "-D",
                "warnings",
            ],
        ),
    ];
    for (name, args) in steps {
        let available = cargo()
            .args([name, "--version"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !available {
            println!("xtask test: cargo {name} is not installed; skipping it");
            continue;
        }
        let mut cmd = cargo();
        cmd.args(args);
        let code = run(cmd);
        if code != 0 {
            return code;
        }
    }
    0
}

fn target_exists(kind: &str, name: &str) -> bool {
    let dir = root().join(kind);
    dir.join(format!("{name}.rs")).is_file() || dir.join(name).join("main.rs").is_file()
}

fn demo(args: Vec<String>) -> i32 {
    prereqs();
    if !target_exists("examples", "demo") {
        eprintln!("xtask demo: examples/demo.rs does not exist (yet)");
        return 1;
    }
    let (before, after) = split_dashes(&args);
    let mut cmd = cargo();
    cmd.args(["run", "--release", "--example", "demo", "--"])
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
    prereqs();
    let mut cmd = cargo();
    match &name {
        // The micro-benchmarks need the hidden `internals` module (feature
        // `bench-internals`); without it cargo would skip them silently.
        None => {
            cmd.args(["bench", "--features", "bench-internals"]);
        }
        Some(n) if target_exists("benches", n) => {
            cmd.args(["bench", "--features", "bench-internals", "--bench", n]);
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

fn soak(args: Vec<String>) -> i32 {
    let (opts, passthrough) = split_dashes(&args);
    let mut secs: u64 = 600;
    let mut it = opts.into_iter();
    while let Some(opt) = it.next() {
        let value = match opt.as_str() {
            "--duration" => it.next(),
            s if s.starts_with("--duration=") => Some(s["--duration=".len()..].to_string()),
            s => {
                eprintln!("xtask soak: unknown option `{s}`\n\n{HELP}");
                return 2;
            }
        };
        match value
            .as_deref()
            .map(|v| v.trim_end_matches('s').parse::<u64>())
        {
            Some(Ok(n)) if n > 0 => secs = n,
            _ => {
                eprintln!("xtask soak: --duration needs a positive number of seconds");
                return 2;
            }
        }
    }
    prereqs();
    if !target_exists("tests", "reliability") {
        eprintln!("xtask soak: tests/reliability.rs does not exist (yet); nothing to soak");
        return 1;
    }
    let mut cmd = cargo();
    cmd.args([
        "test",
        "--release",
        "--test",
        "reliability",
        "--",
        "--ignored",
        "--nocapture",
    ])
    .args(&passthrough)
    .env("ETCD_CACHE_SOAK_SECS", secs.to_string());
    let started = Instant::now();
    let code = run(cmd);
    if code == 0 {
        println!(
            "xtask soak: passed ({secs} s requested, {:.0} s total)",
            started.elapsed().as_secs_f64()
        );
    } else {
        println!("xtask soak: FAILED (exit code {code})");
    }
    code
}
