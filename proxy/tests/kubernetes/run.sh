#!/usr/bin/env bash
# A real Kubernetes control plane (kube-apiserver, driven by kubectl) on etcd-cache-proxy in
# front of etcd, and the same directly on etcd, then the two compared. See README.md.
#
#   run.sh [--etcd 3.6|3.7] [--target proxy|direct|both] [--no-watch-cache] [--kcm] [--scheduler]
#          [--apiservers N] [--fault proxy-kill|etcd-restart]... [--compaction-interval DUR]
#          [--check-period DUR] [--proxy-prefix P] [--objects N] [--value-bytes B] [--out DIR] [--no-build]
#
# Needs target/etcd/<v>/etcd (`cargo xtask etcd-bins`; or KUBERNETES_ETCD_BIN) and the proxy
# binary (ETCD_CACHE_PROXY_BIN, default target/debug/etcd-cache-proxy). Builds kube-apiserver and
# kubectl with build.sh (cached) unless --no-build. --no-watch-cache: kube-apiserver runs with
# --watch-cache=false, so every watch and list of kubectl's reaches the proxy (or etcd) itself.
# --kcm: kube-controller-manager runs beside it (built by build.sh --kcm), and the workload adds
# a Deployment it turns into a ReplicaSet and Pods; --scheduler: kube-scheduler too (the Pods
# stay Pending without nodes: it marks them Unschedulable). --apiservers N: N kube-apiservers
# on the one etcd (or proxy), the writers and watchers spread over them. --fault (repeatable,
# the Nth after round N): proxy-kill kills the proxy with -9 and starts it again on its port
# (the proxy target only); etcd-restart kills etcd with -9 and starts it again on its data dir
# (both targets). --compaction-interval: kube-apiserver's --etcd-compaction-interval (default
# 10s, so that it compacts under the running watchers; 0 turns it off). --check-period: the
# period of kube-apiserver's watch-cache consistency check against etcd (default 20s; a
# release build checks every 5 min); the run waits until it has passed twice. --proxy-prefix:
# the proxy's --prefix (default /registry/; "" caches kube-apiserver's compact_rev_key too).
# --objects N: the workload's size (default 100): per round and writer N ConfigMaps created,
# 0.6 N replaced, 0.3 N deleted, and N Secrets created, 0.3 N deleted; the waits and the lists'
# page size scale with it, and above 250 each writer runs up to 4 kubectl pipelines at once.
# --value-bytes B: each ConfigMap also carries a key `pad` of B bytes (default 0; Pods are 4-8
# KiB in etcd: with B 10000 and --objects 400 a page of the proxy's list is over 4 MiB).
# Exits 1 when a check fails or the two targets differ (compare.py), 2 on a usage, build or
# start-up error.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$HERE/common.sh"
etcd_v=3.6
targets=(proxy direct)
out=""
build=1
apiserver_args=()
kcm=0
scheduler=0
apiservers=1
faults=()
compaction=10s
check_period=20s
proxy_prefix=/registry/
objects=100
value_bytes=0
usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --etcd) shift; etcd_v="${1:-}" ;;
    --target) shift; case "${1:-}" in proxy|direct) targets=("$1") ;; both) targets=(proxy direct) ;; *) usage ;; esac ;;
    --out) shift; out="${1:-}" ;;
    --no-build) build=0 ;;
    --no-watch-cache) apiserver_args+=(--watch-cache=false) ;;
    --kcm) kcm=1 ;;
    --scheduler) scheduler=1 ;;
    --apiservers) shift; [[ "${1:-}" =~ ^[1-9]$ ]] || { echo "run.sh: --apiservers takes 1 to 9" >&2; usage; }; apiservers="$1" ;;
    --fault) shift; case "${1:-}" in proxy-kill|etcd-restart) faults+=("$1") ;; *) usage ;; esac ;;
    --compaction-interval) shift; [[ "${1:-}" =~ ^[0-9]+(ms|s|m|h)?$ ]] || { echo "run.sh: --compaction-interval takes a Go duration (10s, 1m, 0)" >&2; usage; }; compaction="$1" ;;
    --proxy-prefix) shift; proxy_prefix="${1-}" ;;
    --objects) shift; [[ "${1:-}" =~ ^[1-9][0-9]{0,4}$ ]] || { echo "run.sh: --objects takes 1 to 99999" >&2; usage; }; objects="$1" ;;
    --value-bytes) shift; [[ "${1:-}" =~ ^[0-9]{1,6}$ ]] || { echo "run.sh: --value-bytes takes 0 to 999999" >&2; usage; }; value_bytes="$1" ;;
    --check-period) shift; [[ "${1:-}" =~ ^[1-9][0-9]*(s|m)$ ]] || { echo "run.sh: --check-period takes a positive duration in s or m (20s)" >&2; usage; }; check_period="$1" ;;
    -h|--help) usage ;;
    *) echo "run.sh: unknown argument $1" >&2; usage ;;
  esac
  shift
done
ETCD_BIN="${KUBERNETES_ETCD_BIN:-$ROOT/target/etcd/$etcd_v/etcd}"
[ -x "$ETCD_BIN" ] || { echo "run.sh: no $ETCD_BIN (cargo xtask etcd-bins $etcd_v)" >&2; exit 2; }
[ -x "$PROXY_BIN" ] || { echo "run.sh: no $PROXY_BIN (cargo build -p etcd-cache-proxy)" >&2; exit 2; }
build_args=()
[ "$kcm" = 0 ] || build_args+=(--kcm)
[ "$scheduler" = 0 ] || build_args+=(--scheduler)
if [ "$build" = 1 ]; then "$HERE/build.sh" ${build_args[@]+"${build_args[@]}"} || exit 2; fi
APISERVER="$KDIR/bin/kube-apiserver"
KUBECTL="$KDIR/bin/kubectl"
for b in "$APISERVER" "$KUBECTL"; do
  [ -x "$b" ] || { echo "run.sh: no $b (run build.sh)" >&2; exit 2; }
done
KCM="$KDIR/bin/kube-controller-manager"
[ "$kcm" = 0 ] || [ -x "$KCM" ] || { echo "run.sh: no $KCM (run build.sh --kcm)" >&2; exit 2; }
SCHEDULER="$KDIR/bin/kube-scheduler"
[ "$scheduler" = 0 ] || [ -x "$SCHEDULER" ] || { echo "run.sh: no $SCHEDULER (run build.sh --scheduler)" >&2; exit 2; }
[ "${#faults[@]}" -le 2 ] || { echo "run.sh: at most 2 faults (after rounds 1 and 2)" >&2; exit 2; }
suffix="${apiserver_args[*]:+-no-watch-cache}$([ "$kcm" = 0 ] || echo -kcm)$([ "$scheduler" = 0 ] || echo -scheduler)"
[ "$apiservers" = 1 ] || suffix+="-apiservers$apiservers"
for f in ${faults[@]+"${faults[@]}"}; do suffix+="-$f"; done
[ "$objects" = 100 ] || suffix+="-objects$objects"
[ "$value_bytes" = 0 ] || suffix+="-value$value_bytes"
PAD="$(head -c "$value_bytes" /dev/zero | tr '\0' x)"
out="${out:-$KDIR/runs/etcd-$etcd_v$suffix}"
mkdir -p "$out"

# The workload's shape (compare.py derives every expected event and list from it).
WRITERS=(a b)   # writers running at once, each on its own names
ROUNDS=3        # per round and writer: create N, replace the first UPD, delete the first DEL
N=$objects UPD=$((objects * 6 / 10)) DEL=$((objects * 3 / 10))   # 100, 60, 30 by default
NS=kt
# The waits for the watchers' events: 60 s for the default 100 objects, in proportion above.
WAIT_S=$((objects > 100 ? 60 * objects / 100 : 60))
# Chunked lists: 50 a page for the default 100 objects, in proportion above (as many pages, so
# that a list ends well within kube-apiserver's compaction interval: its continue tokens are
# refused once etcd has compacted their revision).
CHUNK=$((objects > 100 ? objects / 2 : 50))
# Each writer's kubectl pipelines at once: one per 250 objects, at most 4 (kubectl sends its
# requests one at a time: one pipeline writes about 18 objects a second here, whatever the load).
PAR=$(((objects + 249) / 250)); [ "$PAR" -le 4 ] || PAR=4

# configmaps WRITER ROUND FROM TO VALUE [STEP]: a multi-document YAML of ConfigMaps (every
# STEP-th from FROM).
configmaps() {
  local w="$1" r="$2" from="$3" to="$4" val="$5" step="${6:-1}" i
  for ((i = from; i < to; i += step)); do
    printf -- '---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-%s-%s-%03d\n  namespace: %s\ndata:\n  k: "%s-%s-%s-%d"\n' \
      "$w" "$r" "$i" "$NS" "$val" "$w" "$r" "$i"
    [ -z "$PAD" ] || printf -- '  pad: "%s"\n' "$PAD"
  done
}

# secrets WRITER ROUND FROM TO VALUE STEP: a multi-document YAML of Secrets (type Opaque), their
# one key `k` the base64 of VALUE-WRITER-ROUND-I (names sec-WRITER-ROUND-III), every STEP-th.
secrets() {
  python3 - "$@" "$NS" <<'PY'
import base64, sys
w, r, lo, hi, val, step, ns = sys.argv[1:]
for i in range(int(lo), int(hi), int(step)):
    k = base64.b64encode(f"{val}-{w}-{r}-{i}".encode()).decode()
    print(f"---\napiVersion: v1\nkind: Secret\ntype: Opaque\nmetadata:\n  name: sec-{w}-{r}-{i:03d}\n"
          f"  namespace: {ns}\ndata:\n  k: {k}")
PY
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
    spawn_etcd "$tmp/etcd" "$ec" "$ep" "$em" "$dir/etcd.log"
    etcd_pid=$!
    pids+=($etcd_pid)
    wait_for "etcd" 30 curl -sf "http://127.0.0.1:$em/health"
  }
  start_etcd
  local etcd_url="http://127.0.0.1:$ec" pm="" pp=""
  start_proxy() {
    RUST_LOG="${PROXY_LOG:-info}" "$PROXY_BIN" --endpoints "http://127.0.0.1:$ec" --listen-addr "127.0.0.1:$pp" \
      --prefix "$proxy_prefix" --metrics-addr "127.0.0.1:$pm" >>"$dir/proxy.log" 2>&1 &
    proxy_pid=$!
    pids+=($proxy_pid)
    wait_for "etcd-cache-proxy" 30 curl -sf "http://127.0.0.1:$pm/metrics"
  }
  # exited PID: the child PID has ended (a zombie until waited on, which kill -0 does not tell).
  exited() { local st; st="$(awk '{sub(/^.*\) /, ""); print $1}' "/proc/$1/stat" 2>/dev/null)"; [ -z "$st" ] || [ "$st" = Z ]; }
  # proxy_alive: false, and how the proxy ended said (its status; signal N as 128+N) on stderr
  # and in proxy.log, when the proxy has ended without a fault's kill.
  proxy_alive() {
    [ -n "$pm" ] && exited "$proxy_pid" || return 0
    local rc=0; wait "$proxy_pid" || rc=$?
    echo "run.sh: [$target] the proxy (pid $proxy_pid) ended on its own at $(date -u +%FT%T.%3NZ), status $rc$([ "$rc" -le 128 ] || echo " (signal $((rc - 128)))")" | tee -a "$dir/proxy.log" >&2
    return 1
  }
  if [ "$target" = proxy ]; then
    pp=$(free_port); pm=$(free_port)
    start_proxy
    etcd_url="http://127.0.0.1:$pp"
  fi
  # kube-apiservers: each its self-signed serving cert in its --cert-dir; one service-account key
  # pair and one token file for all.
  openssl genrsa -out "$tmp/sa.key" 2048 2>/dev/null
  openssl rsa -in "$tmp/sa.key" -pubout -out "$tmp/sa.pub" 2>/dev/null
  echo "admin-token,admin,admin,system:masters" >"$tmp/tokens.csv"
  local aps=() i
  for ((i = 0; i < apiservers; i++)); do
    local ap; ap=$(free_port)
    KUBE_APISERVER_CONSISTENCY_CHECK_PERIOD="$check_period" "$APISERVER" --etcd-servers "$etcd_url" \
      --bind-address 127.0.0.1 --secure-port "$ap" \
      --advertise-address 127.0.0.1 --endpoint-reconciler-type none \
      --cert-dir "$tmp/certs-$i" --service-account-issuer https://kubernetes.default.svc \
      --service-account-key-file "$tmp/sa.pub" --service-account-signing-key-file "$tmp/sa.key" \
      --authorization-mode AlwaysAllow --token-auth-file "$tmp/tokens.csv" \
      --etcd-compaction-interval "$compaction" \
      --service-cluster-ip-range 10.0.0.0/24 ${apiserver_args[@]+"${apiserver_args[@]}"} >"$dir/kube-apiserver-$i.log" 2>&1 &
    pids+=($!)
    aps+=("$ap")
  done
  # kargs N: kubectl's flags for kube-apiserver N (modulo the count); k is kubectl on the first.
  kargs() { echo --server "https://127.0.0.1:${aps[$(($1 % apiservers))]}" --token admin-token --insecure-skip-tls-verify; }
  k() { "$KUBECTL" $(kargs 0) "$@"; }
  ready_all() {
    for ((i = 0; i < apiservers; i++)); do
      wait_for "kube-apiserver $i /readyz $1" 120 "$KUBECTL" $(kargs "$i") get --raw /readyz || return 1
    done
  }
  ready_all ""
  if [ "$kcm" = 1 ] || [ "$scheduler" = 1 ]; then
    printf 'apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:%s\n    insecure-skip-tls-verify: true\nusers:\n- name: k\n  user:\n    token: admin-token\ncontexts:\n- name: k\n  context: {cluster: k, user: k}\ncurrent-context: k\n' "${aps[0]}" >"$tmp/kubeconfig"
  fi
  if [ "$kcm" = 1 ]; then
    "$KCM" --kubeconfig "$tmp/kubeconfig" --secure-port 0 --leader-elect=false \
      --service-account-private-key-file "$tmp/sa.key" --root-ca-file "$tmp/certs-0/apiserver.crt" \
      --use-service-account-credentials=false >"$dir/kube-controller-manager.log" 2>&1 &
    pids+=($!)
  fi
  if [ "$scheduler" = 1 ]; then
    "$SCHEDULER" --kubeconfig "$tmp/kubeconfig" --secure-port 0 --leader-elect=false >"$dir/kube-scheduler.log" 2>&1 &
    pids+=($!)
  fi
  echo "run.sh: [$target] control plane ready in $((SECONDS - start))s (etcd $etcd_v, $etcd_url, $apiservers kube-apiserver(s))"
  # etcd's (and the proxy's) CPU while the control plane idles, 10 s before the workload: what
  # compare.py subtracts from their CPU over the rounds for the part the writes cost.
  # The proxy's CPU time (user + system) from /proc, in the form of etcd's metric.
  proxy_cpu() { awk -v hz="$(getconf CLK_TCK)" '{sub(/^.*\) /, ""); print "process_cpu_seconds_total", ($12 + $13) / hz}' "/proc/$proxy_pid/stat"; }
  snapshot() {
    echo "$1 $(date +%s.%N)" >>"$dir/times.txt"
    curl -sf "http://127.0.0.1:$em/metrics" >"$dir/etcd-metrics-$1.txt" || true
    [ -z "$pm" ] || proxy_cpu >"$dir/proxy-cpu-$1.txt"
  }
  snapshot idle
  sleep 10
  local wstart=$SECONDS
  snapshot start
  k create namespace "$NS" >/dev/null
  local rv0; rv0="$(k get --raw "/api/v1/namespaces/$NS/configmaps?limit=1" | jq -r .metadata.resourceVersion)"
  [ -n "$rv0" ] && [ "$rv0" != null ] || { echo "run.sh: [$target] no resourceVersion" >&2; exit 1; }
  # Watcher a: kubectl's own watch (a list, then a watch from its resource version), before
  # any write, on the first kube-apiserver. Its -v=6 log shows the watch request once it is made.
  "$KUBECTL" $(kargs 0) get configmaps -n "$NS" -w --output-watch-events -o json -v=6 >"$dir/watch-a.json" 2>"$dir/watch-a.log" &
  pids+=($!)
  wait_for "watcher a" 30 grep -q 'watch=true' "$dir/watch-a.log"
  # Watcher s: the same on Secrets, on the second kube-apiserver (the first when there is one).
  "$KUBECTL" $(kargs 1) get secrets -n "$NS" -w --output-watch-events -o json -v=6 >"$dir/watch-s.json" 2>"$dir/watch-s.log" &
  pids+=($!)
  wait_for "watcher s" 30 grep -q 'watch=true' "$dir/watch-s.log"
  # kube-controller-manager turns a Deployment into a ReplicaSet and its Pods.
  [ "$kcm" = 0 ] || k create deployment web -n "$NS" --image=registry.k8s.io/pause:3.10 --replicas=3 >/dev/null
  local r w wi
  for ((r = 1; r <= ROUNDS; r++)); do
    local writers=() rstart=$SECONDS
    wi=0
    for w in "${WRITERS[@]}"; do
      (
        kw() { "$KUBECTL" $(kargs "$wi") "$@"; }
        # part J: the writer's objects J, J+PAR, J+2 PAR...: ConfigMaps created, the first UPD
        # replaced, the first DEL deleted; Secrets created, the first DEL deleted. One kubectl
        # at a time (a failed one ends it, failed).
        part() {
          local j="$1" f="$tmp/$w-$r-$1" names=() i
          configmaps "$w" "$r" "$j" "$N" v1 "$PAR" >"$f-create.yaml"
          configmaps "$w" "$r" "$j" "$UPD" v2 "$PAR" >"$f-replace.yaml"
          for ((i = j; i < DEL; i += PAR)); do names+=("$(printf 'cm-%s-%s-%03d' "$w" "$r" "$i")"); done
          kw create -f "$f-create.yaml" >/dev/null || return 1
          [ "$j" -ge "$UPD" ] || kw replace -f "$f-replace.yaml" >/dev/null || return 1
          [ "$j" -ge "$DEL" ] || kw delete configmap -n "$NS" "${names[@]}" >/dev/null || return 1
          secrets "$w" "$r" "$j" "$N" v1 "$PAR" >"$f-secrets.yaml"
          names=(); for ((i = j; i < DEL; i += PAR)); do names+=("$(printf 'sec-%s-%s-%03d' "$w" "$r" "$i")"); done
          kw create -f "$f-secrets.yaml" >/dev/null || return 1
          [ "$j" -ge "$DEL" ] || kw delete secret -n "$NS" "${names[@]}" >/dev/null || return 1
        }
        parts=()
        for ((j = 0; j < PAR; j++)); do part "$j" & parts+=($!); done
        for p in "${parts[@]}"; do wait "$p" || exit 1; done
      ) &
      writers+=($!)
      wi=$((wi + 1))
    done
    # The writers, and the proxy meanwhile: without it they would wait on kube-apiserver's
    # timeouts object after object.
    while [ "${#writers[@]}" -gt 0 ]; do
      local left=()
      for w in "${writers[@]}"; do
        if exited "$w"; then wait "$w" || { echo "run.sh: [$target] a writer failed" >&2; exit 1; }; else left+=("$w"); fi
      done
      writers=(${left[@]+"${left[@]}"})
      proxy_alive || { kill ${writers[@]+"${writers[@]}"} 2>/dev/null; exit 1; }
      [ "${#writers[@]}" = 0 ] || sleep 0.5
    done
    local lstart=$SECONDS
    # A chunked list after each round (its first page a consistent read; then continues).
    k get configmaps -n "$NS" --chunk-size "$CHUNK" -o json >"$dir/list-r$r.json" || echo "run.sh: [$target] the list after round $r failed" >&2
    echo "run.sh: [$target] round $r written in $((lstart - rstart))s, listed in $((SECONDS - lstart))s"
    [ "$kcm" = 0 ] || [ "$r" != 2 ] || k scale deployment web -n "$NS" --replicas=5 >/dev/null
    if [ "$r" = 1 ]; then
      # Watcher b: a raw watch from the namespace's resource version before any write, started
      # once round 1 is written (so it starts in the past), on the last kube-apiserver.
      "$KUBECTL" $(kargs $((apiservers - 1))) get --raw "/api/v1/namespaces/$NS/configmaps?watch=1&resourceVersion=$rv0" >"$dir/watch-b.json" 2>"$dir/watch-b.log" &
      pids+=($!)
      wait_for "watcher b" 30 test -s "$dir/watch-b.json"
      # Watcher c: a WatchList (KEP-3157): the state as initial events, a bookmark that ends
      # them, then the changes; on the second kube-apiserver (the first when there is one).
      "$KUBECTL" $(kargs 1) get --raw "/api/v1/namespaces/$NS/configmaps?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true" >"$dir/watch-c.json" 2>"$dir/watch-c.log" &
      pids+=($!)
      wait_for "watcher c's initial events" "$WAIT_S" grep -q 'initial-events-end' "$dir/watch-c.json"
    fi
    # The Nth fault after round N, once the watchers are open: kube-apiserver's reflectors and
    # its clients on etcd lose their upstream and must resume where they were.
    if [ "$r" -le "${#faults[@]}" ]; then
      case "${faults[r - 1]}" in
        proxy-kill) if [ "$target" = proxy ]; then
            kill -KILL "$proxy_pid"; wait "$proxy_pid" 2>/dev/null || true
            echo "run.sh: [$target] fault after round $r: proxy killed with -9, started again"
            start_proxy
          fi ;;
        etcd-restart)
          kill -KILL "$etcd_pid"; wait "$etcd_pid" 2>/dev/null || true
          echo "run.sh: [$target] fault after round $r: etcd killed with -9, started again"
          start_etcd ;;
      esac
      ready_all "after the fault"
    fi
  done
  # etcd's (and the proxy's) CPU per write is taken over the rounds: from here back to the start.
  snapshot rounds
  # Watch latency as kube-apiserver's clients see it: creates through the first kube-apiserver,
  # a watch through the last (latency.py).
  python3 "$HERE/latency.py" "https://127.0.0.1:${aps[0]}" "https://127.0.0.1:${aps[$((apiservers - 1))]}" \
    admin-token "$dir/latency.json" >>"$dir/latency.log" 2>&1 || echo "run.sh: [$target] latency.py failed (latency.log)" >&2
  # Events each watcher should end with: every change for a and b; for c, round 1's state as
  # initial events, then the changes of the later rounds; for s, every Secret's create and delete.
  local expected=$(( ${#WRITERS[@]} * ROUNDS * (N + UPD + DEL) ))
  local expected_c=$(( ${#WRITERS[@]} * ((N - DEL) + (ROUNDS - 1) * (N + UPD + DEL)) ))
  local expected_s=$(( ${#WRITERS[@]} * ROUNDS * (N + DEL) ))
  wait_for "watcher a's events" "$WAIT_S" test "$(count_events "$dir/watch-a.json")" -ge "$expected" || true
  wait_for "watcher b's events" "$WAIT_S" test "$(count_events "$dir/watch-b.json")" -ge "$expected" || true
  wait_for "watcher c's events" "$WAIT_S" test "$(count_events "$dir/watch-c.json")" -ge "$expected_c" || true
  wait_for "watcher s's events" "$WAIT_S" test "$(count_events "$dir/watch-s.json")" -ge "$expected_s" || true
  for ((i = 0; i < apiservers; i++)); do
    "$KUBECTL" $(kargs "$i") get configmaps -n "$NS" --chunk-size "$CHUNK" -o json >"$dir/list-final-$i.json" || echo "run.sh: [$target] the final list on kube-apiserver $i failed" >&2
    "$KUBECTL" $(kargs "$i") get secrets -n "$NS" --chunk-size "$CHUNK" -o json >"$dir/secrets-final-$i.json" || echo "run.sh: [$target] the final Secret list on kube-apiserver $i failed" >&2
  done
  cp "$dir/list-final-0.json" "$dir/list-final.json"
  if [ "$kcm" = 1 ]; then
    # The Deployment's 5 Pods (3, then scaled); with the scheduler, each marked unschedulable.
    pods_done() {
      k get pods -n "$NS" -o json >"$tmp/pods.json" || return 1
      jq -e --argjson s "$scheduler" '[.items[] | select(.metadata.deletionTimestamp == null)
        | select($s == 0 or any(.status.conditions[]?; .type == "PodScheduled" and .status == "False"))]
        | length == 5' "$tmp/pods.json"
    }
    wait_for "the Deployment's 5 Pods" 90 pods_done || true
    k get pods -n "$NS" -o json >"$dir/pods.json"
    k get replicasets -n "$NS" -o json >"$dir/replicasets.json"
    k get deployments -n "$NS" -o json >"$dir/deployments.json"
  fi
  # kube-apiserver's watch-cache consistency check against etcd: twice on ConfigMaps, on each.
  checks_done() {
    "$KUBECTL" $(kargs "$1") get --raw /metrics | awk '/^apiserver_storage_consistency_checks_total\{/ && /resource="configmaps"/ && /status="success"/ {s += $2} END {exit !(s >= 2)}'
  }
  local period_s="${check_period%[sm]}"; [ "${check_period: -1}" = s ] || period_s=$((period_s * 60))
  if [ -z "${apiserver_args[*]-}" ]; then
    for ((i = 0; i < apiservers; i++)); do
      wait_for "kube-apiserver $i's consistency checks" $((period_s * 4 + 30)) checks_done "$i" || true
    done
  fi
  proxy_alive || exit 1
  echo "run.sh: [$target] workload done in $((SECONDS - wstart))s: watchers a and b $(count_events "$dir/watch-a.json") and $(count_events "$dir/watch-b.json") of $expected events, watcher c $(count_events "$dir/watch-c.json") of $expected_c (round 1's state included), watcher s $(count_events "$dir/watch-s.json") of $expected_s"
  for ((i = 0; i < apiservers; i++)); do
    "$KUBECTL" $(kargs "$i") get --raw /metrics >"$dir/apiserver-metrics-$i.txt"
  done
  curl -sf "http://127.0.0.1:$em/metrics" >"$dir/etcd-metrics.txt" || true
  [ -z "$pm" ] || curl -sf "http://127.0.0.1:$pm/metrics" >"$dir/proxy-metrics.txt" || true
  grep -c 'finished scheduled compaction' "$dir/etcd.log" >"$dir/etcd-compactions.txt" || true
  local fl; fl="$(printf '"%s",' ${faults[@]+"${faults[@]}"})"
  printf '{"target":"%s","etcd":"%s","writers":["%s"],"rounds":%d,"n":%d,"upd":%d,"del":%d,"secrets":true,"faults":[%s],"apiservers":%d,"kcm":%d,"scheduler":%d,"watch_cache":%s,"compaction":"%s","proxy_prefix":"%s","seconds":%d,"workload_seconds":%d}\n' \
    "$target" "$etcd_v" "$(IFS=,; echo "${WRITERS[*]}" | sed 's/,/","/g')" "$ROUNDS" "$N" "$UPD" "$DEL" "${fl%,}" \
    "$apiservers" "$kcm" "$scheduler" "$([ -z "${apiserver_args[*]-}" ] && echo true || echo false)" "$compaction" "$proxy_prefix" \
    "$((SECONDS - start))" "$((SECONDS - wstart))" >"$dir/params.json"
)

for t in "${targets[@]}"; do
  run_target "$t" "$out/$t" || { echo "run.sh: [$t] failed (logs in $out/$t)" >&2; exit 2; }
done
python3 "$HERE/compare.py" "${targets[@]/#/$out/}"
