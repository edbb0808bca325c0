#!/usr/bin/env bash
# etcd's own e2e suites (go.etcd.io/etcd/tests/v3 at the release pinned in go.mod, built with
# the tag cluster_proxy) with etcd-cache-proxy, or the reference grpc-proxy, in front of every
# member. See README.md beside this file.
#
#   run.sh [--proxy cache|grpc-proxy|both] [--set short|quick|e2e|common|all|SUITE:REGEX]...
#          [--run REGEX] [--timeout DURATION] [--out DIR] [--jobs N] [--retries N]
#          [--release 3.5|3.6|3.7] [--no-build] [--build-only] [--no-isolate]
#
# Prints one line per test leaf (`PASS|FAIL|SKIP <proxy> <suite> <name> (<secs>s)`), for
# --proxy both the tests that fail through etcd-cache-proxy but pass through grpc-proxy, and
# last `N passed, M failed, K skipped` over every run. A failure that exceptions.tsv lists
# (with its reason) is an expected failure, not counted as failed. --retries N runs a failed
# test again up to N times (isolated runs only); one that passes then is reported as flaky.
# Exits 1 when a test failed (or never finished), 2 on a usage or build error.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"

proxies=()
sets=()
run_re=""
timeout="15m"
isolate=1
out=""
jobs=1
retries=0
build=1
build_only=0
rel=""

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --proxy) shift; case "$1" in both) proxies=(cache grpc-proxy) ;; cache|etcd-cache-proxy) proxies+=(cache) ;; grpc-proxy|grpc) proxies+=(grpc-proxy) ;; *) usage ;; esac ;;
    --set) shift; sets+=("$1") ;;
    --run) shift; run_re="$1" ;;
    --timeout) shift; timeout="$1" ;;
    --out) shift; out="$1" ;;
    --jobs|-j) shift; jobs="$1" ;;
    --retries) shift; retries="$1" ;;
    --release) shift; rel="$1" ;;
    --no-build) build=0 ;;
    --build-only) build_only=1 ;;
    --no-isolate) isolate=0 ;;
    -h|--help) usage ;;
    *) echo "run.sh: unknown argument $1" >&2; usage ;;
  esac
  shift
done
[ ${#proxies[@]} -gt 0 ] || proxies=(cache)
[ ${#sets[@]} -gt 0 ] || sets=(quick)

# The quick set: ctl KV, watch, lease, auth, compact (tests/e2e) and KV, txn, watch, lease,
# compact and auth basics (tests/common, each over its TLS variants).
QUICK_E2E='^(TestCtlV3(Put|Get|Del)[A-Za-z]*|TestCtlV3Watch[A-Za-z]*|TestCtlV3LeaseKeepAlive[A-Za-z]*|TestCtlV3AuthAndWatch|TestCtlV3Elect|TestCtlV3Lock|TestCtlV3Version|TestCtlV3MemberList|TestCurlV3KVCompact|TestCurlV3Watch)$'
QUICK_COMMON='^(TestKV[A-Za-z]*|TestTxn[A-Za-z]*|TestWatch|TestLease[A-Za-z]*|TestCompact|TestAuthEnable|TestAuthDisable|TestAuthStatus|TestAuthWriteKey|TestAuthTxn|TestAuthPrefixPerm|TestAuthCompact|TestAuthLeaseKeepAlive|TestUserAdd_Simple|TestRoleAdd_Simple|TestStatus|TestEndpointStatus|TestEndpointHealth)$'

# The short set (`cargo xtask test`'s default, about a minute): one test of each kind
# above, etcdctl's put/get/watch/lease/auth and the shared KV, txn, watch, auth and
# endpoint tests.
SHORT_E2E='^(TestCtlV3Put|TestCtlV3Get|TestCtlV3Watch|TestCtlV3WatchClientTLS|TestCtlV3AuthAndWatch|TestCtlV3LeaseKeepAlive|TestCtlV3Version|TestCurlV3Watch)$'
SHORT_COMMON='^(TestKVPut|TestTxnSucc|TestWatch|TestCompact|TestAuthEnable|TestAuthWriteKey|TestEndpointStatus)$'

specs=()   # suite:regex
for s in "${sets[@]}"; do
  case "$s" in
    quick) specs+=("e2e:$QUICK_E2E" "common:$QUICK_COMMON") ;;
    short) specs+=("e2e:$SHORT_E2E" "common:$SHORT_COMMON") ;;
    e2e) specs+=("e2e:.") ;;
    common) specs+=("common:.") ;;
    all|full) specs+=("e2e:." "common:.") ;;
    e2e:*|common:*) specs+=("$s") ;;
    *) echo "run.sh: unknown set $s" >&2; usage ;;
  esac
done
if [ -n "$run_re" ]; then
  # --run narrows every suite to REGEX (e.g. --set all --run TestKVPut).
  mapfile -t suites < <(printf '%s\n' "${specs[@]}" | cut -d: -f1 | awk '!s[$0]++')
  specs=(); for s in "${suites[@]}"; do specs+=("$s:$run_re"); done
fi

BUILD="${E2E_BUILD_DIR:-$ROOT/target/e2e-go}"
# The module whose tests/v3 runs: this directory's (the release go.mod pins), or with
# --release another release's, from releases/<major.minor>/ (built with -mod=mod: its go.mod
# names tests/v3 only, go.sum holds what the builds need), into $BUILD/<major.minor>/.
MODDIR="$HERE"
if [ -n "$rel" ] && [ -d "$HERE/releases/$rel" ]; then
  MODDIR="$HERE/releases/$rel"; BUILD="$BUILD/$rel"; export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod"
elif [ -n "$rel" ] && [ "$rel" != "$(cd "$HERE" && go list -m -f '{{.Version}}' go.etcd.io/etcd/tests/v3 | sed 's/^v//; s/\.[0-9]*$//')" ]; then
  echo "run.sh: --release $rel: no $HERE/releases/$rel" >&2; exit 2
fi
[ -n "$out" ] || out="$BUILD/runs/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$BUILD/bin" "$out"
out="$(cd "$out" && pwd)"
export GOWORK=off CGO_ENABLED=0
GOBUILD=(nice -n 10 go build -trimpath -buildvcs=false)
GOTEST_C=(nice -n 10 go test -c -trimpath -buildvcs=false)

# etcd takes ETCD_<FLAG> from its environment as flags, and the framework passes ETCD_* on:
# none of the caller's (ETCD_VERSION, ETCD_CACHE_ETCD_DIR, ...) may reach it.
while read -r v; do
  case "$v" in ETCD_E2E_*|ETCD_CACHE_PROXY_BIN) ;; ETCD*) unset "$v" ;; esac
done < <(compgen -e)

log() { echo "run.sh: $*" >&2; }
die() { echo "run.sh: $*" >&2; exit 2; }

for tool in go python3 curl; do
  command -v "$tool" >/dev/null || die "$tool is needed (Debian: apt-get install python3 curl; Go from go.dev)"
done
if [ "$jobs" -gt 1 ]; then
  command -v unshare >/dev/null && command -v ip >/dev/null && [ "$(id -u)" = 0 ] \
    || die "--jobs $jobs needs root, unshare and ip (network namespaces): run as root or without --jobs"
fi

# ---- build -------------------------------------------------------------------------------
# run_build LOG: build_steps with set -e in force, three attempts (../run_build.sh).
source "$HERE/../run_build.sh"

release="$(cd "$MODDIR" && go list -m -f '{{.Version}}' go.etcd.io/etcd/tests/v3)" || die "go list failed (Go and the Go module proxy are needed)"
release="${release#v}"
if [ "$build" = 1 ]; then
  t0=$SECONDS
  build_steps() {
    set -e
    (cd "$HERE" && GOFLAGS= "${GOBUILD[@]}" -o "$BUILD/bin/etcd" ./wrapper)
    cd "$MODDIR"
    "${GOBUILD[@]}" -o "$BUILD/bin/etcdutl" go.etcd.io/etcd/etcdutl/v3
    # etcd and etcdctl at the same release: reuse `cargo xtask etcd-bins`' when they match.
    pre="$ROOT/target/etcd/${release%.*}"
    if [ "$(head -1 "$pre/VERSION" 2>/dev/null)" = "$release" ] && [ -x "$pre/etcd" ] && [ -x "$pre/etcdctl" ]; then
      # Replaced by a rename, and only when changed: a run using them meanwhile keeps its
      # binaries (an exec during a copy is "text file busy").
      for pair in "etcd:etcd-real" "etcdctl:etcdctl"; do
        from="$pre/${pair%%:*}"; to="$BUILD/bin/${pair#*:}"
        cmp -s "$from" "$to" || { cp -f "$from" "$to.tmp.$$" && mv -f "$to.tmp.$$" "$to"; }
      done
    else
      "${GOBUILD[@]}" -o "$BUILD/bin/etcd-real" go.etcd.io/etcd/server/v3
      "${GOBUILD[@]}" -o "$BUILD/bin/etcdctl" go.etcd.io/etcd/etcdctl/v3
    fi
    "${GOTEST_C[@]}" -tags cluster_proxy -o "$BUILD/e2e.test" go.etcd.io/etcd/tests/v3/e2e
    # tests/common (the shared KV/watch/lease/auth tests) is in 3.6 and later.
    # (Looked up in the module's files: `go list` of a missing package with -mod=mod would
    # upgrade tests/v3 to a release that has it.)
    if [ -d "$(go list -m -f '{{.Dir}}' go.etcd.io/etcd/tests/v3)/common" ]; then
      "${GOTEST_C[@]}" -tags "cluster_proxy e2e" -o "$BUILD/common.test" go.etcd.io/etcd/tests/v3/common
    fi
  }
  run_build "$out/build.log"
  log "built etcd $release e2e binaries in $((SECONDS - t0)) s ($BUILD)"
fi
"$BUILD/bin/etcd-real" --version | grep "etcd Version: $release" >/dev/null || die "$BUILD/bin/etcd-real is not etcd $release"
# --build-only: the binaries only (`cargo xtask test` builds them while its tests run).
[ "$build_only" = 0 ] || exit 0

# The framework resolves ../fixtures against its working directory: run in <dir>/suite with
# <dir>/fixtures = the module's fixtures.
testdir="$(cd "$MODDIR" && go list -m -f '{{.Dir}}' go.etcd.io/etcd/tests/v3)"
[ -d "$testdir/fixtures" ] || die "no fixtures in $testdir (go mod download go.etcd.io/etcd/tests/v3)"

for p in "${proxies[@]}"; do
  if [ "$p" = cache ]; then
    bin="${ETCD_CACHE_PROXY_BIN:-$ROOT/target/debug/etcd-cache-proxy}"
    if [ ! -x "$bin" ]; then
      log "building etcd-cache-proxy (cargo build -p etcd-cache-proxy)"
      (cd "$ROOT" && env -u CARGO_TARGET_DIR nice -n 10 cargo build -p etcd-cache-proxy) >"$out/cargo.log" 2>&1 \
        || { tail -30 "$out/cargo.log" >&2; die "cargo build failed"; }
      bin="$ROOT/target/debug/etcd-cache-proxy"
    fi
    # A copy, so a rebuild during the run does not change the proxy under test.
    cp -f "$bin" "$out/etcd-cache-proxy"
    export ETCD_CACHE_PROXY_BIN="$out/etcd-cache-proxy"
    log "etcd-cache-proxy: $bin ($("$bin" --version 2>/dev/null))"
  fi
done

# ---- run ---------------------------------------------------------------------------------
# One job = one proxy x one suite:regex. The framework's ports are fixed (20000 + 5*member),
# so jobs run one after another, unless --jobs N > 1, which puts each job but the first in a
# network namespace of its own (`unshare --net`, root only).
jobs_list=()
for p in "${proxies[@]}"; do for s in "${specs[@]}"; do jobs_list+=("$p|$s"); done; done

run_job() { # index proxy suite regex
  local i="$1" p="$2" suite="$3" re="$4"
  local dir="$out/$i-$p-$suite"
  mkdir -p "$dir/run/$suite" "$dir/proxy-logs"
  ln -sfn "$testdir/fixtures" "$dir/run/fixtures"
  local cmd=("$BUILD/$suite.test" -test.v -test.timeout "$timeout" -bin-dir "$BUILD/bin")
  local t0=$SECONDS
  (
    cd "$dir/run/$suite" || exit 2
    # By default each top-level test runs in a binary of its own: a test that fails and
    # leaves a process behind makes every later test in the same binary skip ("Found leaked
    # goroutine BEFORE test"), and a -test.timeout panic ends the whole binary.
    local names=("$re")
    if [ "$isolate" = 1 ]; then
      mapfile -t names < <("$BUILD/$suite.test" -test.list "$re" -bin-dir "$BUILD/bin" 2>/dev/null | grep '^Test' | sed 's/.*/^&$/')
    fi
    # etcd's framework passes only ETCD_*, ETCDCTL_*, EXPECT_* and PATH to what it starts.
    export ETCD_E2E_PROXY="$p" ETCD_E2E_PROXY_LOG_DIR="$dir/proxy-logs" ETCD_E2E_REAL_ETCD="$BUILD/bin/etcd-real"
    unset E2E_PROXY E2E_PROXY_LOG_DIR E2E_REAL_ETCD
    local rc=0 n
    one() {
      # The first job keeps the host's network (TestEtcdPeerLocalAddr needs a route out);
      # the others get a namespace each, so the framework's fixed ports do not meet.
      if [ "$jobs" -gt 1 ] && [ "$i" -gt 1 ]; then
        nice -n 10 unshare --net -- sh -c 'ip link set lo up 2>/dev/null || true; exec "$@"' sh "${cmd[@]}" -test.run "$1"
      else
        nice -n 10 "${cmd[@]}" -test.run "$1"
      fi
    }
    for n in "${names[@]}"; do
      local tries=0
      while true; do
        # An etcd started without --data-dir leaves <name>.etcd here (TestBootstrapDefragFlag),
        # and the next test's etcd would start from it (TestSnapshotCatchupEntriesFlag then
        # waits in vain for a new member's log line): each test starts without them.
        [ "$isolate" = 1 ] && rm -rf ./*.etcd
        one "$n" >"$dir/last.log" 2>&1 && { cat "$dir/last.log"; break; }
        cat "$dir/last.log"
        rc=1
        [ "$isolate" = 1 ] && [ "$tries" -lt "$retries" ] || break
        # Failures that exceptions.tsv expects are not run again.
        python3 "$HERE/report.py" --expected "$suite" "$p" "$dir/last.log" && break
        tries=$((tries + 1))
        # report.py reads this line: results after it are the retry's.
        echo "run.sh: RETRY $tries $n"
      done
    done
    rm -f "$dir/last.log"
    exit $rc
  ) >"$dir/test.log" 2>&1
  echo $? >"$dir/rc"
  echo $((SECONDS - t0)) >"$dir/seconds"
}

t_all=$SECONDS
i=0; running=0
for j in "${jobs_list[@]}"; do
  i=$((i + 1))
  IFS='|' read -r p spec <<<"$j"
  suite="${spec%%:*}"; re="${spec#*:}"
  log "[$i/${#jobs_list[@]}] $p $suite -test.run '$re' -> $out/$i-$p-$suite/test.log"
  if [ "$jobs" -gt 1 ]; then
    run_job "$i" "$p" "$suite" "$re" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
  else
    run_job "$i" "$p" "$suite" "$re"
    log "[$i/${#jobs_list[@]}] done in $(cat "$out/$i-$p-$suite/seconds") s (exit $(cat "$out/$i-$p-$suite/rc"))"
  fi
done
wait

# ---- report ------------------------------------------------------------------------------
python3 "$HERE/report.py" "$out" "$((SECONDS - t_all))"
