//! Every example runs, against a throwaway etcd, and exits 0 within its time limit: the
//! examples check what they observe and exit non-zero on a wrong result, so this is what
//! keeps them from rotting.
//!
//! Every example in `examples/` runs (a new one is picked up by itself), with the
//! arguments in [`ARGS`] where it needs some.
//!
//! The binaries are the ones in `target/<profile>/examples/`. If one is missing or older
//! than its sources, every example is built first, at once, with `cargo build --workspace
//! --examples`: the same packages as `cargo test --workspace` (and `cargo xtask test`)
//! selects, so the same features are unified and the test build's dependencies are used
//! as they are (a `cargo build --example NAME` of the root package alone resolves other
//! features and compiled about 25 crates again, 100 to 250 s on 2 cores), without the
//! variables cargo sets for a test's run (ring's build script watches
//! `CARGO_MANIFEST_DIR`: with it ring, rustls, tonic and etcd-client were compiled again,
//! 105 s of a fresh `cargo xtask test`), and under `cargo xtask test` with its build's
//! features (`ETCD_CACHE_EXAMPLE_FEATURES`).
//!
//! `cargo test --test examples -- --nocapture` shows each example's output.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// The arguments an example runs with here, where it needs some to stay short.
const ARGS: &[(&str, &[&str])] = &[(
    "demo",
    &["--subscribers", "300", "--puts", "500", "--keys", "50"],
)];

/// How long one example may take.
const LIMIT: Duration = Duration::from_secs(90);

/// The examples written with this test in mind; each must be found.
const EXPECTED: &[&str] = &[
    "get_then_watch",
    "multiplexed",
    "tenants",
    "health",
    "demo",
    "typed_config",
];

/// Every example: `examples/NAME.rs` and `examples/NAME/main.rs`, sorted.
fn examples() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("examples/")
        .flatten()
        .filter_map(|entry| {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "rs") && path.is_file() {
                path.file_stem().map(|s| s.to_string_lossy().into_owned())
            } else if path.join("main.rs").is_file() {
                path.file_name().map(|s| s.to_string_lossy().into_owned())
            } else {
                None
            }
        })
        .collect();
    names.sort();
    names
}

/// `target/<profile>/`, from this test binary's place in `target/<profile>/deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps")
        .to_path_buf()
}

/// The newest modification time of the files under `path`.
fn newest(path: &Path) -> SystemTime {
    let Ok(meta) = std::fs::metadata(path) else {
        return SystemTime::UNIX_EPOCH;
    };
    if !meta.is_dir() {
        return meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
    }
    std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| newest(&entry.path()))
        .max()
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// The example's binary in `target/<profile>/examples/`, and whether it is there and no
/// older than its sources.
fn example_binary(name: &str) -> (PathBuf, bool) {
    let binary = profile_dir()
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sources = [
        root.join("examples").join(format!("{name}.rs")),
        root.join("examples").join(name),
        root.join("src"),
        root.join("testkit").join("src"),
        root.join("Cargo.toml"),
    ]
    .iter()
    .map(|p| newest(p))
    .max()
    .unwrap_or(SystemTime::UNIX_EPOCH);
    let built = std::fs::metadata(&binary).and_then(|m| m.modified()).ok();
    let fresh = built.is_some_and(|t| t >= sources);
    (binary, fresh)
}

/// Every example's binary, all built first (in one cargo run) if one is missing or stale.
fn example_binaries(names: &[String]) -> Vec<PathBuf> {
    let found: Vec<(PathBuf, bool)> = names.iter().map(|n| example_binary(n)).collect();
    if found.iter().all(|(_, fresh)| *fresh) {
        return found.into_iter().map(|(b, _)| b).collect();
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--workspace", "--examples"]);
    // What cargo sets for this test's run is not the build's: ring's build script
    // watches CARGO_MANIFEST_DIR, so with it ring and the ten crates above it were built
    // again (105 s of a fresh `cargo xtask test`, beside its tests).
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_BIN_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
            ]
            .contains(&key.as_ref())
        {
            build.env_remove(key.as_ref());
        }
    }
    // `cargo xtask test` says which features its test build had: the same here reuses
    // its build of this crate too.
    if let Ok(features) = std::env::var("ETCD_CACHE_EXAMPLE_FEATURES") {
        build.args(["--features", &features]);
    }
    if profile_dir().file_name().is_some_and(|p| p == "release") {
        build.arg("--release");
    }
    println!("building the examples: {build:?}");
    let status = build.status().expect("run cargo build");
    assert!(
        status.success(),
        "cargo build --workspace --examples failed"
    );
    found
        .into_iter()
        .map(|(binary, _)| {
            assert!(binary.exists(), "no {} after the build", binary.display());
            binary
        })
        .collect()
}

/// Runs `binary` with `args` and `ETCD_ENDPOINTS`; its exit code and output, or `None`
/// if it was killed at `limit`.
fn run(binary: &Path, args: &[&str], endpoint: &str, limit: Duration) -> (Option<i32>, String) {
    let out = tempfile::tempfile().expect("temp file");
    let mut child = Command::new(binary)
        .args(args)
        .env("ETCD_ENDPOINTS", endpoint)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("dup"))
        .stderr(out.try_clone().expect("dup"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()));
    let started = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status.code().unwrap_or(-1));
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = out;
    let mut text = String::new();
    use std::io::{Read, Seek};
    let _ = out.rewind();
    let _ = out.read_to_string(&mut text);
    (code, text)
}

#[test]
fn every_example_runs_and_checks_what_it_observes() {
    let names = examples();
    for name in EXPECTED {
        assert!(
            names.iter().any(|n| n == name),
            "examples/{name}.rs is missing"
        );
    }
    let binaries = example_binaries(&names);
    let etcd = testkit::EtcdServer::start();
    let mut failures = Vec::new();
    for (name, binary) in names.iter().zip(&binaries) {
        let args = ARGS
            .iter()
            .find(|(n, _)| n == name)
            .map_or(&[][..], |(_, a)| *a);
        let started = Instant::now();
        let (code, output) = run(binary, args, &etcd.endpoint(), LIMIT);
        let took = started.elapsed();
        println!("---- example {name} {args:?}: {code:?} in {took:.1?}\n{output}");
        match code {
            Some(0) => {}
            Some(code) => failures.push(format!("{name} exited with {code}:\n{output}")),
            None => failures.push(format!("{name} did not finish within {LIMIT:?}:\n{output}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
