//! `cargo xtask test`: every test on the default etcd, then the version matrix.

use std::env;
use std::process::Command;
use std::time::Instant;

use crate::etcd_versions::{EtcdVersion, ETCD_VERSION_ENV};
use crate::{cargo, etcd_bins, msrv, prereqs, root, run, side_by_side, split_dashes};

/// How much of the version matrix runs after the steps on the primary version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matrix {
    /// Only the primary version.
    Off,
    /// Every integration target on [`EtcdVersion::NEWEST`], `consistent_reads` on the rest.
    Default,
    /// Every integration target on every version.
    Full,
}

/// One step of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub name: String,
    pub kind: StepKind,
    /// ETCD_VERSION for the run (lints have none).
    pub etcd: Option<EtcdVersion>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepKind {
    /// `cargo <args> [-- test-args]`.
    CargoTest(Vec<String>),
    /// `cargo xtask cycles`, `cargo fmt --check` and `cargo clippy`.
    Lints,
    /// `cargo package -p etcd-cache`: the published crate holds what it should and
    /// builds on its own.
    Package,
    /// `cargo xtask msrv`: no locked dependency needs a newer Rust than claimed.
    Msrv,
    /// `proxy/tests/e2e/run.sh <args>`: etcd's own e2e suites through etcd-cache-proxy.
    E2e(Vec<String>),
}

/// etcd's e2e sets run through the proxy: the short set by default; with `--full-matrix`
/// every suite, the two suites side by side (each in a network namespace of its own, as
/// the framework's ports are fixed), which keeps CI's run under an hour. A failed test is
/// run once more (and reported as flaky if it passes): etcd's own suites have timing
/// assumptions of their own.
fn e2e_step(set: &str) -> Step {
    let mut args = vec!["--set", set, "--retries", "1"];
    if set == "all" {
        args.extend(["--jobs", "2"]);
    }
    Step {
        name: format!("etcd e2e through the proxy ({set})"),
        kind: StepKind::E2e(args.iter().map(|s| s.to_string()).collect()),
        etcd: None,
    }
}

/// Set to `1` for the tests of a `--full-matrix` run: their longer variants run then
/// (testkit's `full_matrix()`).
const FULL_MATRIX_ENV: &str = "ETCD_CACHE_FULL_MATRIX";

/// How every `cargo test` step of the unit and integration tests starts: the whole
/// workspace, so that features unify the same way in each and a later step (the
/// integration tests on another etcd) runs the first step's binaries instead of building
/// them again for the root package's features (36 s of a fresh run), with the crate's
/// `metrics` feature (which etcd-cache-proxy enables anyway), so its unit tests run there.
const WORKSPACE_TEST: &[&str] = &["test", "--workspace", "--features", TEST_FEATURES];

/// The features of every `cargo test` step ([`WORKSPACE_TEST`]).
const TEST_FEATURES: &str = "etcd-cache/metrics";

/// Tells tests/examples.rs the features of the test build, so that its one `cargo build
/// --workspace --examples` reuses that build of the crate too.
const EXAMPLE_FEATURES_ENV: &str = "ETCD_CACHE_EXAMPLE_FEATURES";

/// The crates of the workspace that are published (the others have `publish = false`).
pub const PUBLISHED: &[&str] = &["etcd-cache"];

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

/// Whether `cargo_args` select targets.
pub fn selects_targets(cargo_args: &[String]) -> bool {
    cargo_args.iter().any(|a| {
        let flag = a.split('=').next().unwrap_or(a);
        TARGET_FLAGS.contains(&flag)
    })
}

/// The integration test targets of the root package: `tests/<name>.rs` and
/// `tests/<name>/main.rs`, sorted.
pub fn integration_targets() -> Vec<String> {
    let mut names = Vec::new();
    if let Ok(entries) = std::fs::read_dir(root().join("tests")) {
        for entry in entries.flatten() {
            let path = entry.path();
            let name = if path.extension().is_some_and(|e| e == "rs") && path.is_file() {
                path.file_stem()
            } else if path.join("main.rs").is_file() {
                path.file_name()
            } else {
                None
            };
            if let Some(name) = name {
                names.push(name.to_string_lossy().into_owned());
            }
        }
    }
    names.sort();
    names
}

/// Targets that pick their own etcd versions (a rolling upgrade from 3.4 to 3.5): run
/// once, in the primary step, never again per version.
pub const OWN_VERSIONS: &[&str] = &["rolling_upgrade"];

/// The Go-built versions that targets of the primary step start whatever ETCD_VERSION
/// says, built for every run: the proxy's `range_stream` runs in front of 3.4 (no
/// RangeStream) and 3.7. (`rolling_upgrade`, 3.4 to 3.5, and `range_stream` in front of
/// 3.5 and 3.6 run in `--full-matrix`, which builds every version.)
pub const PICKED_VERSIONS: &[EtcdVersion] = &[EtcdVersion::V3_7];

/// The steps of a run.
pub fn plan(
    primary: EtcdVersion,
    matrix: Matrix,
    cargo_args: &[String],
    integration: &[String],
) -> Vec<Step> {
    let cargo_test = |base: &[&str]| -> StepKind {
        let mut args: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        args.extend(cargo_args.iter().cloned());
        StepKind::CargoTest(args)
    };
    if selects_targets(cargo_args) {
        return vec![Step {
            name: format!("selected targets (etcd {primary})"),
            kind: cargo_test(&["test", "--workspace"]),
            etcd: Some(primary),
        }];
    }
    let mut steps = vec![
        Step {
            // Unit and integration tests. Benches and examples are not built here: clippy
            // checks them (`--all-targets`), and `tests/examples.rs` builds the examples
            // and runs them (a bench built in test mode only prints that it is skipped,
            // about 30 s of a fresh run's build for nothing).
            name: format!("tests (etcd {primary})"),
            kind: cargo_test(&[WORKSPACE_TEST, &["--tests"]].concat()),
            etcd: Some(primary),
        },
        Step {
            name: format!("doc tests (etcd {primary})"),
            kind: cargo_test(&["test", "--workspace", "--doc"]),
            etcd: Some(primary),
        },
        Step {
            name: "lints".to_string(),
            kind: StepKind::Lints,
            etcd: None,
        },
        Step {
            name: "package".to_string(),
            kind: StepKind::Package,
            etcd: None,
        },
        Step {
            name: "msrv".to_string(),
            kind: StepKind::Msrv,
            etcd: None,
        },
    ];
    let (full, e2e): (Vec<EtcdVersion>, Step) = match matrix {
        Matrix::Off => return steps,
        // A newcomer's run: Debian's 3.4 and the newest etcd (whichever is not primary).
        Matrix::Default => (
            vec![EtcdVersion::V3_4, EtcdVersion::NEWEST],
            e2e_step("short"),
        ),
        Matrix::Full => (EtcdVersion::ALL.to_vec(), e2e_step("all")),
    };
    let full: Vec<EtcdVersion> = full.into_iter().filter(|&v| v != primary).collect();
    let per_version: Vec<&String> = integration
        .iter()
        .filter(|t| !OWN_VERSIONS.contains(&t.as_str()))
        .collect();
    if !per_version.is_empty() {
        let mut base: Vec<String> = WORKSPACE_TEST.iter().map(|s| s.to_string()).collect();
        for t in per_version {
            base.push("--test".to_string());
            base.push(t.clone());
        }
        let base: Vec<&str> = base.iter().map(String::as_str).collect();
        for &v in &full {
            steps.push(Step {
                name: format!("integration tests (etcd {v})"),
                kind: cargo_test(&base),
                etcd: Some(v),
            });
        }
    }
    steps.push(e2e);
    steps
}

/// `cargo xtask test [--full-matrix | --no-matrix] [--jobs N] [cargo-args] [-- test-args]`.
pub fn test(args: Vec<String>) -> i32 {
    let started = Instant::now();
    let (before, test_args) = split_dashes(&args);
    let mut matrix = Matrix::Default;
    let mut cargo_args = Vec::new();
    let mut jobs = match env::var(side_by_side::JOBS_ENV) {
        Ok(s) if !s.is_empty() => match s.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!(
                    "xtask test: {}={s:?} is not a number of test binaries (1 or more)",
                    side_by_side::JOBS_ENV
                );
                return 2;
            }
        },
        _ => side_by_side::default_jobs(),
    };
    let mut before = before.into_iter();
    while let Some(arg) = before.next() {
        if arg == "--jobs" || arg.starts_with("--jobs=") {
            let value = match arg.strip_prefix("--jobs=") {
                Some(v) => Some(v.to_string()),
                None => before.next(),
            };
            match value.as_deref().map(str::parse::<usize>) {
                Some(Ok(n)) if n > 0 => jobs = n,
                _ => {
                    eprintln!(
                        "xtask test: --jobs takes how many test binaries run at once (1 or more)"
                    );
                    return 2;
                }
            }
            continue;
        }
        let chosen = match arg.as_str() {
            "--full-matrix" => Matrix::Full,
            "--no-matrix" => Matrix::Off,
            _ => {
                cargo_args.push(arg);
                continue;
            }
        };
        if matrix != Matrix::Default && matrix != chosen {
            eprintln!("xtask test: --full-matrix and --no-matrix exclude each other");
            return 2;
        }
        matrix = chosen;
    }
    let primary = match env::var(ETCD_VERSION_ENV) {
        Ok(s) if !s.is_empty() => match EtcdVersion::parse(&s) {
            Some(v) => v,
            None => {
                eprintln!(
                    "xtask test: {ETCD_VERSION_ENV}={s:?} names no etcd version; use one of {}",
                    EtcdVersion::names()
                );
                return 2;
            }
        },
        _ => EtcdVersion::DEFAULT,
    };
    if !prereqs::ensure(false) {
        return 1;
    }
    let integration = integration_targets();
    let steps = plan(primary, matrix, &cargo_args, &integration);

    // The Go-built versions the steps use: built (or found up to date) before anything runs.
    let mut needed: Vec<EtcdVersion> = steps
        .iter()
        .filter_map(|s| s.etcd)
        .filter(|v| v.is_go_built())
        .collect();
    // Targets of the primary step that start their own versions, whatever ETCD_VERSION
    // says (a missing one fails them).
    needed.extend_from_slice(PICKED_VERSIONS);
    needed.sort();
    needed.dedup();
    let overridden = env::var_os("ETCD_BIN").is_some_and(|v| !v.is_empty());
    if overridden {
        eprintln!(
            "xtask test: ETCD_BIN is set: every step runs that binary, whatever ETCD_VERSION says; \
             not building the Go versions"
        );
    } else if !needed.is_empty() {
        let opts = etcd_bins::Options {
            versions: needed,
            ..etcd_bins::Options::default()
        };
        if let Err(e) = etcd_bins::ensure(&opts) {
            eprintln!("xtask test: building the etcd versions failed: {e}");
            println!(
                "xtask test: FAILED in etcd-bins after {:.0} s",
                started.elapsed().as_secs_f64()
            );
            return 1;
        }
    }

    let mut done: Vec<(String, f64)> = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        let step_started = Instant::now();
        let code = match &step.kind {
            StepKind::CargoTest(args) => {
                let mut envs: Vec<(String, String)> =
                    vec![(EXAMPLE_FEATURES_ENV.to_string(), TEST_FEATURES.to_string())];
                if let Some(v) = step.etcd {
                    envs.push((ETCD_VERSION_ENV.to_string(), v.name().to_string()));
                }
                if matrix == Matrix::Full {
                    envs.push((FULL_MATRIX_ENV.to_string(), "1".to_string()));
                }
                eprintln!("xtask test: == {}", step.name);
                let mut cmd = cargo();
                cmd.args(args);
                for (k, v) in &envs {
                    cmd.env(k, v);
                }
                if jobs > 1 && side_by_side_fits(args) {
                    match side_by_side::build(cmd) {
                        Ok(binaries) => {
                            // The first step's tests mostly wait on etcd: the e2e build
                            // uses the CPU they leave.
                            let e2e_build = if index == 0 {
                                start_beside(&steps, &cargo_args)
                            } else {
                                None
                            };
                            let code = side_by_side::run(binaries, &test_args, &envs, jobs);
                            finish_beside(e2e_build);
                            code
                        }
                        Err(code) => code,
                    }
                } else {
                    if !test_args.is_empty() {
                        cmd.arg("--").args(&test_args);
                    }
                    run(cmd)
                }
            }
            StepKind::Lints => lints(),
            StepKind::Package => {
                eprintln!("xtask test: == {}", step.name);
                package()
            }
            StepKind::Msrv => {
                eprintln!("xtask test: == {}", step.name);
                msrv::check()
            }
            StepKind::E2e(args) => {
                eprintln!("xtask test: == {}", step.name);
                run(e2e_command(args, &cargo_args))
            }
        };
        let secs = step_started.elapsed().as_secs_f64();
        if code != 0 {
            summary(&done);
            println!(
                "xtask test: FAILED in {} (exit code {code}) after {:.0} s",
                step.name,
                started.elapsed().as_secs_f64()
            );
            return code;
        }
        done.push((step.name.clone(), secs));
    }
    summary(&done);
    let names: Vec<&str> = done.iter().map(|(n, _)| n.as_str()).collect();
    println!(
        "xtask test: all tests passed ({}) in {:.0} s",
        names.join(", "),
        started.elapsed().as_secs_f64()
    );
    0
}

/// The e2e step's Go build, started beside the first step's tests: the child, its log.
struct Beside {
    child: std::process::Child,
    log: std::path::PathBuf,
    started: Instant,
}

/// Starts, beside the first step's tests, the e2e step's Go build (`run.sh --build-only`;
/// Go takes no cargo lock), its output kept in a file under the target directory. Its
/// step runs later and reports a failed build itself. (The lints, package and MSRV checks
/// stay after the tests: they hold cargo's build lock, which tests/examples.rs waited on
/// past the limit for one binary in a loaded CI run.)
fn start_beside(steps: &[Step], cargo_args: &[String]) -> Option<Beside> {
    let Some(StepKind::E2e(args)) = steps
        .iter()
        .map(|s| &s.kind)
        .find(|k| matches!(k, StepKind::E2e(_)))
    else {
        return None;
    };
    let dir = crate::target_dir().join("xtask");
    let _ = std::fs::create_dir_all(&dir);
    let log = dir.join("beside-e2e-build.log");
    let out = std::fs::File::create(&log).ok()?;
    let err = out.try_clone().ok()?;
    let mut args = args.clone();
    args.push("--build-only".to_string());
    let mut cmd = e2e_command(&args, cargo_args);
    cmd.stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err);
    match cmd.spawn() {
        Ok(child) => {
            eprintln!(
                "xtask test: started the e2e build beside the tests (log: {})",
                log.display()
            );
            Some(Beside {
                child,
                log,
                started: Instant::now(),
            })
        }
        Err(e) => {
            eprintln!("xtask test: cannot start the e2e build beside the tests: {e}");
            None
        }
    }
}

/// Waits for what [`start_beside`] started and prints its output.
fn finish_beside(started: Option<Beside>) {
    let Some(mut b) = started else { return };
    let code = b.child.wait().map(|s| s.code().unwrap_or(101)).unwrap_or(1);
    let secs = b.started.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&b.log).unwrap_or_default();
    eprintln!("xtask test: == the e2e build (beside the tests, {secs:.0} s, exit code {code})");
    print!("{text}");
}

/// Whether a `cargo test` step's binaries can run side by side ([`side_by_side`]): not
/// doc tests (rustdoc runs those) nor a build-only run.
fn side_by_side_fits(args: &[String]) -> bool {
    !args
        .iter()
        .any(|a| a == "--doc" || a == "--no-run" || a.starts_with("--message-format"))
}

/// The e2e harness with the proxy the earlier steps built (debug, or release when the
/// cargo arguments say so), its build output under the target directory, and no `ETCD*`
/// variable of ours (etcd takes `ETCD_<FLAG>` for its flags).
fn e2e_command(args: &[String], cargo_args: &[String]) -> Command {
    let profile = if cargo_args.iter().any(|a| a == "--release") {
        "release"
    } else {
        "debug"
    };
    // Side-by-side jobs need network namespaces (`unshare --net`): root only.
    let root_user = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let mut args = args.to_vec();
    if !root_user {
        if let Some(i) = args.iter().position(|a| a == "--jobs") {
            eprintln!("xtask test: not root: the e2e suites run one after the other");
            args.drain(i..(i + 2).min(args.len()));
        }
    }
    let mut cmd = Command::new("bash");
    cmd.current_dir(root())
        .arg("proxy/tests/e2e/run.sh")
        .args(args);
    for (key, _) in env::vars_os() {
        if key.to_string_lossy().starts_with("ETCD") {
            cmd.env_remove(key);
        }
    }
    let target = crate::target_dir();
    cmd.env(
        "ETCD_CACHE_PROXY_BIN",
        target.join(profile).join("etcd-cache-proxy"),
    )
    .env("E2E_BUILD_DIR", target.join("e2e-go"));
    cmd
}

fn summary(done: &[(String, f64)]) {
    for (name, secs) in done {
        eprintln!("xtask test: passed {name:<40} {secs:>7.0} s");
    }
}

/// `cargo package -p <crate> --locked` for every published crate: lists the files (what
/// `include` lets in), then builds the packaged crate from them alone, as crates.io would.
/// A work tree with uncommitted changes (a developer's) is packaged with `--allow-dirty`
/// and a note; a clean clone (CI's) without it.
fn package() -> i32 {
    let dirty = std::process::Command::new("git")
        .current_dir(root())
        .args(["status", "--porcelain"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| !o.stdout.is_empty());
    if dirty {
        println!(
            "xtask test: the work tree has uncommitted changes: packaging them with \
             --allow-dirty (a clean clone packages without it)"
        );
    }
    for krate in PUBLISHED {
        let mut cmd = cargo();
        cmd.args(["package", "-p", krate, "--locked"]);
        if dirty {
            cmd.arg("--allow-dirty");
        }
        let code = run(cmd);
        if code != 0 {
            return code;
        }
    }
    0
}

/// `cargo fmt --check` and `cargo clippy -D warnings` (every target, every feature), when
/// the toolchain has those components (a toolchain without them only gets a note), and
/// `cargo doc` of both crates with rustdoc's warnings (broken links) as errors.
fn lints() -> i32 {
    // No import circle among the files of src/ and proxy/src/ (`cargo xtask cycles`).
    eprintln!("xtask test: == lints: cycles");
    if crate::cycles::command(&[]) != 0 {
        return 1;
    }
    // No file over 800 lines, no function over 120 (`cargo xtask sizes`).
    eprintln!("xtask test: == lints: sizes");
    if crate::sizes::command(&[]) != 0 {
        return 1;
    }
    // Every `file.rs: Item` the docs cite exists (`cargo xtask doc-refs`).
    eprintln!("xtask test: == lints: doc-refs");
    if crate::doc_refs::command(&[]) != 0 {
        return 1;
    }
    // clippy builds every feature at once (unstable-bench-internals, metrics, tls,
    // unstable-test-hooks), and the crate must build with no feature. (The unit tests of
    // the metrics feature run in the first step: `WORKSPACE_TEST`.)
    let steps: [(&str, &[&str]); 4] = [
        ("fmt", &["fmt", "--all", "--", "--check"]),
        (
            "clippy",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--all-features",
                "--",
                "-D",
                "warnings",
            ],
        ),
        (
            "check",
            &[
                "check",
                "-p",
                "etcd-cache",
                "--lib",
                "--no-default-features",
            ],
        ),
        (
            "doc",
            &[
                "doc",
                "--no-deps",
                "--all-features",
                "-p",
                "etcd-cache",
                "-p",
                "etcd-cache-proxy",
            ],
        ),
    ];
    for (name, args) in steps {
        // fmt and clippy are rustup components that may be missing; test and check
        // are cargo's own.
        let component = matches!(name, "fmt" | "clippy");
        let available = !component
            || cargo()
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
        if name == "doc" {
            cmd.env("RUSTDOCFLAGS", "-D warnings");
        }
        let code = run(cmd);
        if code != 0 {
            return code;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn names(steps: &[Step]) -> Vec<String> {
        steps.iter().map(|s| s.name.clone()).collect()
    }

    const TARGETS: &[&str] = &["consistent_reads", "harness", "watch_cache"];

    #[test]
    fn default_matrix() {
        let steps = plan(EtcdVersion::V3_4, Matrix::Default, &[], &strings(TARGETS));
        assert_eq!(
            names(&steps),
            [
                "tests (etcd 3.4)",
                "doc tests (etcd 3.4)",
                "lints",
                "package",
                "msrv",
                "integration tests (etcd 3.7)",
                "etcd e2e through the proxy (short)",
            ]
        );
        assert_eq!(
            steps[6].kind,
            StepKind::E2e(strings(&["--set", "short", "--retries", "1"]))
        );
        assert_eq!(steps[3].kind, StepKind::Package);
        assert_eq!(steps[4].kind, StepKind::Msrv);
        assert_eq!(
            steps[5].kind,
            StepKind::CargoTest(strings(&[
                "test",
                "--workspace",
                "--features",
                "etcd-cache/metrics",
                "--test",
                "consistent_reads",
                "--test",
                "harness",
                "--test",
                "watch_cache"
            ]))
        );
        assert_eq!(steps[5].etcd, Some(EtcdVersion::V3_7));
        assert_eq!(steps[2].etcd, None);
        assert_eq!(steps[3].etcd, None);
    }

    #[test]
    fn full_and_off() {
        let full = plan(EtcdVersion::V3_4, Matrix::Full, &[], &strings(TARGETS));
        assert_eq!(
            names(&full)[5..],
            [
                "integration tests (etcd 3.5)",
                "integration tests (etcd 3.6)",
                "integration tests (etcd 3.7)",
                "etcd e2e through the proxy (all)",
            ]
        );
        assert_eq!(
            full[8].kind,
            StepKind::E2e(strings(&["--set", "all", "--retries", "1", "--jobs", "2"]))
        );
        let off = plan(EtcdVersion::V3_4, Matrix::Off, &[], &strings(TARGETS));
        assert_eq!(off.len(), 5);
    }

    #[test]
    fn another_primary_moves_3_4_into_the_matrix() {
        let steps = plan(EtcdVersion::V3_7, Matrix::Default, &[], &strings(TARGETS));
        assert_eq!(
            names(&steps)[5..],
            [
                "integration tests (etcd 3.4)",
                "etcd e2e through the proxy (short)",
            ]
        );
        let steps = plan(EtcdVersion::V3_6, Matrix::Default, &[], &strings(TARGETS));
        assert_eq!(
            names(&steps)[5..],
            [
                "integration tests (etcd 3.4)",
                "integration tests (etcd 3.7)",
                "etcd e2e through the proxy (short)",
            ]
        );
    }

    #[test]
    fn cargo_args_reach_every_run_and_selection_skips_the_matrix() {
        let steps = plan(
            EtcdVersion::V3_4,
            Matrix::Default,
            &strings(&["--release"]),
            &strings(TARGETS),
        );
        for s in &steps {
            if let StepKind::CargoTest(args) = &s.kind {
                assert_eq!(
                    args.last().map(String::as_str),
                    Some("--release"),
                    "{}",
                    s.name
                );
            }
        }
        let sel = plan(
            EtcdVersion::V3_5,
            Matrix::Full,
            &strings(&["--test", "harness"]),
            &strings(TARGETS),
        );
        assert_eq!(names(&sel), ["selected targets (etcd 3.5)"]);
        assert!(selects_targets(&strings(&["--test=harness"])));
        assert!(!selects_targets(&strings(&[
            "--release",
            "--features",
            "x"
        ])));
    }

    #[test]
    fn the_default_matrix_is_3_4_and_the_newest() {
        let steps = plan(
            EtcdVersion::V3_4,
            Matrix::Default,
            &[],
            &strings(&["harness"]),
        );
        assert_eq!(
            names(&steps)[5..],
            [
                "integration tests (etcd 3.7)",
                "etcd e2e through the proxy (short)"
            ]
        );
        let steps = plan(EtcdVersion::V3_4, Matrix::Default, &[], &[]);
        assert_eq!(steps.len(), 6);
    }

    #[test]
    fn integration_targets_of_this_repo() {
        let t = integration_targets();
        assert!(t.iter().any(|n| n == "consistent_reads"), "{t:?}");
        assert!(!t.iter().any(|n| n == "support"), "{t:?}");
    }
}
