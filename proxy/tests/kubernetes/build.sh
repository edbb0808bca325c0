#!/usr/bin/env bash
# Builds kube-apiserver, kubectl (and, with --kcm, kube-controller-manager; with --scheduler,
# kube-scheduler; with --integration, the test binaries of Kubernetes' integration packages
# that integration.sh runs) of the k8s.io/kubernetes release that go.mod pins, from the module sources
# the Go module proxy serves (nothing fetched is committed), into target/kubernetes-go/bin/.
# kube-apiserver is built from apiserver/main.go: the release's main plus the consistency
# check's period from the environment (see there). A binary whose .stamp matches (release,
# Go version, and for kube-apiserver the hash of apiserver/main.go) is reused.
#
#   build.sh [--kcm] [--scheduler] [--integration] [--force]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
OUT="${KUBERNETES_GO_DIR:-$ROOT/target/kubernetes-go}/bin"
export GOWORK=off CGO_ENABLED=0
cmds=(kube-apiserver kubectl)
force=0
for a in "$@"; do
  case "$a" in
    --kcm) cmds+=(kube-controller-manager) ;;
    --scheduler) cmds+=(kube-scheduler) ;;
    # test/integration/apiserver (lists, pagination, the watch cache) and .../apiserver/apply.
    --integration) cmds+=(integration-apiserver.test integration-apply.test) ;;
    --force) force=1 ;;
    *) echo "build.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
cd "$HERE"
ver="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
stamp="kubernetes $ver $(go env GOVERSION)"
mkdir -p "$OUT"
for c in "${cmds[@]}"; do
  bin="$OUT/$c"
  pkg="k8s.io/kubernetes/cmd/$c"
  cstamp="$stamp"
  build=(build)
  case "$c" in
    kube-apiserver)
      pkg=./apiserver
      cstamp="$stamp main.go $(sha256sum apiserver/main.go | cut -c1-12)" ;;
    # Without -trimpath: the tests find their fixtures (certificates, manifests) from their
    # own source path, here the module cache.
    integration-apiserver.test)
      pkg=k8s.io/kubernetes/test/integration/apiserver; build=(test -c) ;;
    integration-apply.test)
      pkg=k8s.io/kubernetes/test/integration/apiserver/apply; build=(test -c) ;;
  esac
  if [ "${build[0]}" = test ]; then cstamp+=" no-trimpath"; else build+=(-trimpath); fi
  if [ "$force" = 0 ] && [ -x "$bin" ] && [ "$(cat "$bin.stamp" 2>/dev/null)" = "$cstamp" ]; then
    echo "build.sh: $bin is up to date ($cstamp)"; continue
  fi
  echo "build.sh: building $c ($cstamp)"
  start=$SECONDS
  # The version the binaries report (kube-apiserver --version, kubectl version): the
  # release's, as k8s' own build (hack/lib/version.sh) sets it.
  ldf="-X k8s.io/component-base/version.gitVersion=$ver -X k8s.io/client-go/pkg/version.gitVersion=$ver"
  nice -n 10 go "${build[@]}" -mod=readonly -buildvcs=false -ldflags "$ldf" -o "$bin.tmp" "$pkg"
  mv -f "$bin.tmp" "$bin"
  echo "$cstamp" >"$bin.stamp"
  echo "build.sh: built $bin in $((SECONDS - start))s"
done
