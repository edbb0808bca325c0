//! etcdctl (Debian's 3.4.23, `ETCDCTL_API=3`) through etcd-cache-proxy against etcdctl
//! on etcd directly: two etcd servers get the same commands, one through the proxy, and
//! every output must be the same once what must differ (cluster and member ids, lease
//! ids, endpoints) is normalized.

mod support;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{EtcdOptions, EtcdServer, Proxy};

/// `etcdctl` on PATH, or `$ETCDCTL_BIN`.
fn etcdctl() -> Option<String> {
    if let Ok(bin) = std::env::var("ETCDCTL_BIN") {
        return Some(bin);
    }
    let found = Command::new("etcdctl")
        .arg("version")
        .env("ETCDCTL_API", "3")
        .output()
        .is_ok_and(|o| o.status.success());
    found.then(|| "etcdctl".to_string())
}

struct Side {
    endpoint: String,
    /// The etcdctl binary.
    bin: String,
}

impl Side {
    /// Runs etcdctl; stdout and stderr together, with the exit code.
    fn run(&self, args: &[&str], stdin: Option<&str>) -> String {
        let mut child = Command::new(&self.bin)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        format!(
            "{}{}[exit {}]",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            out.status.code().unwrap_or(-1)
        )
    }

    /// Starts `etcdctl watch <args>` (`-i` among them: interactive, commands on stdin).
    fn start_watch(&self, args: &[&str]) -> Watching {
        let mut child = Command::new(&self.bin)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint))
            .arg("watch")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let collect = |mut from: Box<dyn Read + Send>| {
            let text = Arc::new(Mutex::new(String::new()));
            let into = text.clone();
            let reader = std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = from.read(&mut buf) {
                    into.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
            (text, reader)
        };
        let (stdout, out_reader) = collect(Box::new(child.stdout.take().unwrap()));
        let (stderr, err_reader) = collect(Box::new(child.stderr.take().unwrap()));
        Watching {
            child,
            stdout,
            stderr,
            readers: vec![out_reader, err_reader],
        }
    }

    /// What `etcdctl watch <args>` prints for a replay: everything it printed once it has
    /// printed something and then nothing more for [`SETTLED`] (etcd sends a replay in one
    /// response, so a pause inside it is not expected), within [`WATCH_LIMIT`].
    fn watch(&self, args: &[&str]) -> String {
        let mut w = self.start_watch(args);
        let mut last = (String::new(), std::time::Instant::now());
        w.wait_for(|out| {
            if out != last.0 {
                last = (out.to_string(), std::time::Instant::now());
            }
            !out.is_empty() && last.1.elapsed() >= SETTLED
        });
        w.stop()
    }
}

/// How long a replay's output must stay the same to count as complete.
const SETTLED: Duration = Duration::from_millis(700);

/// The most an etcdctl watch may take to print what a test waits for (a failure bound,
/// not a wait: the tests stop as soon as it is printed).
const WATCH_LIMIT: Duration = Duration::from_secs(30);

/// A running `etcdctl watch`, its output collected as it comes.
struct Watching {
    child: std::process::Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    /// The threads copying stdout and stderr; they end at EOF, when etcdctl is gone.
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Watching {
    /// Waits until `done(stdout so far)` holds; panics with the output after
    /// [`WATCH_LIMIT`].
    fn wait_for(&mut self, mut done: impl FnMut(&str) -> bool) {
        let deadline = std::time::Instant::now() + WATCH_LIMIT;
        loop {
            let out = self.stdout.lock().unwrap().clone();
            if done(&out) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "etcdctl watch: not printed within {WATCH_LIMIT:?}; stdout:\n{out}\nstderr:\n{}",
                self.stderr.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills etcdctl; what it printed, stdout then stderr.
    fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for reader in self.readers.drain(..) {
            reader.join().unwrap();
        }
        let out = self.stdout.lock().unwrap().clone();
        let err = self.stderr.lock().unwrap().clone();
        format!("{out}{err}")
    }
}

/// Replaces the values that differ between two clusters and between two endpoints.
fn normalize(s: &str, endpoint: &str) -> String {
    let s = if endpoint.is_empty() {
        s.to_string()
    } else {
        s.replace(endpoint, "ENDPOINT")
    };
    let mut out = String::new();
    for line in s.lines() {
        // etcdctl's own client logs (timestamps, client ids) are not the answer.
        if line.starts_with("{\"level\":") {
            continue;
        }
        let mut l = line.to_string();
        for field in ["cluster_id", "member_id", "ID"] {
            l = replace_json_number(&l, &format!("\"{field}\":"));
        }
        for field in ["ClusterID", "MemberID"] {
            l = replace_json_number(&l, &format!("\"{field}\" : "));
        }
        // "lease 694d7a9f5ad80c05 granted ...", "lease 694d... keepalived ..."
        if let Some(rest) = l.strip_prefix("lease ") {
            if let Some((_, tail)) = rest.split_once(' ') {
                l = format!("lease LEASE {tail}");
            }
        }
        // "... took = 2.566488ms": a duration.
        if let Some(at) = l.find("took = ") {
            l.truncate(at + "took = ".len());
            l.push('T');
        }
        out.push_str(&l);
        out.push('\n');
    }
    out
}

/// Replaces the number after each `key` with `N`.
fn replace_json_number(line: &str, key: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find(key) {
        out.push_str(&rest[..at + key.len()]);
        rest = &rest[at + key.len()..];
        let end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        out.push('N');
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[test]
fn etcdctl_through_the_proxy_prints_what_etcd_prints() {
    if etcdctl().is_none() {
        eprintln!("SKIP: etcdctl not found (apt-get install etcd-client)");
        return;
    }
    let a = EtcdServer::start_with(EtcdOptions::default());
    let b = EtcdServer::start_with(EtcdOptions::default());
    let proxy = Proxy::start(&b.endpoint(), &[]);
    let bin = etcdctl().unwrap();
    let direct = Side {
        endpoint: a.endpoint(),
        bin: bin.clone(),
    };
    let via = Side {
        endpoint: proxy.endpoint(),
        bin,
    };
    same_output(&direct, &via);
}

/// The etcdctl commands of the differential, each run on both sides.
fn same_output(direct: &Side, via: &Side) {
    let txn = "value(\"/k/1\") = \"v1\"\n\nput /k/t yes\nget /k/1\n\nput /k/t no\n\n";
    let lease_grant: &[&str] = &["lease", "grant", "100"];
    let steps: Vec<(Vec<&str>, Option<&str>)> = vec![
        (vec!["put", "/k/1", "v1"], None),
        (vec!["put", "/k/2", "v2"], None),
        (vec!["put", "/k/3", "v3"], None),
        (vec!["put", "/k/1", "v1b"], None),
        (vec!["put", "/k/1", "v1"], None),
        (vec!["put", "/other", "o"], None),
        (vec!["get", "/k/1"], None),
        (vec!["get", "/k/", "--prefix"], None),
        (vec!["get", "/k/1", "/k/3"], None),
        (vec!["get", "/k/", "--prefix", "--rev=3"], None),
        (vec!["get", "/k/", "--prefix", "--limit=2"], None),
        (
            vec![
                "get",
                "/k/",
                "--prefix",
                "--sort-by=MODIFY",
                "--order=DESCEND",
            ],
            None,
        ),
        (
            vec![
                "get",
                "/k/",
                "--prefix",
                "--sort-by=VALUE",
                "--order=ASCEND",
            ],
            None,
        ),
        (vec!["get", "/k/", "--prefix", "--sort-by=CREATE"], None),
        (
            vec![
                "get",
                "/k/",
                "--prefix",
                "--sort-by=VERSION",
                "--order=DESCEND",
            ],
            None,
        ),
        (vec!["get", "/k/", "--prefix", "--keys-only"], None),
        (
            vec!["get", "/k/", "--prefix", "--count-only", "-w", "json"],
            None,
        ),
        (vec!["get", "/k/", "--prefix", "-w", "json"], None),
        (vec!["get", "/k/1", "-w", "fields"], None),
        (vec!["get", "", "--prefix", "--keys-only"], None),
        (vec!["get", "/k/", "--from-key", "--keys-only"], None),
        (vec!["get", "/k/2", "--consistency=s"], None),
        (vec!["get", "/k/1", "--rev=100"], None),
        (vec!["txn"], Some(txn)),
        (vec!["get", "/k/t"], None),
        (vec!["del", "/k/2"], None),
        (vec!["del", "/k/", "--prefix", "--prev-kv"], None),
        (vec!["get", "", "--prefix"], None),
        (lease_grant.to_vec(), None),
        (vec!["endpoint", "health"], None),
    ];
    for (args, stdin) in &steps {
        let d = normalize(&direct.run(args, *stdin), &direct.endpoint);
        let v = normalize(&via.run(args, *stdin), &via.endpoint);
        assert_eq!(v, d, "etcdctl {}", args.join(" "));
    }
    // A lease and a keep-alive (lease ids differ between the clusters).
    for side in [direct, via] {
        let granted = side.run(&["lease", "grant", "60"], None);
        let id = granted.split_whitespace().nth(1).unwrap().to_string();
        let kept = side.run(&["lease", "keep-alive", "--once", &id], None);
        assert!(
            kept.contains(&format!("lease {id} keepalived with TTL(60)")),
            "{kept}"
        );
        let ttl = side.run(&["lease", "timetolive", &id], None);
        assert!(ttl.contains("remaining("), "{ttl}");
    }
    // Watches replay the same history, with and without prev_kv.
    for args in [
        vec!["--prefix", "/k/", "--rev=2"],
        vec!["--prefix", "/k/", "--rev=2", "--prev-kv"],
        vec!["/k/1", "--rev=1"],
        vec!["", "--prefix", "--rev=5"],
    ] {
        let d = normalize(&direct.watch(&args), "");
        let v = normalize(&via.watch(&args), "");
        assert!(!d.is_empty());
        assert_eq!(v, d, "etcdctl watch {}", args.join(" "));
    }
    // A live watch sees a put made after it started: puts until it prints one (etcdctl
    // says nothing when its watch is made, so the first puts may come before it).
    let mut live = via.start_watch(&["/live"]);
    let mut n = 0;
    live.wait_for(|out| {
        if out.is_empty() {
            n += 1;
            via.run(&["put", "/live", &format!("now-{n}")], None);
        }
        !out.is_empty() && out.ends_with('\n') && out.lines().count() >= 3
    });
    let seen = normalize(&live.stop(), "");
    let first: Vec<&str> = seen.lines().take(3).collect();
    assert_eq!(first[..2], ["PUT", "/live"], "{seen}");
    assert!(first[2].starts_with("now-"), "{seen}");
    // member list is etcd's (no --advertise-client-url); endpoint status is etcd's.
    let members = via.run(&["member", "list"], None);
    assert!(members.contains(", started, etcd0, "), "{members}");
    assert!(!members.contains(&via.endpoint), "{members}");
    // (etcdctl 3.4 sends the URL, scheme and all, as the HTTP/2 :authority here: see
    // endpoint_cmds.rs for every `endpoint` subcommand and both endpoint forms.)
    let d = direct.run(&["endpoint", "status", "-w", "json"], None);
    let v = via.run(&["endpoint", "status", "-w", "json"], None);
    let version = |s: &str| s.split("\"version\":\"").nth(1).map(|v| v[..6].to_string());
    assert_eq!(version(&v), version(&d), "{v}\n{d}");
    // Membership changes are etcd's: removing a member that is not there is refused
    // as etcd refuses it.
    let args = ["member", "remove", "1234"];
    let (d, v) = (direct.run(&args, None), via.run(&args, None));
    assert!(d.contains("member not found"), "{d}");
    assert_eq!(
        normalize(&v, &via.endpoint),
        normalize(&d, &direct.endpoint)
    );
}

/// The newest Go-built etcdctl (`cargo xtask etcd-bins`: `<etcd dir>/<version>/etcdctl`,
/// `<etcd dir>` = `$ETCD_CACHE_ETCD_DIR` or `<workspace>/target/etcd`).
fn newer_etcdctl() -> Option<(String, String)> {
    let dir = std::env::var_os("ETCD_CACHE_ETCD_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/etcd"));
    ["3.7", "3.6", "3.5"].iter().find_map(|v| {
        let bin = dir.join(v).join("etcdctl");
        bin.is_file()
            .then(|| (v.to_string(), bin.display().to_string()))
    })
}

#[test]
fn newer_etcdctl_through_the_proxy_prints_what_etcd_prints() {
    let Some((version, bin)) = newer_etcdctl() else {
        eprintln!("SKIP: no Go-built etcdctl (run `cargo xtask etcd-bins`)");
        return;
    };
    eprintln!("etcdctl {version}: {bin}");
    let interval = Duration::from_millis(500);
    let a = EtcdServer::start_with(EtcdOptions::default().progress_notify_interval(interval));
    let b = EtcdServer::start_with(EtcdOptions::default());
    let proxy = Proxy::start(&b.endpoint(), &["--progress-notify-interval", "500ms"]);
    let direct = Side {
        endpoint: a.endpoint(),
        bin: bin.clone(),
    };
    let via = Side {
        endpoint: proxy.endpoint(),
        bin,
    };
    same_output(&direct, &via);
    // --progress-notify: periodic progress notifications at the current revision.
    for side in [&direct, &via] {
        let rev = side.run(&["get", "/k/1", "-w", "json"], None);
        let rev = rev.split("\"revision\":").nth(1).unwrap();
        let rev = rev[..rev.find(|c: char| !c.is_ascii_digit()).unwrap()].to_string();
        let mut w = side.start_watch(&["--progress-notify", "/quiet"]);
        w.wait_for(|out| out.contains(&format!("progress notify: {rev}")));
        w.stop();
    }
    // Interactive `progress`: a WatchProgressRequest on the stream.
    // (`progress` before the watch is made answers nothing, so it is sent again until it
    // is answered.)
    for side in [&direct, &via] {
        let mut w = side.start_watch(&["-i"]);
        let mut stdin = w.child.stdin.take().unwrap();
        stdin.write_all(b"watch /other\n").unwrap();
        let mut asked: Option<std::time::Instant> = None;
        w.wait_for(|out| {
            if asked.is_none_or(|t| t.elapsed() >= Duration::from_millis(300)) {
                asked = Some(std::time::Instant::now());
                stdin.write_all(b"progress\n").unwrap();
            }
            out.contains("progress notify: ")
        });
        w.stop();
    }
}
