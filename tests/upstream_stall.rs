//! A process holding a cache is stopped (SIGSTOP) for 3 s while 64 writers put one-byte
//! values under its prefix: when it continues, thousands of small watch responses wait
//! on its connection to etcd at once. With `Client::connect`'s HTTP/2 windows, h2's
//! small-frame guard closes that connection (GOAWAY `too_many_data_frames`), and every
//! call the process has in flight on the client fails with it; with
//! [`EtcdChannel`](etcd_cache::EtcdChannel)'s windows (what `CacheBuilder::connect`
//! uses) it stays up.
//!
//! The process is this test binary itself, run again as a child in the mode that
//! [`CHILD_ENV`] names: it holds the cache and an etcd-client caller on the same client,
//! and answers the parent's questions on stdin/stdout.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_cache::{Cache, CacheBuilder, EtcdChannel};
use etcd_client::{Client, GetOptions};
use testkit::{EtcdOptions, EtcdServer};

/// Set in the child's environment to `<mode> <endpoint>`.
const CHILD_ENV: &str = "ETCD_CACHE_STALL_CHILD";
/// The stall (the scenario, not a wait).
const STALL: Duration = Duration::from_secs(3);
/// The stall of the demonstration with hyper's windows: long enough for the ~14,000 puts
/// its budget takes on this 2-core machine (the issue saw them in 2-3 s with a release
/// build on a quieter one).
const DEMO_STALL: Duration = Duration::from_secs(8);
/// How long the child may take to catch up after a stall.
const CATCH_UP: Duration = Duration::from_secs(60);

/// How the child connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `CacheBuilder::connect`: the cache's own client, with `EtcdChannel`'s windows; the
    /// caller in flight has a client of its own.
    Connect,
    /// A client of the application's own, connected with `EtcdChannel`, shared by the
    /// cache and the caller in flight.
    Shared,
    /// The same with `Client::connect` (hyper's windows): the connection is closed.
    Default,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Connect => "connect",
            Mode::Shared => "shared",
            Mode::Default => "default",
        }
    }

    fn parse(s: &str) -> Mode {
        match s {
            "connect" => Mode::Connect,
            "shared" => Mode::Shared,
            "default" => Mode::Default,
            other => panic!("no child mode {other}"),
        }
    }
}

/// The child: a cache on `/app/` and a caller that reads through the same client every
/// few milliseconds (its failures counted, not fatal), answering the parent's lines:
/// `WAIT <revision>` (prints `CHILD AT` once the cache has it), `REPORT` (prints
/// `CHILD REPORT connects=<n> calls=<n> failures=<n> guard=<bool>`).
#[test]
fn stall_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (mode, endpoint) = spec.split_once(' ').expect("<mode> <endpoint>");
    let mode = Mode::parse(mode);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(child(mode, endpoint.to_string()));
}

async fn child(mode: Mode, endpoint: String) {
    let (cache, caller) = match mode {
        Mode::Connect => {
            let builder = CacheBuilder::connect([endpoint.as_str()], None)
                .await
                .unwrap();
            let cache = builder.prefix("/app/").build().await.unwrap();
            (
                cache,
                Client::connect([endpoint.as_str()], None).await.unwrap(),
            )
        }
        Mode::Shared | Mode::Default => {
            let client = if mode == Mode::Shared {
                Client::connect_with_balanced_channel([endpoint.as_str()], None, EtcdChannel::new())
                    .await
                    .unwrap()
            } else {
                Client::connect([endpoint.as_str()], None).await.unwrap()
            };
            let cache = Cache::builder(client.clone())
                .prefix("/app/")
                .build()
                .await
                .unwrap();
            (cache, client)
        }
    };
    cache.wait_ready().await.unwrap();
    // Whether any status of the cache blamed h2's guard.
    let guard = Arc::new(AtomicBool::new(false));
    {
        let (guard, mut statuses) = (guard.clone(), cache.status_stream());
        tokio::spawn(async move {
            while let Some(s) = futures::StreamExt::next(&mut statuses).await {
                if format!("{s:?}").contains("too_many_data_frames") {
                    guard.store(true, Ordering::Relaxed);
                }
            }
        });
    }
    let (calls, failures) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    {
        let (mut caller, calls, failures) = (caller.clone(), calls.clone(), failures.clone());
        tokio::spawn(async move {
            loop {
                let r = caller
                    .get(
                        "/app/",
                        Some(GetOptions::new().with_prefix().with_count_only()),
                    )
                    .await;
                match r {
                    Ok(_) => calls.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        eprintln!("CHILD call failed: {e}");
                        failures.fetch_add(1, Ordering::Relaxed)
                    }
                };
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }
    println!("CHILD READY");
    let mut lines = BufReader::new(std::io::stdin()).lines();
    while let Some(Ok(line)) = tokio::task::block_in_place(|| lines.next()) {
        match line.split_whitespace().collect::<Vec<_>>()[..] {
            ["WAIT", rev] => {
                let rev: i64 = rev.parse().unwrap();
                tokio::time::timeout(CATCH_UP, cache.wait_for_revision(rev))
                    .await
                    .expect("the cache caught up in time")
                    .unwrap();
                println!("CHILD AT {rev}");
            }
            ["REPORT"] => println!(
                "CHILD REPORT connects={} calls={} failures={} guard={}",
                cache.stats().connects,
                calls.load(Ordering::Relaxed),
                failures.load(Ordering::Relaxed),
                guard.load(Ordering::Relaxed)
            ),
            _ => panic!("unknown line {line}"),
        }
    }
}

/// The parent's handle on a child.
struct Holder {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Holder {
    fn start(mode: Mode, endpoint: &str) -> Holder {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "stall_child",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_ENV, format!("{} {endpoint}", mode.name()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
        let mut h = Holder {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        };
        h.line("CHILD READY");
        h
    }

    /// The child's next line that has `prefix`, from there on.
    fn line(&mut self, prefix: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "the child ended before {prefix}"
            );
            // libtest's own "test stall_child ... " may start the child's first line.
            if let Some(at) = line.find(prefix) {
                return line[at..].trim().to_string();
            }
        }
    }

    fn ask(&mut self, question: &str, answer: &str) -> String {
        writeln!(self.stdin, "{question}").unwrap();
        self.line(answer)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `key=value` of a report line.
fn field(report: &str, key: &str) -> String {
    report
        .split_whitespace()
        .find_map(|f| f.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {report}"))
        .to_string()
}

/// `rounds` stalls of a child in `mode`; the child's report after each.
async fn stalls(mode: Mode, rounds: usize, stall: Duration) -> Vec<String> {
    let etcd = testkit::blocking(|| EtcdServer::start_with(EtcdOptions::default())).await;
    let direct = testkit::client(&[etcd.endpoint()]).await;
    let mut holder = {
        let endpoint = etcd.endpoint();
        testkit::blocking(move || Holder::start(mode, &endpoint)).await
    };
    let pid = holder.child.id();
    let mut reports = Vec::new();
    for round in 0..rounds {
        let r = testkit::small_puts_while_stopped(&direct, &["/app/"], pid, stall).await;
        let (report, holder_back) = testkit::blocking(move || {
            holder.ask(&format!("WAIT {}", r.last_revision), "CHILD AT");
            let report = holder.ask("REPORT", "CHILD REPORT");
            (report, holder)
        })
        .await;
        holder = holder_back;
        println!(
            "{} round {round}: {} puts in the stall; {report}",
            mode.name(),
            r.puts
        );
        reports.push(report);
    }
    reports
}

/// Three rounds each, for the cache's own client (`CacheBuilder::connect`) and for an
/// application's client connected with `EtcdChannel` and shared with a caller: the cache
/// connects once, and every call the caller made across the stalls succeeded. In a
/// `--full-matrix` run the stalls last as long as the demonstration's below, under which
/// hyper's windows lose the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_under_small_events_keeps_the_connection_to_etcd() {
    let stall = if testkit::full_matrix() {
        DEMO_STALL
    } else {
        STALL
    };
    for mode in [Mode::Connect, Mode::Shared] {
        for report in stalls(mode, 3, stall).await {
            assert_eq!(field(&report, "connects"), "1", "{mode:?}: {report}");
            assert_eq!(field(&report, "failures"), "0", "{mode:?}: {report}");
            assert_eq!(field(&report, "guard"), "false", "{mode:?}: {report}");
            assert_ne!(field(&report, "calls"), "0", "{mode:?}: {report}");
        }
    }
}

/// What the windows are for: with `Client::connect`'s (hyper's 2 MiB per stream, 5 MiB
/// per connection, so a budget of 2.5 MiB), a stall with enough small events unread
/// makes the client's own h2 close the connection; the cache reconnects and names the
/// cause. Ignored: whether a round puts enough events in its stall (about 14,000) depends
/// on the machine. `cargo test --test upstream_stall -- --ignored --nocapture`.
#[ignore = "needs ~14,000 puts in the stall; run with --ignored to see the guard fire"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hypers_default_windows_lose_the_connection_in_a_stall() {
    let reports = stalls(Mode::Default, 3, DEMO_STALL).await;
    assert!(
        reports.iter().any(|r| field(r, "guard") == "true"),
        "the guard never fired: {reports:?}"
    );
}
