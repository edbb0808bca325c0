//! Every `etcdctl endpoint` subcommand (`status`, `health`, `hashkv`), with etcdctl 3.4
//! (Debian's) to 3.7 and the endpoint given with and without its scheme, run against etcd
//! and through the proxy in front of the same etcd: the same exit code, and the same
//! answer where it can be compared (issue 42: etcdctl 3.4 sends an endpoint given with a
//! scheme as the HTTP/2 `:authority` of `status` and `hashkv`, and h2 refused it). Over
//! TLS too (`https://` endpoints). Go's gRPC client with such an `:authority` is the
//! `authority` mode of `tests/go`.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::{go_program, EtcdOptions, EtcdServer, Proxy};
use testkit::etcd_versions::etcd_dir;
use testkit::{EtcdVersion, TestPki};

/// The `endpoint` subcommands.
const COMMANDS: [&str; 3] = ["status", "health", "hashkv"];

/// Every etcdctl found: Debian's 3.4 (`/usr/bin/etcdctl`, else `etcdctl` on PATH) and the
/// Go-built ones of `cargo xtask etcd-bins`; a missing one is said and skipped.
fn etcdctls() -> Vec<(EtcdVersion, PathBuf)> {
    let mut found = Vec::new();
    for v in EtcdVersion::ALL {
        let bin = if v.is_go_built() {
            etcd_dir().join(v.name()).join("etcdctl")
        } else if Path::new("/usr/bin/etcdctl").is_file() {
            PathBuf::from("/usr/bin/etcdctl")
        } else {
            PathBuf::from("etcdctl")
        };
        let version = Command::new(&bin)
            .arg("version")
            .env("ETCDCTL_API", "3")
            .output();
        match version {
            Ok(out) if String::from_utf8_lossy(&out.stdout).contains(v.name()) => {
                found.push((v, bin))
            }
            _ => eprintln!(
                "SKIP etcdctl {}: {} is not it (apt-get install etcd-client; cargo xtask etcd-bins)",
                v.name(),
                bin.display()
            ),
        }
    }
    found
}

/// One run of etcdctl: its exit code and what it printed, etcdctl's own log lines left out.
struct Ran {
    code: i32,
    out: String,
}

fn etcdctl(bin: &Path, endpoint: &str, cacert: Option<&Path>, args: &[&str]) -> Ran {
    let mut cmd = Command::new(bin);
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .args(["--dial-timeout=5s", "--command-timeout=10s"]);
    if let Some(ca) = cacert {
        cmd.arg(format!("--cacert={}", ca.display()));
    }
    let out = cmd.args(args).output().expect("running etcdctl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ran {
        code: out.status.code().unwrap_or(-1),
        out: text
            .lines()
            .filter(|l| !l.starts_with("{\"level\":"))
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// Plain output with what differs between endpoints and runs left out: the endpoint, a
/// duration, every number (ids, indexes; the JSON runs compare the numbers that count).
fn plain(s: &str, endpoint: &str) -> String {
    let s = s.replace(endpoint, "ENDPOINT");
    let mut out = String::new();
    for line in s.lines() {
        let line = match line.find("took = ") {
            Some(at) => &line[..at],
            None => line,
        };
        let mut digits = false;
        for c in line.chars() {
            if c.is_ascii_digit() {
                if !digits {
                    out.push('N');
                }
                digits = true;
            } else {
                digits = false;
                out.push(c);
            }
        }
        out.push('\n');
    }
    out
}

/// The JSON answer: the set of its field paths and the values both sides must share
/// (version, revision, hash, compact revision, health).
fn json(s: &str) -> Option<(BTreeSet<String>, Vec<String>)> {
    let line = s.lines().find(|l| l.starts_with('['))?;
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let mut paths = BTreeSet::new();
    fn walk(v: &serde_json::Value, at: String, paths: &mut BTreeSet<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    walk(v, format!("{at}.{k}"), paths);
                }
            }
            serde_json::Value::Array(a) => {
                for v in a {
                    walk(v, format!("{at}[]"), paths);
                }
            }
            _ => {
                paths.insert(at);
            }
        }
    }
    walk(&value, String::new(), &mut paths);
    let kept = [
        "/0/Status/version",
        "/0/Status/header/revision",
        "/0/HashKV/hash",
        "/0/HashKV/compact_revision",
        "/0/health",
    ]
    .iter()
    .filter_map(|p| value.pointer(p).map(|v| format!("{p}={v}")))
    .collect();
    Some((paths, kept))
}

/// Runs every subcommand with every etcdctl and both endpoint forms on both sides;
/// returns what differed.
fn differences(etcd: &str, proxy: &str, cacert: Option<&Path>) -> Vec<String> {
    let bare = |url: &str| url.split_once("://").map_or(url, |p| p.1).to_string();
    let mut differ = Vec::new();
    for (version, bin) in etcdctls() {
        for (direct, via) in [
            (etcd.to_string(), proxy.to_string()),
            (bare(etcd), bare(proxy)),
        ] {
            for command in COMMANDS {
                for json_out in [false, true] {
                    let mut args = vec!["endpoint", command];
                    if json_out {
                        args.extend(["-w", "json"]);
                    }
                    let d = etcdctl(&bin, &direct, cacert, &args);
                    let v = etcdctl(&bin, &via, cacert, &args);
                    let what = format!(
                        "etcdctl {} --endpoints={via} {}",
                        version.name(),
                        args.join(" ")
                    );
                    if d.code != 0 {
                        differ.push(format!(
                            "{what}: etcd itself answers [exit {}] {}",
                            d.code, d.out
                        ));
                        continue;
                    }
                    let same = if json_out {
                        json(&d.out).is_some() && json(&d.out) == json(&v.out)
                    } else {
                        plain(&d.out, &direct) == plain(&v.out, &via)
                    };
                    if v.code != d.code || !same {
                        differ.push(format!(
                            "{what}: through the proxy [exit {}] {}\n  etcd [exit {}] {}",
                            v.code, v.out, d.code, d.out
                        ));
                    }
                }
            }
        }
    }
    differ
}

#[test]
fn every_endpoint_subcommand_answers_through_the_proxy_as_etcd_answers() {
    let etcd = EtcdServer::start_with(EtcdOptions::default());
    let proxy = Proxy::start(&etcd.endpoint(), &[]);
    let differ = differences(&etcd.endpoint(), &proxy.endpoint(), None);
    assert!(
        differ.is_empty(),
        "{} differences:\n{}\nproxy log:\n{}",
        differ.len(),
        differ.join("\n"),
        proxy.log_tail()
    );
}

#[test]
fn every_endpoint_subcommand_answers_over_tls() {
    let pki = TestPki::new();
    let tls = pki.server_tls(false);
    let ca = pki.dir().join("ca.pem");
    let etcd = EtcdServer::start_with(EtcdOptions::default().tls(tls.clone()));
    let (cert, key, ca_arg) = (
        tls.cert_file.display().to_string(),
        tls.key_file.display().to_string(),
        ca.display().to_string(),
    );
    let proxy = Proxy::start(
        &etcd.endpoint(),
        &[
            "--cacert",
            &ca_arg,
            "--cert-file",
            &cert,
            "--key-file",
            &key,
        ],
    );
    let https = proxy.endpoint().replacen("http://", "https://", 1);
    let differ = differences(&etcd.endpoint(), &https, Some(&ca));
    assert!(
        differ.is_empty(),
        "{} differences:\n{}\nproxy log:\n{}",
        differ.len(),
        differ.join("\n"),
        proxy.log_tail()
    );
}

/// Go's gRPC client (grpc-go 1.83 under clientv3 3.6) sending `:authority` as clientv3
/// 3.4 did (`grpc.WithAuthority("http://host:port")`): Status, HashKV and Range answer
/// through the proxy as from etcd.
#[test]
fn a_go_client_with_a_schemed_authority_is_answered() {
    let Some(bin) = go_program() else { return };
    let etcd = EtcdServer::start_with(EtcdOptions::default());
    let proxy = Proxy::start(&etcd.endpoint(), &[]);
    let out = Command::new(bin)
        .args([
            "-proxy",
            &proxy.endpoint(),
            "-etcd",
            &etcd.endpoint(),
            "authority",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("OK authority"),
        "gotest authority failed:\n{stdout}{}\nproxy log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        proxy.log_tail()
    );
}
