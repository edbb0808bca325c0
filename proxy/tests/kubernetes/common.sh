# Sourced by run.sh and integration.sh (after they set HERE, their own directory): the paths
# they share, free ports, polling waits, and one etcd member on 127.0.0.1.

ROOT="$(cd "$HERE/../../.." && pwd)"
KDIR="${KUBERNETES_GO_DIR:-$ROOT/target/kubernetes-go}"
PROXY_BIN="${ETCD_CACHE_PROXY_BIN:-$ROOT/target/debug/etcd-cache-proxy}"
ME="$(basename "$0")"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait_for DESCRIPTION SECONDS COMMAND...: polls COMMAND every 0.2 s.
wait_for() {
  local what="$1" secs="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { echo "$ME: timed out waiting for $what" >&2; return 1; }
    sleep 0.2
  done
}

# spawn_etcd DATA_DIR CLIENT_PORT PEER_PORT METRICS_PORT LOG: member `k` of a one-member
# cluster in the background (its output appended to LOG; the caller takes $! and waits for
# http://127.0.0.1:METRICS_PORT/health).
spawn_etcd() {
  "$ETCD_BIN" --name k --data-dir "$1" \
    --listen-client-urls "http://127.0.0.1:$2" --advertise-client-urls "http://127.0.0.1:$2" \
    --listen-peer-urls "http://127.0.0.1:$3" --initial-advertise-peer-urls "http://127.0.0.1:$3" \
    --initial-cluster "k=http://127.0.0.1:$3" --listen-metrics-urls "http://127.0.0.1:$4" \
    >>"$5" 2>&1 &
}
