#!/usr/bin/env bash
# A real Kubernetes control plane (kube-apiserver, driven by kubectl) on etcd-cache-proxy in
# front of etcd, and the same directly on etcd, then the two compared. See README.md.
#
#   run.sh [--etcd 3.6|3.7] [--target proxy|direct|both] [--no-watch-cache] [--kcm]
#          [--fault proxy-kill|etcd-restart] [--out DIR] [--no-build]
#
# Needs target/etcd/<v>/etcd (`cargo xtask etcd-bins`; or KUBERNETES_ETCD_BIN) and the proxy
# binary (ETCD_CACHE_PROXY_BIN, default target/debug/etcd-cache-proxy). Builds kube-apiserver and
# kubectl with build.sh (cached) unless --no-build. --no-watch-cache: kube-apiserver runs with
# --watch-cache=false, so every watch and list of kubectl's reaches the proxy (or etcd) itself.
# --kcm: kube-controller-manager runs beside it (built by build.sh --kcm).
# --fault proxy-kill: after round 1, the proxy is killed with -9 and started again on its
# port (the proxy target only); --fault etcd-restart: etcd is killed with -9 and started again
# on its data dir (both targets). The rounds after it wait for kube-apiserver's /readyz.
# Exits 1 when a check fails or the two targets differ (compare.py), 2 on a usage, build or
# start-up error.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
KDIR="${KUBERNETES_GO_DIR:-$ROOT/target/kubernetes-go}"
PROXY_BIN="${ETCD_CACHE_PROXY_BIN:-$ROOT/target/debug/etcd-cache-proxy}"
etcd_v=3.6
targets=(proxy direct)
out=""
build=1
apiserver_args=()
kcm=0
fault=""
usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --etcd) shift; etcd_v="$1" ;;
    --target) shift; case "$1" in proxy|direct) targets=("$1") ;; both) targets=(proxy direct) ;; *) usage ;; esac ;;
    --out) shift; out="$1" ;;
    --no-build) build=0 ;;
    --no-watch-cache) apiserver_args+=(--watch-cache=false) ;;
    --kcm) kcm=1 ;;
    --fault) shift; case "$1" in proxy-kill|etcd-restart) fault="$1" ;; *) usage ;; esac ;;
    -h|--help) usage ;;
    *) echo "run.sh: unknown argument $1" >&2; usage ;;
  esac
  shift
done
ETCD_BIN="${KUBERNETES_ETCD_BIN:-$ROOT/target/etcd/$etcd_v/etcd}"
[ -x "$ETCD_BIN" ] || { echo "run.sh: no $ETCD_BIN (cargo xtask etcd-bins $etcd_v)" >&2; exit 2; }
[ -x "$PROXY_BIN" ] || { echo "run.sh: no $PROXY_BIN (cargo build -p etcd-cache-proxy)" >&2; exit 2; }
if [ "$build" = 1 ]; then "$HERE/build.sh" $([ "$kcm" = 0 ] || echo --kcm) || exit 2; fi
APISERVER="$KDIR/bin/kube-apiserver"
KUBECTL="$KDIR/bin/kubectl"
for b in "$APISERVER" "$KUBECTL"; do
  [ -x "$b" ] || { echo "run.sh: no $b (run build.sh)" >&2; exit 2; }
done
KCM="$KDIR/bin/kube-controller-manager"
[ "$kcm" = 0 ] || [ -x "$KCM" ] || { echo "run.sh: no $KCM (run build.sh --kcm)" >&2; exit 2; }
out="${out:-$KDIR/runs/etcd-$etcd_v${apiserver_args[*]:+-no-watch-cache}$([ "$kcm" = 0 ] || echo -kcm)${fault:+-$fault}}"
mkdir -p "$out"

# The workload's shape (compare.py derives every expected event and list from it).
WRITERS=(a b)   # writers running at once, each on its own names
ROUNDS=3        # per round and writer: create N, replace the first UPD, delete the first DEL
N=100 UPD=60 DEL=30
NS=kt

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait_for DESCRIPTION SECONDS COMMAND...: polls COMMAND every 0.2 s.
wait_for() {
  local what="$1" secs="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { echo "run.sh: timed out waiting for $what" >&2; return 1; }
    sleep 0.2
  done
}

# configmaps WRITER ROUND FROM TO VALUE: a multi-document YAML of ConfigMaps.
configmaps() {
  local w="$1" r="$2" from="$3" to="$4" val="$5" i
  for ((i = from; i < to; i++)); do
    printf -- '---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-%s-%s-%03d\n  namespace: %s\ndata:\n  k: "%s-%s-%s-%d"\n' \
      "$w" "$r" "$i" "$NS" "$val" "$w" "$r" "$i"
  done
}

# Events in a watcher's file (both kubectl -o json -w and a raw watch print one a line).
count_events() { grep -cE '^\{"type":"(ADDED|MODIFIED|DELETED)"' "$1" 2>/dev/null || true; }

# run_target TARGET DIR: one control plane on etcd (TARGET=direct) or on the proxy, the workload,
# its records in DIR. Everything it starts is killed when it returns.
run_target() (
  local target="$1" dir="$2"
  rm -rf "$dir"; mkdir -p "$dir"
  local tmp; tmp="$(mktemp -d "${TMPDIR:-/tmp}/kubernetes-$target.XXXXXX")"
  local pids=()
  # Last started first; kube-apiserver may hang in its graceful shutdown once etcd is gone:
  # whatever is left after 10 s is killed.
  cleanup() {
    local i p deadline=$((SECONDS + 10))
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
      while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
      kill -KILL "$p" 2>/dev/null || true
      wait "$p" 2>/dev/null || true
    done
    rm -rf "$tmp"
  }
  trap cleanup EXIT
  local start=$SECONDS
  local ec ep em etcd_pid proxy_pid
  ec=$(free_port); ep=$(free_port); em=$(free_port)
  # start_etcd: on its data dir (again after a kill: the same member, the same ports).
  start_etcd() {
    "$ETCD_BIN" --name k --data-dir "$tmp/etcd" \
      --listen-client-urls "http://127.0.0.1:$ec" --advertise-client-urls "http://127.0.0.1:$ec" \
      --listen-peer-urls "http://127.0.0.1:$ep" --initial-advertise-peer-urls "http://127.0.0.1:$ep" \
      --initial-cluster "k=http://127.0.0.1:$ep" --listen-metrics-urls "http://127.0.0.1:$em" \
      >>"$dir/etcd.log" 2>&1 &
    etcd_pid=$!
    pids+=($etcd_pid)
    wait_for "etcd" 30 curl -sf "http://127.0.0.1:$em/health"
  }
  start_etcd
  local etcd_url="http://127.0.0.1:$ec" pm="" pp=""
  start_proxy() {
    RUST_LOG="${PROXY_LOG:-info}" "$PROXY_BIN" --endpoints "http://127.0.0.1:$ec" --listen-addr "127.0.0.1:$pp" \
      --prefix /registry/ --metrics-addr "127.0.0.1:$pm" >>"$dir/proxy.log" 2>&1 &
    proxy_pid=$!
    pids+=($proxy_pid)
    wait_for "etcd-cache-proxy" 30 curl -sf "http://127.0.0.1:$pm/metrics"
  }
  if [ "$target" = proxy ]; then
    pp=$(free_port); pm=$(free_port)
    start_proxy
    etcd_url="http://127.0.0.1:$pp"
  fi
  # kube-apiserver: self-signed serving cert in --cert-dir, a service-account key pair, a token.
  openssl genrsa -out "$tmp/sa.key" 2048 2>/dev/null
  openssl rsa -in "$tmp/sa.key" -pubout -out "$tmp/sa.pub" 2>/dev/null
  echo "admin-token,admin,admin,system:masters" >"$tmp/tokens.csv"
  local ap; ap=$(free_port)
  "$APISERVER" --etcd-servers "$etcd_url" --bind-address 127.0.0.1 --secure-port "$ap" \
    --advertise-address 127.0.0.1 --endpoint-reconciler-type none \
    --cert-dir "$tmp/certs" --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$tmp/sa.pub" --service-account-signing-key-file "$tmp/sa.key" \
    --authorization-mode AlwaysAllow --token-auth-file "$tmp/tokens.csv" \
    --service-cluster-ip-range 10.0.0.0/24 ${apiserver_args[@]+"${apiserver_args[@]}"} >"$dir/kube-apiserver.log" 2>&1 &
  pids+=($!)
  local kargs=(--server "https://127.0.0.1:$ap" --token admin-token --insecure-skip-tls-verify)
  k() { "$KUBECTL" "${kargs[@]}" "$@"; }
  wait_for "kube-apiserver /readyz" 120 k get --raw /readyz
  if [ "$kcm" = 1 ]; then
    printf 'apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:%s\n    insecure-skip-tls-verify: true\nusers:\n- name: k\n  user:\n    token: admin-token\ncontexts:\n- name: k\n  context: {cluster: k, user: k}\ncurrent-context: k\n' "$ap" >"$tmp/kubeconfig"
    "$KCM" --kubeconfig "$tmp/kubeconfig" --secure-port 0 --leader-elect=false \
      --service-account-private-key-file "$tmp/sa.key" --root-ca-file "$tmp/certs/apiserver.crt" \
      --use-service-account-credentials=false >"$dir/kube-controller-manager.log" 2>&1 &
    pids+=($!)
  fi
  echo "run.sh: [$target] control plane ready in $((SECONDS - start))s (etcd $etcd_v, $etcd_url)"
  local wstart=$SECONDS
  k create namespace "$NS" >/dev/null
  local rv0; rv0="$(k get --raw "/api/v1/namespaces/$NS/configmaps?limit=1" | jq -r .metadata.resourceVersion)"
  [ -n "$rv0" ] && [ "$rv0" != null ] || { echo "run.sh: [$target] no resourceVersion" >&2; exit 1; }
  # Watcher a: kubectl's own watch (a list, then a watch from its resource version), before
  # any write. Its -v=6 log shows the watch request once it is made.
  "$KUBECTL" "${kargs[@]}" get configmaps -n "$NS" -w --output-watch-events -o json -v=6 >"$dir/watch-a.json" 2>"$dir/watch-a.log" &
  pids+=($!)
  wait_for "watcher a" 30 grep -q 'watch=true' "$dir/watch-a.log"
  local r w i
  for ((r = 1; r <= ROUNDS; r++)); do
    local writers=()
    for w in "${WRITERS[@]}"; do
      (
        configmaps "$w" "$r" 0 "$N" v1 >"$tmp/create-$w-$r.yaml"
        configmaps "$w" "$r" 0 "$UPD" v2 >"$tmp/replace-$w-$r.yaml"
        names=(); for ((i = 0; i < DEL; i++)); do names+=("$(printf 'cm-%s-%s-%03d' "$w" "$r" "$i")"); done
        k create -f "$tmp/create-$w-$r.yaml" >/dev/null
        k replace -f "$tmp/replace-$w-$r.yaml" >/dev/null
        k delete configmap -n "$NS" "${names[@]}" >/dev/null
      ) &
      writers+=($!)
    done
    for w in "${writers[@]}"; do
      wait "$w" || { echo "run.sh: [$target] a writer failed" >&2; exit 1; }
    done
    # A chunked list after each round (its first page a consistent read; then continues).
    k get configmaps -n "$NS" --chunk-size 50 -o json >"$dir/list-r$r.json"
    if [ "$r" = 1 ]; then
      # Watcher b: a raw watch from the namespace's resource version before any write, started
      # once round 1 is written (so it starts in the past).
      "$KUBECTL" "${kargs[@]}" get --raw "/api/v1/namespaces/$NS/configmaps?watch=1&resourceVersion=$rv0" >"$dir/watch-b.json" 2>"$dir/watch-b.log" &
      pids+=($!)
      wait_for "watcher b" 30 test -s "$dir/watch-b.json"
      # The fault, once both watchers are open: kube-apiserver's reflectors and its clients
      # on etcd lose their upstream and must resume where they were.
      case "$fault" in
        proxy-kill) if [ "$target" = proxy ]; then
            kill -KILL "$proxy_pid"; wait "$proxy_pid" 2>/dev/null || true
            echo "run.sh: [$target] fault: proxy killed with -9, started again"
            start_proxy
          fi ;;
        etcd-restart)
          kill -KILL "$etcd_pid"; wait "$etcd_pid" 2>/dev/null || true
          echo "run.sh: [$target] fault: etcd killed with -9, started again"
          start_etcd ;;
      esac
      [ -z "$fault" ] || wait_for "kube-apiserver /readyz after the fault" 120 k get --raw /readyz
    fi
  done
  local expected=$(( ${#WRITERS[@]} * ROUNDS * (N + UPD + DEL) ))
  wait_for "watcher a's $expected events" 60 test "$(count_events "$dir/watch-a.json")" -ge "$expected" || true
  wait_for "watcher b's $expected events" 60 test "$(count_events "$dir/watch-b.json")" -ge "$expected" || true
  k get configmaps -n "$NS" --chunk-size 50 -o json >"$dir/list-final.json"
  echo "run.sh: [$target] workload done in $((SECONDS - wstart))s: watcher a $(count_events "$dir/watch-a.json"), watcher b $(count_events "$dir/watch-b.json") of $expected events"
  k get --raw /metrics >"$dir/apiserver-metrics.txt"
  curl -sf "http://127.0.0.1:$em/metrics" >"$dir/etcd-metrics.txt" || true
  [ -z "$pm" ] || curl -sf "http://127.0.0.1:$pm/metrics" >"$dir/proxy-metrics.txt" || true
  printf '{"target":"%s","etcd":"%s","writers":["%s"],"rounds":%d,"n":%d,"upd":%d,"del":%d,"fault":"%s","seconds":%d}\n' \
    "$target" "$etcd_v" "$(IFS=,; echo "${WRITERS[*]}" | sed 's/,/","/g')" "$ROUNDS" "$N" "$UPD" "$DEL" "$fault" "$((SECONDS - start))" >"$dir/params.json"
)

for t in "${targets[@]}"; do
  run_target "$t" "$out/$t" || { echo "run.sh: [$t] failed (logs in $out/$t)" >&2; exit 2; }
done
python3 "$HERE/compare.py" "${targets[@]/#/$out/}"
