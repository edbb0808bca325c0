//! `cargo xtask kubernetes`: a real Kubernetes control plane (kube-apiserver and kubectl of the
//! k8s.io/kubernetes release `proxy/tests/kubernetes/go.mod` pins) through etcd-cache-proxy and
//! directly on etcd, compared, by `proxy/tests/kubernetes/run.sh` (see its README.md).

use std::env;
use std::process::Command;

use crate::{etcd_dir, root, run, target_dir};

pub(crate) const HELP: &str = "\
cargo xtask kubernetes [--etcd 3.6|3.7] [--no-build] [--integration] [options]
        A real Kubernetes control plane through etcd-cache-proxy and directly on etcd,
        compared: builds the debug proxy and (cached, target/kubernetes-go/bin) kube-apiserver
        and kubectl v1.37.2 from the Go module proxy (proxy/tests/kubernetes/build.sh), then
        proxy/tests/kubernetes/run.sh starts etcd (target/etcd/<version>, default 3.6; see
        etcd-bins), the proxy (or not) and kube-apiserver (compacting every 10 s, its watch
        cache checked against etcd every 20 s), and drives ConfigMap creates, replaces and
        deletes from two writers with kubectl while three watchers (a watch, one from a past
        resource version, a WatchList) record the events and chunked lists read the state.
        Prints a table per target (watch events, gaps, lists, consistent-read fallbacks,
        consistency checks, etcd's watchers and CPU per write); exits 1 on a failed check or
        a difference between the two.
        run.sh's options, passed on: --no-watch-cache (kube-apiserver without its watch
        cache); --kcm (kube-controller-manager too, and a Deployment it turns into Pods);
        --scheduler (kube-scheduler too); --apiservers N (N kube-apiservers on one etcd or
        proxy); --fault proxy-kill|etcd-restart (repeatable: the Nth after round N);
        --compaction-interval DUR; --check-period DUR; --proxy-prefix P; --objects N (the
        workload's ConfigMaps and Secrets per round and writer, default 100); --value-bytes B
        (a pad of B bytes in each ConfigMap, default 0); --target
        proxy|direct|both; --out DIR.
        --no-build: use the binaries already built.
        --integration: instead, Kubernetes' own integration tests (test/integration/apiserver's
        list, pagination and watch-cache tests, and test/integration/apiserver/apply) through
        the proxy and directly (proxy/tests/kubernetes/integration.sh; its options: --package
        apiserver|apply|all, --run REGEX, --target, --out).
";

/// `cargo xtask kubernetes [--etcd V] [--no-build] [--integration] [run.sh's or integration.sh's options]`.
pub fn command(args: &[String]) -> i32 {
    let mut etcd = "3.6".to_string();
    let mut build = true;
    let mut script = "proxy/tests/kubernetes/run.sh";
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
            "--integration" => script = "proxy/tests/kubernetes/integration.sh",
            // run.sh (integration.sh) checks its own options (exit 2 and its usage on a bad one).
            _ => flags.push(a.clone()),
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
    cmd.current_dir(root()).arg(script).args(["--etcd", &etcd]);
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
