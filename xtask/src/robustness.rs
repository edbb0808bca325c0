//! `cargo xtask robustness`: etcd's robustness suite (tests/v3/robustness of the release
//! `proxy/tests/robustness/go.mod` pins) through etcd-cache-proxy, by
//! `proxy/tests/robustness/run.sh` (see its README.md).

use std::env;
use std::path::PathBuf;
use std::process::Command;

use crate::{root, run, split_dashes, target_dir};

pub(crate) const HELP: &str = "\
cargo xtask robustness [--runs N] [run.sh options]
        etcd's robustness suite (go.etcd.io/etcd/tests/v3/robustness v3.6.16: etcd's and
        Kubernetes' traffic, member kills, blackholes and gofail failpoints, then porcupine
        over every operation and every watch checked) with etcd-cache-proxy in front of every
        member: builds the release proxy, then runs proxy/tests/robustness/run.sh (which builds
        the test binary and an etcd with gofail from the Go module proxy). Default: every
        regression and exploratory scenario once through the proxy (--set all). Options go to
        run.sh: --runs N, --target cache|etcd|grpc-proxy|all (repeatable), --set
        regression|exploratory|ci|all, --scenario REGEX, --proxy-kill-every DURATION,
        --persist, --out DIR. Report: a line per run, a table per scenario x target,
        <out>/results.tsv; failures that proxy/tests/robustness/exceptions.tsv lists are
        expected. Not part of `cargo xtask test`; `--full-matrix` runs its CI set after the
        other steps.
";

/// run.sh's arguments for the bounded set `cargo xtask test --full-matrix` runs: the CI
/// scenarios (run.sh's `CI` list, 10), three times each, through the proxy (about 7 minutes on two
/// cores).
const FULL_MATRIX_ARGS: &[&str] = &["--set", "ci", "--runs", "3", "--target", "cache"];

/// `cargo xtask robustness [run.sh options]`.
pub fn command(args: &[String]) -> i32 {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{HELP}");
        return 0;
    }
    let mut cargo = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cargo
        .current_dir(root())
        .args(["build", "--release", "-p", "etcd-cache-proxy"]);
    let code = run(cargo);
    if code != 0 {
        return code;
    }
    let mut args = args.to_vec();
    if !args.iter().any(|a| a == "--set") {
        args.extend(["--set".to_string(), "all".to_string()]);
    }
    run(run_sh(
        &args,
        target_dir().join("release").join("etcd-cache-proxy"),
    ))
}

/// The step `cargo xtask test --full-matrix` runs last: the CI set through the proxy the
/// test steps built (release when the cargo arguments before `--` say so, else debug).
pub fn full_matrix_step(test_args: &[String]) -> i32 {
    let (cargo_args, _) = split_dashes(test_args);
    let profile = if cargo_args.iter().any(|a| a == "--release") {
        "release"
    } else {
        "debug"
    };
    eprintln!("xtask test: == etcd robustness through the proxy (ci set)");
    let args: Vec<String> = FULL_MATRIX_ARGS.iter().map(|s| s.to_string()).collect();
    run(run_sh(
        &args,
        target_dir().join(profile).join("etcd-cache-proxy"),
    ))
}

/// run.sh with the proxy binary given, its build output under the target directory, and no
/// `ETCD*` variable of ours (etcd reads `ETCD_<FLAG>` as flags).
fn run_sh(args: &[String], proxy: PathBuf) -> Command {
    let mut cmd = Command::new("bash");
    cmd.current_dir(root())
        .arg("proxy/tests/robustness/run.sh")
        .args(args);
    for (key, _) in env::vars_os() {
        if key.to_string_lossy().starts_with("ETCD") {
            cmd.env_remove(key);
        }
    }
    cmd.env("ETCD_CACHE_PROXY_BIN", proxy)
        .env("ROBUSTNESS_BUILD_DIR", target_dir().join("robustness-go"));
    cmd
}
