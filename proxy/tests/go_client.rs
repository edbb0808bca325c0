//! Go's clientv3 (the client most fleets run) through etcd-cache-proxy: the program in
//! `tests/go/` is built with `go build` into the target directory and run per scenario.
//! Skipped, with a message, when `go` is not installed.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use support::{go_program as program, EtcdOptions, EtcdServer, Proxy};

fn run(mode: &str, proxy: &Proxy, etcd: &EtcdServer) {
    let Some(bin) = program() else { return };
    let out = Command::new(bin)
        .args(["-proxy", &proxy.endpoint(), "-etcd", &etcd.endpoint(), mode])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains(&format!("OK {mode}")),
        "gotest {mode} failed:\n{stdout}{}\nproxy log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        proxy.log_tail()
    );
}

#[test]
fn clientv3_watches_with_every_option() {
    if program().is_none() {
        return;
    }
    let etcd = EtcdServer::start_with(EtcdOptions::default());
    // A small fragment threshold, so that the txn's response reaches the `fragment` watch
    // in parts that clientv3 reassembles.
    let proxy = Proxy::start(&etcd.endpoint(), &["--max-request-bytes", "200"]);
    run("watches", &proxy, &etcd);
}

#[test]
fn clientv3_request_progress_and_require_leader() {
    if program().is_none() {
        return;
    }
    let etcd = EtcdServer::start_with(EtcdOptions::default());
    let proxy = Proxy::start(&etcd.endpoint(), &[]);
    run("progress", &proxy, &etcd);
}

#[test]
fn clientv3_auto_sync_stays_on_the_proxy() {
    if program().is_none() {
        return;
    }
    let etcd = EtcdServer::start_with(EtcdOptions::default());
    let proxy = Proxy::start(&etcd.endpoint(), &["--advertise-client-url", "{self}"]);
    run("autosync", &proxy, &etcd);
}

#[test]
fn clientv3_watch_resumes_after_a_proxy_restart() {
    let Some(bin) = program() else { return };
    let etcd = EtcdServer::start_with(EtcdOptions::default());
    let mut proxy = Proxy::start(&etcd.endpoint(), &[]);
    let mut child = Command::new(bin)
        .args([
            "-proxy",
            &proxy.endpoint(),
            "-etcd",
            &etcd.endpoint(),
            "restart",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    let mut wait_for = |word: &str| {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                stdout.read_line(&mut line).unwrap() > 0,
                "gotest ended before {word}"
            );
            if line.trim() == word {
                return;
            }
        }
    };
    wait_for("STOP NOW");
    let status = proxy.terminate(std::time::Duration::from_secs(15));
    assert!(
        status.is_some_and(|s| s.success()),
        "graceful stop: {status:?}"
    );
    stdin.write_all(b"stopped\n").unwrap();
    // The client's writes while the proxy is down are below the new cache's window: the
    // resumed watch is served by etcd through the proxy, without a gap.
    wait_for("START NOW");
    proxy.start_again();
    stdin.write_all(b"started\n").unwrap();
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && rest.contains("OK restart"),
        "gotest restart failed:\n{rest}{}\nproxy log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        proxy.log_tail()
    );
}

/// A grpc-go client (each message in its own DATA frame) pipelines 3,000 progress
/// requests, 10,000 creates and 10,000 cancels on one Watch stream, to etcd and to the
/// proxy: the proxy answers what etcd answers, and unary calls on the same connection
/// succeed meanwhile. h2's small-frame guard once closed the whole connection here
/// (GOAWAY `ENHANCE_YOUR_CALM`, `too_many_data_frames`) with no answer sent.
#[test]
fn grpc_go_pipelined_watch_requests_keep_the_connection() {
    if program().is_none() {
        return;
    }
    let etcd = EtcdServer::start_with(EtcdOptions::default());
    let proxy = Proxy::start(&etcd.endpoint(), &["--prefix", "/app/"]);
    run("pipeline", &proxy, &etcd);
    assert!(
        !proxy.log_text().contains("too_many_data_frames"),
        "{}",
        proxy.log_tail()
    );
}
