#!/usr/bin/env bash
# Builds etcd (go.etcd.io/etcd/server/v3 at the version go.mod pins) with gofail failpoints
# enabled, as etcd's `make gofail-enable && make build` does (tests/robustness/makefile.mk),
# from the module sources the Go module proxy serves: nothing fetched is committed.
#
#   build-gofail-etcd.sh OUT_BIN [WORK_DIR]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
out="$1"
work="${2:-$ROOT/target/robustness-go/etcd-gofail-src}"
export GOWORK=off CGO_ENABLED=0
cd "$HERE"
ver="$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
# gofail at the version etcd pins (tests/v3's go.mod).
gofail_ver="$(go list -m -f '{{.Version}}' go.etcd.io/gofail)"
src="$(go mod download -json "go.etcd.io/etcd/server/v3@$ver" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -d "$src" ] || { echo "no module dir for server/v3@$ver" >&2; exit 2; }
stamp="$ver gofail $gofail_ver"
if [ -x "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "build-gofail-etcd: $out is up to date ($stamp)"; exit 0
fi
modir() { go mod download -json "$1@$ver" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'; }
rm -rf "$work"; mkdir -p "$work/client"
# server/go.mod replaces api, client/pkg, client/v3 and pkg with ../<dir> (etcd's repository
# layout): the same modules at the same version go there.
cp -r "$src" "$work/server"
for m in api/v3:api client/pkg/v3:client/pkg client/v3:client/v3 pkg/v3:pkg; do
  d="$(modir "go.etcd.io/etcd/${m%%:*}")"
  [ -d "$d" ] || { echo "no module dir for go.etcd.io/etcd/${m%%:*}@$ver" >&2; exit 2; }
  cp -r "$d" "$work/${m#*:}"
done
chmod -R u+w "$work"
cd "$work/server"
# The packages etcd's Makefile (gofail-enable) enables, relative to server/.
dirs=(etcdserver/ lease lease/leasehttp storage/backend/ storage/mvcc/ storage/wal/ etcdserver/api/v3rpc/ etcdserver/api/membership/ etcdserver/api/snap/)
# The gofail command from this module's own requirement (go.sum has it: robustness.test links
# its runtime), not `go run gofail@ver`, which resolves gofail's module graph afresh.
(cd "$HERE" && nice -n 10 go build -mod=readonly -o "$work/gofail" go.etcd.io/gofail)
nice -n 10 "$work/gofail" enable "${dirs[@]}"
nice -n 10 go get "go.etcd.io/gofail@$gofail_ver"
nice -n 10 go build -trimpath -buildvcs=false -o "$out.tmp" .
mv -f "$out.tmp" "$out"
echo "$stamp" >"$out.stamp"
echo "build-gofail-etcd: built $out ($stamp)"
