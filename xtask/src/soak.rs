//! `cargo xtask soak`: the long runs that find what one CI run finds once in a while.
//!
//! - Without `--proxy`: the crate's fault-injection soak (`tests/reliability.rs`, ignored
//!   test, `ETCD_CACHE_SOAK_SECS`), then the seeded model test's long form.
//! - With `--proxy`: the proxy's three short reliability tests (`remote_watches`: one
//!   proxy, a pair, a tier), run again and again with a new seed each time until the
//!   duration has passed or one fails, beside busy threads. One long run of one seed finds
//!   less than this: the faults CI met showed in the first seconds of a run (a watch
//!   created while the cache starts, a progress request beside a proxy restart) on a
//!   loaded machine, and such a loop found three of them within an hour.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{cargo, etcd_bins, prereqs, run, side_by_side, split_dashes, target_dir, HELP};

/// What `soak` was asked.
#[derive(Debug, PartialEq)]
struct Options {
    secs: u64,
    proxy: bool,
    busy: usize,
    filter: String,
    passthrough: Vec<String>,
}

/// The tests of the proxy leg: the three short reliability tests.
const PROXY_FILTER: &str = "remote_watches";

/// The proxy's log in a soak run unless `PROXY_LOG` says otherwise: each Watch stream's
/// progress requests and answers, which the faults found so far needed.
const PROXY_LOG: &str = "info,etcd_cache_proxy::watch=trace";

fn parse(args: &[String]) -> Result<Options, String> {
    let (opts, passthrough) = split_dashes(args);
    let mut o = Options {
        secs: 600,
        proxy: false,
        busy: 1,
        filter: PROXY_FILTER.to_string(),
        passthrough,
    };
    let mut it = opts.into_iter();
    while let Some(opt) = it.next() {
        let (name, inline) = match opt.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (opt.clone(), None),
        };
        if name == "--proxy" {
            o.proxy = true;
            continue;
        }
        let value = inline.or_else(|| it.next());
        match name.as_str() {
            "--duration" => match value.as_deref().map(|v| v.trim_end_matches('s').parse()) {
                Some(Ok(n)) if n > 0 => o.secs = n,
                _ => return Err("--duration needs a positive number of seconds".into()),
            },
            "--busy" => match value.as_deref().map(str::parse) {
                Some(Ok(n)) if n <= 64 => o.busy = n,
                _ => return Err("--busy needs a number of threads from 0 to 64".into()),
            },
            "--filter" => match value {
                Some(v) if !v.is_empty() => o.filter = v,
                _ => return Err("--filter needs a test name filter".into()),
            },
            s => return Err(format!("unknown option `{s}`")),
        }
    }
    if !o.proxy && (o.busy != 1 || o.filter != PROXY_FILTER) {
        return Err("--busy and --filter are options of the proxy leg (--proxy)".into());
    }
    Ok(o)
}

pub fn command(args: &[String]) -> i32 {
    let o = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("xtask soak: {e}\n\n{HELP}");
            return 2;
        }
    };
    if !prereqs::ensure(false) || !etcd_bins::ensure_for_env() {
        return 1;
    }
    if o.proxy {
        proxy(&o)
    } else {
        crate_soak(&o)
    }
}

/// The crate's soak, then the model test's long form.
fn crate_soak(o: &Options) -> i32 {
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
    .args(&o.passthrough)
    .env("ETCD_CACHE_SOAK_SECS", o.secs.to_string());
    let started = Instant::now();
    let mut code = run(cmd);
    if code == 0 {
        // The seeded model test's long form (20,000 seeds by default, or
        // ETCD_CACHE_MODEL_SEEDS): no etcd, the cache against a model of etcd.
        let mut model = cargo();
        model.args([
            "test",
            "--release",
            "--lib",
            "model",
            "--",
            "--ignored",
            "--nocapture",
        ]);
        code = run(model);
    }
    if code == 0 {
        println!(
            "xtask soak: passed ({} s requested, {:.0} s total)",
            o.secs,
            started.elapsed().as_secs_f64()
        );
    } else {
        println!("xtask soak: FAILED (exit code {code})");
    }
    code
}

/// Threads that spin until dropped: the load of a busy CI machine.
struct Busy {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Busy {
    fn start(n: usize) -> Busy {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                })
            })
            .collect();
        Busy { stop, threads }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The proxy leg: the short reliability tests again and again until `o.secs` have
/// passed or a run fails.
fn proxy(o: &Options) -> i32 {
    let mut build = cargo();
    build.args(["test", "-p", "etcd-cache-proxy", "--test", "reliability"]);
    let binary = match side_by_side::build(build) {
        Ok(mut b) if b.len() == 1 => b.remove(0),
        Ok(b) => {
            eprintln!(
                "xtask soak: expected one test binary, cargo built {}",
                b.len()
            );
            return 1;
        }
        Err(code) => return code,
    };
    let dir = target_dir().join("xtask").join("soak");
    let _ = std::fs::create_dir_all(&dir);
    let log = std::env::var("PROXY_LOG").unwrap_or_else(|_| PROXY_LOG.to_string());
    let _busy = Busy::start(o.busy);
    let (started, until) = (Instant::now(), Duration::from_secs(o.secs));
    let mut runs = 0u32;
    println!(
        "xtask soak: the proxy's `{}` tests for {} s beside {} busy thread(s), PROXY_LOG={log}",
        o.filter, o.secs, o.busy
    );
    while started.elapsed() < until {
        runs += 1;
        let output = dir.join(format!("run-{runs}.log"));
        let ok = match run_once(&binary, o, &log, &output) {
            Ok(ok) => ok,
            Err(e) => {
                eprintln!(
                    "xtask soak: could not run {}: {e}",
                    binary.executable.display()
                );
                return 1;
            }
        };
        if !ok {
            let text = std::fs::read_to_string(&output).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            for line in tail.iter().rev() {
                println!("{line}");
            }
            println!(
                "xtask soak: FAILED in run {runs} after {:.0} s; its output: {}",
                started.elapsed().as_secs_f64(),
                output.display()
            );
            return 1;
        }
        let _ = std::fs::remove_file(&output);
        println!(
            "xtask soak: run {runs} passed ({:.0} s so far)",
            started.elapsed().as_secs_f64()
        );
    }
    println!(
        "xtask soak: passed, {runs} runs of the proxy's `{}` tests in {:.0} s",
        o.filter,
        started.elapsed().as_secs_f64()
    );
    0
}

/// One run of the test binary, its output in `output`; whether it passed.
fn run_once(
    binary: &side_by_side::TestBinary,
    o: &Options,
    log: &str,
    output: &PathBuf,
) -> std::io::Result<bool> {
    let status = binary
        .command(&std::fs::File::create(output)?)?
        .arg(&o.filter)
        .arg("--nocapture")
        .args(&o.passthrough)
        .env("PROXY_LOG", log)
        .status()?;
    Ok(status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_proxy_leg_takes_its_options() {
        let o = parse(&args(&[
            "--proxy",
            "--duration",
            "30s",
            "--busy=2",
            "--",
            "-q",
        ]))
        .unwrap();
        assert_eq!(
            o,
            Options {
                secs: 30,
                proxy: true,
                busy: 2,
                filter: PROXY_FILTER.into(),
                passthrough: args(&["-q"]),
            }
        );
        let o = parse(&args(&["--proxy", "--filter", "tier"])).unwrap();
        assert_eq!((o.secs, o.busy, o.filter.as_str()), (600, 1, "tier"));
    }

    #[test]
    fn bad_options_are_named() {
        for (a, want) in [
            (&["--duration", "0"][..], "--duration needs"),
            (&["--proxy", "--busy", "x"], "--busy needs"),
            (&["--proxy", "--busy", "65"], "--busy needs"),
            (&["--proxy", "--filter"], "--filter needs"),
            (&["--busy", "2"], "options of the proxy leg"),
            (&["--what"], "unknown option `--what`"),
        ] {
            let e = parse(&args(a)).unwrap_err();
            assert!(e.contains(want), "{a:?}: {e}");
        }
    }
}
