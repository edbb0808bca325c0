# Sourced by e2e/run.sh and robustness/run.sh after their `log` and `die`; each defines
# `build_steps` (the Go builds of its suite) before it calls `run_build LOG`.
#
# Runs build_steps in a subshell of its own, where `set -e` holds: on the left of `||` a
# subshell runs with it off, and a failed step went unnoticed until a binary was missing. Three
# attempts, each failure's log shown: the Go module proxy's refusals are mostly transient.
run_build() {
  local logf="$1" attempt
  for attempt in 1 2 3; do
    ( build_steps ) >"$logf" 2>&1 &
    if wait $!; then return 0; fi
    tail -30 "$logf" >&2
    [ "$attempt" = 3 ] && break
    log "build attempt $attempt failed (its log's end is above); retrying in $((attempt * 15)) s"
    sleep $((attempt * 15))
  done
  die "build failed 3 times (log: $logf)"
}
