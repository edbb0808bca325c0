//! `cargo test`'s test binaries run side by side: built once with `cargo test --no-run`,
//! then run `jobs` at a time (cargo runs them one after the other). Most of the suite waits
//! on etcd (fsyncs, elections, leases, timeouts), not on the CPU, so a 2-core machine runs
//! three at once in a little over a third of the time.
//!
//! Each binary runs as cargo would run it (its package's directory, `CARGO`,
//! `CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`), with `ETCD_CACHE_PORT_SLOT=i/jobs` so that
//! binaries running together pick ports from disjoint ranges (testkit's `free_port`). Its
//! output is kept and printed whole when it ends, after a `Running` line as cargo's. Every
//! binary runs even when one fails; the failures are listed at the end. The longest binaries
//! of the last run start first (their times are kept under the target directory; a first
//! run takes those of `xtask/test-times.tsv`).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A binary that runs longer than this is killed and counted as failed (a hung test must
/// not hold a CI run until its own limit).
pub const BINARY_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// The environment variable testkit's `free_port` reads (testkit::PORT_SLOT_ENV).
const PORT_SLOT_ENV: &str = "ETCD_CACHE_PORT_SLOT";

/// Set to run the test binaries of `cargo xtask test` this many at a time.
pub const JOBS_ENV: &str = "ETCD_CACHE_TEST_JOBS";

/// How many binaries run at once by default: one more than the cores (the suite mostly
/// waits), at least 2 and at most 4.
pub fn default_jobs() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores + 1).clamp(2, 4)
}

/// One test binary `cargo test --no-run` built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestBinary {
    /// e.g. `etcd-cache-proxy test auth`.
    pub name: String,
    pub package: String,
    pub src_path: String,
    pub executable: PathBuf,
    pub manifest_dir: PathBuf,
}

impl TestBinary {
    /// The binary to run as `cargo test` runs it: in its package's directory, with
    /// `CARGO`, `CARGO_MANIFEST_DIR` and `CARGO_PKG_NAME`, its output to `output` (stdout
    /// and stderr both), no stdin.
    pub fn command(&self, output: &File) -> std::io::Result<Command> {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(&self.executable);
        cmd.current_dir(&self.manifest_dir)
            .env("CARGO", cargo)
            .env("CARGO_MANIFEST_DIR", &self.manifest_dir)
            .env("CARGO_PKG_NAME", &self.package)
            .stdin(Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output.try_clone()?);
        Ok(cmd)
    }
}

/// The string value of `"key":"..."` at or after `from` in `line` (JSON escapes of `"` and
/// `\` undone), and where it ends.
fn string_field(line: &str, key: &str, from: usize) -> Option<(String, usize)> {
    let pat = format!("\"{key}\":\"");
    let start = line[from..].find(&pat)? + from + pat.len();
    let mut out = String::new();
    let mut chars = line[start..].char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => match chars.next()?.1 {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                other => out.push(other),
            },
            '"' => return Some((out, start + i + 1)),
            c => out.push(c),
        }
    }
    None
}

/// The test binary a line of `cargo --message-format=json` names: a compiler artifact
/// built for testing (`"profile":{..."test":true}`) with an executable. cargo test runs
/// each of these (unit tests, integration tests, benches and examples built as tests).
pub fn parse_artifact(line: &str) -> Option<TestBinary> {
    if !line.contains("\"reason\":\"compiler-artifact\"") {
        return None;
    }
    let (executable, _) = string_field(line, "executable", 0)?;
    let profile = line.find("\"profile\":{")?;
    let profile_end = profile + line[profile..].find('}')?;
    if !line[profile..profile_end].contains("\"test\":true") {
        return None;
    }
    let (package_id, _) = string_field(line, "package_id", 0)?;
    let (manifest, _) = string_field(line, "manifest_path", 0)?;
    let target = line.find("\"target\":{")?;
    let kind_at = target + line[target..].find("\"kind\":[\"")? + "\"kind\":[\"".len();
    let kind = &line[kind_at..kind_at + line[kind_at..].find('"')?];
    let (target_name, _) = string_field(line, "name", target)?;
    let (src_path, _) = string_field(line, "src_path", target)?;
    // `path+file:///dir#name@0.1.0`, or `path+file:///dir/name#0.1.0` (older cargo).
    let package = match package_id.rsplit_once('#') {
        Some((path, rest)) => match rest.split_once('@') {
            Some((name, _)) => name.to_string(),
            None => path.rsplit('/').next().unwrap_or(path).to_string(),
        },
        None => package_id.clone(),
    };
    let manifest_dir = Path::new(&manifest)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    Some(TestBinary {
        name: format!("{package} {kind} {target_name}"),
        package,
        src_path,
        executable: PathBuf::from(executable),
        manifest_dir,
    })
}

/// Builds the test binaries of `cargo_args` (`test ...`), with cargo's diagnostics shown
/// as usual; returns them in cargo's order, or cargo's exit code.
pub fn build(mut cmd: Command) -> Result<Vec<TestBinary>, i32> {
    cmd.args(["--no-run", "--message-format=json-render-diagnostics"])
        .stdout(Stdio::piped());
    let shown: Vec<String> = cmd
        .get_args()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    eprintln!("xtask: running cargo {}", shown.join(" "));
    let mut child = cmd.spawn().map_err(|e| {
        eprintln!("xtask: could not run cargo: {e}");
        1
    })?;
    let mut binaries = Vec::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(b) = parse_artifact(&line) {
                if !binaries.contains(&b) {
                    binaries.push(b);
                }
            } else if !line.starts_with('{') {
                // Not a JSON message: a build script's or cargo's own line, shown.
                println!("{line}");
            }
        }
    }
    match child.wait() {
        Ok(s) if s.success() => Ok(binaries),
        Ok(s) => Err(s.code().unwrap_or(101)),
        Err(_) => Err(1),
    }
}

/// Where the times of the last run are kept.
fn times_file() -> PathBuf {
    crate::target_dir().join("xtask").join("test-times.tsv")
}

/// The times of a run on a fresh 2-core machine, kept in the repository: the order of a
/// first run (the target directory has no times yet).
fn shipped_times() -> PathBuf {
    crate::root().join("xtask").join("test-times.tsv")
}

fn read_times(path: &Path) -> HashMap<String, f64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (name, secs) = l.rsplit_once('\t')?;
            Some((name.to_string(), secs.parse().ok()?))
        })
        .collect()
}

/// The last run's times over the shipped ones.
fn load_times() -> HashMap<String, f64> {
    let mut times = read_times(&shipped_times());
    times.extend(read_times(&times_file()));
    times
}

fn save_times(new: &[(String, f64)]) {
    let mut all = read_times(&times_file());
    all.extend(new.iter().cloned());
    let mut lines: Vec<String> = all.iter().map(|(n, s)| format!("{n}\t{s:.1}")).collect();
    lines.sort();
    let path = times_file();
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::write(path, lines.join("\n") + "\n");
}

/// The order binaries start in: the longest of the last run first (a long one started
/// last would make the whole run wait for it); those without a time keep cargo's order,
/// before the rest.
pub fn order(binaries: &mut [TestBinary], times: &HashMap<String, f64>) {
    binaries.sort_by(|a, b| {
        let (ta, tb) = (times.get(&a.name), times.get(&b.name));
        match (ta, tb) {
            (None, None) => std::cmp::Ordering::Equal,
            (None, Some(_)) => std::cmp::Ordering::Less,
            (Some(_), None) => std::cmp::Ordering::Greater,
            (Some(x), Some(y)) => y.total_cmp(x),
        }
    });
}

struct Running {
    binary: TestBinary,
    child: Child,
    output: PathBuf,
    started: Instant,
    slot: usize,
}

/// Runs `binaries` `jobs` at a time with `test_args` and `envs`; returns 0 when every one
/// passed, else 101 (as cargo test).
pub fn run(
    mut binaries: Vec<TestBinary>,
    test_args: &[String],
    envs: &[(String, String)],
    jobs: usize,
) -> i32 {
    let jobs = jobs.max(1);
    let times = load_times();
    order(&mut binaries, &times);
    let out_dir = crate::target_dir().join("xtask").join("test-output");
    let _ = std::fs::create_dir_all(&out_dir);
    let total = binaries.len();
    eprintln!("xtask: running {total} test binaries, {jobs} at a time");
    let target = crate::target_dir();
    println!("xtask: machine: {}", crate::machine::state(&target));
    let mut queue = binaries.into_iter();
    let mut running: Vec<Running> = Vec::new();
    let mut free: Vec<usize> = (0..jobs).rev().collect();
    let mut failed: Vec<String> = Vec::new();
    let mut finished: Vec<(String, f64)> = Vec::new();
    let mut done = 0;
    loop {
        while let Some(slot) = free.pop() {
            let Some(binary) = queue.next() else {
                free.push(slot);
                break;
            };
            let output = out_dir.join(format!("{slot}.log"));
            let spawned = File::create(&output).and_then(|f| {
                let mut cmd = binary.command(&f)?;
                cmd.args(test_args)
                    .env(PORT_SLOT_ENV, format!("{slot}/{jobs}"));
                for (k, v) in envs {
                    cmd.env(k, v);
                }
                cmd.spawn()
            });
            match spawned {
                Ok(child) => running.push(Running {
                    binary,
                    child,
                    output,
                    started: Instant::now(),
                    slot,
                }),
                Err(e) => {
                    println!("xtask: could not run {}: {e}", binary.executable.display());
                    failed.push(binary.name);
                    done += 1;
                    free.push(slot);
                }
            }
        }
        if running.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        let mut i = 0;
        while i < running.len() {
            let r = &mut running[i];
            let status = match r.child.try_wait() {
                Ok(Some(status)) => Some(Ok(status)),
                Ok(None) if r.started.elapsed() > BINARY_TIMEOUT => {
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                    Some(Err(format!(
                        "killed after {} s (xtask's limit for one test binary)",
                        BINARY_TIMEOUT.as_secs()
                    )))
                }
                Ok(None) => None,
                Err(e) => Some(Err(format!("cannot wait for it: {e}"))),
            };
            let Some(status) = status else {
                i += 1;
                continue;
            };
            let r = running.swap_remove(i);
            done += 1;
            free.push(r.slot);
            let secs = r.started.elapsed().as_secs_f64();
            let mut text = String::new();
            if let Ok(mut f) = File::open(&r.output) {
                let _ = f.read_to_string(&mut text);
            }
            println!(
                "     Running {} ({})",
                r.binary.src_path,
                r.binary.executable.display()
            );
            print!("{text}");
            let verdict = match status {
                Ok(s) if s.success() => {
                    finished.push((r.binary.name.clone(), secs));
                    "ok".to_string()
                }
                Ok(s) => {
                    failed.push(r.binary.name.clone());
                    format!("FAILED ({s})")
                }
                Err(why) => {
                    failed.push(r.binary.name.clone());
                    format!("FAILED ({why})")
                }
            };
            println!(
                "xtask: [{done}/{total}] {} {verdict} in {secs:.1} s",
                r.binary.name
            );
            if !verdict.starts_with("ok") {
                println!("xtask: machine: {}", crate::machine::state(&target));
            }
        }
    }
    save_times(&finished);
    if failed.is_empty() {
        0
    } else {
        println!("xtask: {} test binaries failed:", failed.len());
        for name in &failed {
            println!("xtask:   {name}");
        }
        101
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_LINE: &str = r#"{"reason":"compiler-artifact","package_id":"path+file:///work/main/proxy#etcd-cache-proxy@0.1.0","manifest_path":"/work/main/proxy/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"auth","src_path":"/work/main/proxy/tests/auth.rs","edition":"2021","doc":false,"doctest":false,"test":true},"profile":{"opt_level":"0","debuginfo":2,"debug_assertions":true,"overflow_checks":true,"test":true},"features":[],"filenames":["/work/main/target/debug/deps/auth-1"],"executable":"/work/main/target/debug/deps/auth-1","fresh":true}"#;

    #[test]
    fn a_test_artifact_is_a_binary_to_run() {
        let b = parse_artifact(TEST_LINE).unwrap();
        assert_eq!(b.name, "etcd-cache-proxy test auth");
        assert_eq!(b.package, "etcd-cache-proxy");
        assert_eq!(b.src_path, "/work/main/proxy/tests/auth.rs");
        assert_eq!(
            b.executable,
            PathBuf::from("/work/main/target/debug/deps/auth-1")
        );
        assert_eq!(b.manifest_dir, PathBuf::from("/work/main/proxy"));
    }

    #[test]
    fn other_artifacts_are_not() {
        // The binary built for CARGO_BIN_EXE (not a test), a library, a message.
        let bin = TEST_LINE.replace(
            "\"overflow_checks\":true,\"test\":true",
            "\"overflow_checks\":true,\"test\":false",
        );
        assert!(parse_artifact(&bin).is_none());
        let lib = TEST_LINE.replace(
            "\"executable\":\"/work/main/target/debug/deps/auth-1\"",
            "\"executable\":null",
        );
        assert!(parse_artifact(&lib).is_none());
        assert!(parse_artifact(r#"{"reason":"build-finished","success":true}"#).is_none());
    }

    #[test]
    fn escapes_and_older_package_ids() {
        let line = TEST_LINE
            .replace("/work/main/proxy/tests/auth.rs", r#"/work/a \"b\"/auth.rs"#)
            .replace(
                "path+file:///work/main/proxy#etcd-cache-proxy@0.1.0",
                "path+file:///work/main/proxy#0.1.0",
            );
        let b = parse_artifact(&line).unwrap();
        assert_eq!(b.src_path, r#"/work/a "b"/auth.rs"#);
        assert_eq!(b.package, "proxy");
    }

    #[test]
    fn the_longest_start_first_and_new_ones_before_them() {
        let bin = |n: &str| TestBinary {
            name: n.into(),
            package: String::new(),
            src_path: String::new(),
            executable: PathBuf::new(),
            manifest_dir: PathBuf::new(),
        };
        let mut v = vec![bin("short"), bin("new1"), bin("long"), bin("new2")];
        let times = HashMap::from([("short".to_string(), 1.0), ("long".to_string(), 60.0)]);
        order(&mut v, &times);
        let names: Vec<&str> = v.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["new1", "new2", "long", "short"]);
    }

    #[test]
    fn default_jobs_are_bounded() {
        let j = default_jobs();
        assert!((2..=4).contains(&j), "{j}");
    }
}
