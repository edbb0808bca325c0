//! `cargo xtask kubernetes`: a real Kubernetes control plane (kube-apiserver and kubectl of the
//! k8s.io/kubernetes release `proxy/tests/kubernetes/go.mod` pins) through etcd-cache-proxy and
//! directly on etcd, compared, by `proxy/tests/kubernetes/run.sh` (see its README.md).

use std::env;
use std::process::Command;

use crate::{etcd_dir, root, run, target_dir};

pub(crate) const HELP: &str = "\
cargo xtask kubernetes [--etcd 3.6|3.7] [--no-watch-cache] [--kcm]
        [--fault proxy-kill|etcd-restart] [--no-build]
        A real Kubernetes control plane through etcd-cache-proxy and directly on etcd,
        compared: builds the debug proxy and (cached, target/kubernetes-go/bin) kube-apiserver
        and kubectl v1.37.2 from the Go module proxy (proxy/tests/kubernetes/build.sh), then
        proxy/tests/kubernetes/run.sh starts etcd (target/etcd/<version>, default 3.6; see
        etcd-bins), the proxy (or not) and kube-apiserver, and drives ConfigMap creates,
        replaces and deletes from two writers with kubectl while two watchers record the
        events and chunked lists read the state. Prints a table per target (watch events,
        gaps, lists, consistent-read fallbacks, etcd's watchers); exits 1 on a failed check
        or a difference between the two. --no-watch-cache: kube-apiserver without its watch
        cache (--watch-cache=false), so kubectl's watches and lists reach the proxy itself.
        --kcm: kube-controller-manager too (built and run beside kube-apiserver).
        --fault proxy-kill: after round 1, the proxy killed with -9 and started again;
        --fault etcd-restart: etcd killed with -9 and started again on its data dir.
        --no-build: use the binaries already built.
";

/// `cargo xtask kubernetes [--etcd V] [--no-watch-cache] [--kcm] [--fault F] [--no-build]`.
pub fn command(args: &[String]) -> i32 {
    let mut etcd = "3.6".to_string();
    let mut build = true;
    let mut flags = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-h" | "--help" => {
                print!("{HELP}");
                return 0;
            }
            "--etcd" => match it.next() {
                Some(v) => etcd = v.clone(),
                None => {
                    eprintln!("xtask kubernetes: --etcd needs a version\n\n{HELP}");
                    return 2;
                }
            },
            "--no-build" => build = false,
            "--no-watch-cache" | "--kcm" => flags.push(a.clone()),
            "--fault" => match it.next().map(String::as_str) {
                Some(f @ ("proxy-kill" | "etcd-restart")) => {
                    flags.extend(["--fault".to_string(), f.to_string()]);
                }
                _ => {
                    eprintln!(
                        "xtask kubernetes: --fault needs proxy-kill or etcd-restart\n\n{HELP}"
                    );
                    return 2;
                }
            },
            other => {
                eprintln!("xtask kubernetes: unknown argument `{other}`\n\n{HELP}");
                return 2;
            }
        }
    }
    let etcd_bin = etcd_dir().join(&etcd).join("etcd");
    if !etcd_bin.exists() {
        eprintln!(
            "xtask kubernetes: no {} (run `cargo xtask etcd-bins {etcd}`)",
            etcd_bin.display()
        );
        return 2;
    }
    let proxy = target_dir().join("debug").join("etcd-cache-proxy");
    if build {
        let mut cargo = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cargo
            .current_dir(root())
            .args(["build", "-p", "etcd-cache-proxy"]);
        let code = run(cargo);
        if code != 0 {
            return code;
        }
    }
    let mut cmd = Command::new("bash");
    cmd.current_dir(root())
        .arg("proxy/tests/kubernetes/run.sh")
        .args(["--etcd", &etcd]);
    if !build {
        cmd.arg("--no-build");
    }
    cmd.args(&flags);
    // No `ETCD*` variable of ours reaches etcd (it reads `ETCD_<FLAG>` as flags).
    for (key, _) in env::vars_os() {
        if key.to_string_lossy().starts_with("ETCD") {
            cmd.env_remove(key);
        }
    }
    cmd.env("ETCD_CACHE_PROXY_BIN", proxy)
        .env("KUBERNETES_ETCD_BIN", etcd_bin)
        .env("KUBERNETES_GO_DIR", target_dir().join("kubernetes-go"));
    run(cmd)
}
