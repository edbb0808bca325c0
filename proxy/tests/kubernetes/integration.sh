#!/usr/bin/env bash
# Kubernetes' own integration tests (k8s.io/kubernetes/test/integration) on etcd-cache-proxy in
# front of etcd and directly on etcd, side by side. See README.md.
#
#   integration.sh [--etcd 3.6|3.7] [--target proxy|direct|both] [--package apiserver|apply|all]
#                  [--run REGEX] [--out DIR] [--no-build]
#
# The tests start their own kube-apiserver in-process on the etcd KUBE_INTEGRATION_ETCD_URL names:
# here a fresh etcd (target/etcd/<v>/etcd, or KUBERNETES_ETCD_BIN), or etcd-cache-proxy in front
# of it with --prefix "" (each test stores under its own random prefix, so the proxy caches the
# whole keyspace). A test that starts etcds of its own (TestWatchCacheUpdatedByEtcd) finds that
# etcd binary on PATH; those do not go through the proxy. Packages: apiserver (lists, pagination,
# the watch cache; --run picks the tests, default below), apply (server-side apply, all of it).
# Prints per test PASS/FAIL/SKIP for each target; exits 1 when a test that passes directly does
# not pass through the proxy, 2 on a usage, build or start-up error.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$HERE/common.sh"
etcd_v=3.6
targets=(direct proxy)
packages=(apiserver apply)
run_apiserver='^(TestListOptions|TestListResourceVersion0|TestAPIListChunking|TestAPIListChunkingWithLabelSelector|TestNameInFieldSelector|TestMetadataClient|TestWatchTransformCaching|TestPatchConflicts|TestSharded.*|TestWatchCacheUpdatedByEtcd)$'
run=""
out=""
build=1
usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --etcd) shift; etcd_v="${1:-}" ;;
    --target) shift; case "${1:-}" in proxy|direct) targets=("$1") ;; both) targets=(direct proxy) ;; *) usage ;; esac ;;
    --package) shift; case "${1:-}" in apiserver|apply) packages=("$1") ;; all) packages=(apiserver apply) ;; *) usage ;; esac ;;
    --run) shift; run="${1:-}" ;;
    --out) shift; out="${1:-}" ;;
    --no-build) build=0 ;;
    -h|--help) usage ;;
    *) echo "integration.sh: unknown argument $1" >&2; usage ;;
  esac
  shift
done
ETCD_BIN="${KUBERNETES_ETCD_BIN:-$ROOT/target/etcd/$etcd_v/etcd}"
[ -x "$ETCD_BIN" ] || { echo "integration.sh: no $ETCD_BIN (cargo xtask etcd-bins $etcd_v)" >&2; exit 2; }
[ -x "$PROXY_BIN" ] || { echo "integration.sh: no $PROXY_BIN (cargo build -p etcd-cache-proxy)" >&2; exit 2; }
if [ "$build" = 1 ]; then "$HERE/build.sh" --integration || exit 2; fi
for p in "${packages[@]}"; do
  [ -x "$KDIR/bin/integration-$p.test" ] || { echo "integration.sh: no $KDIR/bin/integration-$p.test (build.sh --integration)" >&2; exit 2; }
done
out="${out:-$KDIR/integration/etcd-$etcd_v}"
mkdir -p "$out"

# run_target TARGET DIR: etcd (and the proxy), each package's tests, their logs in DIR.
run_target() (
  local target="$1" dir="$2"
  rm -rf "$dir"; mkdir -p "$dir"
  local tmp; tmp="$(mktemp -d "${TMPDIR:-/tmp}/k8s-integration-$target.XXXXXX")"
  local pids=()
  cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
  }
  trap cleanup EXIT
  local ec ep em url
  ec=$(free_port); ep=$(free_port); em=$(free_port)
  spawn_etcd "$tmp/etcd" "$ec" "$ep" "$em" "$dir/etcd.log"
  pids+=($!)
  wait_for "etcd" 30 curl -sf "http://127.0.0.1:$em/health"
  url="http://127.0.0.1:$ec"
  local pm=""
  if [ "$target" = proxy ]; then
    local pp; pp=$(free_port); pm=$(free_port)
    RUST_LOG="${PROXY_LOG:-info}" "$PROXY_BIN" --endpoints "$url" --listen-addr "127.0.0.1:$pp" \
      --prefix "" --metrics-addr "127.0.0.1:$pm" >"$dir/proxy.log" 2>&1 &
    pids+=($!)
    wait_for "etcd-cache-proxy" 30 curl -sf "http://127.0.0.1:$pm/metrics"
    url="http://127.0.0.1:$pp"
  fi
  local p r start
  for p in "${packages[@]}"; do
    r="$run"
    [ -n "$r" ] || [ "$p" != apiserver ] || r="$run_apiserver"
    start=$SECONDS
    # The package's TestMain uses the etcd at KUBE_INTEGRATION_ETCD_URL when it answers.
    (cd "$tmp" && PATH="$(dirname "$ETCD_BIN"):$PATH" KUBE_INTEGRATION_ETCD_URL="$url" \
      "$KDIR/bin/integration-$p.test" -test.v -test.timeout 40m ${r:+-test.run "$r"} >"$dir/$p.log" 2>&1) || true
    echo "integration.sh: [$target] $p: $(grep -c '^--- PASS' "$dir/$p.log" || true) passed, $(grep -c '^--- FAIL' "$dir/$p.log" || true) failed, $(grep -c '^--- SKIP' "$dir/$p.log" || true) skipped in $((SECONDS - start))s"
  done
  [ -z "$pm" ] || curl -sf "http://127.0.0.1:$pm/metrics" >"$dir/proxy-metrics.txt" || true
  curl -sf "http://127.0.0.1:$em/metrics" >"$dir/etcd-metrics.txt" || true
)

for t in "${targets[@]}"; do
  run_target "$t" "$out/$t" || { echo "integration.sh: [$t] failed (logs in $out/$t)" >&2; exit 2; }
done

# The table: each top-level test's result per target.
python3 - "$out" "${targets[@]}" <<'PY'
import os, re, sys
out, targets = sys.argv[1], sys.argv[2:]
res = {t: {} for t in targets}
for t in targets:
    for f in sorted(os.listdir(os.path.join(out, t))):
        if f.endswith(".log") and f not in ("etcd.log", "proxy.log"):
            for line in open(os.path.join(out, t, f), errors="replace"):
                m = re.match(r"^--- (PASS|FAIL|SKIP): (\S+)", line)
                if m:
                    res[t][f"{f[:-4]}/{m.group(2)}"] = m.group(1)
names = sorted(set().union(*(r.keys() for r in res.values())))
w = max([len(n) for n in names] + [4])
print(f"{'test':<{w}}  " + "  ".join(f"{t:>6}" for t in targets))
worse = []
for n in names:
    row = [res[t].get(n, "-") for t in targets]
    print(f"{n:<{w}}  " + "  ".join(f"{x:>6}" for x in row))
    if "direct" in res and "proxy" in res and res["direct"].get(n) == "PASS" and res["proxy"].get(n) != "PASS":
        worse.append(n)
pm = os.path.join(out, "proxy", "proxy-metrics.txt")
if os.path.exists(pm):
    for line in open(pm):
        if line.startswith(("etcd_cache_proxy_ranges_total", "etcd_cache_proxy_watches_created_total")):
            print("proxy: " + line.strip())
print(f"integration: {len(names)} tests; " + ("ok" if not worse else f"worse through the proxy: {worse}"))
sys.exit(1 if worse else 0)
PY
