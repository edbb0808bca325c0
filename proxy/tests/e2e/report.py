#!/usr/bin/env python3
"""Reads the `go test -v` logs of run.sh's jobs (<out>/<i>-<proxy>-<suite>/test.log) and prints
one line per test leaf, the failures' first relevant lines, the tests that fail through
etcd-cache-proxy but pass through grpc-proxy, and last `N passed, M failed, K skipped`.
Also writes <out>/results.tsv (proxy, suite, test, result, seconds).

A failure through etcd-cache-proxy that exceptions.tsv (beside this file) lists is XFAIL, an
expected failure with the reason given there, and is not counted as failed; a listed test
that passes is reported as XPASS (the list should then lose it). A test run again by
run.sh --retries that passed on a retry is PASS and listed as flaky.
Exit 1 when anything failed (and was not expected to) or never finished."""

import os
import re
import sys

RESULT = re.compile(r"^(\s*)--- (PASS|FAIL|SKIP): (\S+) \(([\d.]+)s\)")
RUN = re.compile(r"^=== (RUN|CONT|PAUSE|NAME)\s+(\S+)")
RETRY = re.compile(r"^run\.sh: RETRY \d+ ")
# A failure's own lines: assertion output and t.Fatal/t.Error from test files, not the
# framework's process logs (logger.go / zaptest) that fill -v output.
RELEVANT = re.compile(
    r"(^\s+[\w.-]+\.go:\d+:|Error Trace:|\bError:|Messages:|panic:|test timed out|"
    r"expected|unexpected|FAIL:)",
    re.I,
)
NOISE = re.compile(
    r"logger\.go:\d+:|\t(DEBUG|INFO|WARN)\t|\"level\":\"(info|debug|warn)\"|"
    r"Changing working directory|closing test cluster|closed test cluster|Creating cluster|"
    r"Error Trace:|\bTest:\s"
)
# etcd-cache-proxy's and the wrapper's lines worth showing with a failure.
PROXY_RELEVANT = re.compile(r"\b(WARN|ERROR)\b|e2e etcd wrapper: .*(did not serve|exited)|panicked")
TS = re.compile(r"^\S+Z\s+")

NAMES = {"cache": "etcd-cache-proxy", "grpc-proxy": "grpc-proxy"}


def load_exceptions():
    """exceptions.tsv -> [(suite, compiled full-match regex over the leaf name, reason)]."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exceptions.tsv")
    out = []
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return out
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        suite, pattern, reason = line.split("\t", 2)
        out.append((suite, re.compile(pattern), reason))
    return out


def expected(exceptions, suite, name):
    """The reason `name` of `suite` may fail through etcd-cache-proxy, or None."""
    for s, pat, reason in exceptions:
        if s == suite and pat.fullmatch(name):
            return reason
    return None


def parse(path):
    """-> (results {name: (status, secs)}, started [names], blocks {name: [lines]}, flaky {names})"""
    results, started, blocks, flaky = {}, [], {}, set()
    failed_before = set()
    current = None
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return {}, [], {}, set()
    for line in lines:
        if RETRY.match(line):
            # What failed so far is run again; a leaf that passes now was flaky.
            failed_before |= {n for n, (st, _) in results.items() if st == "FAIL"}
            continue
        m = RUN.match(line)
        if m:
            current = m.group(2)
            if m.group(1) == "RUN":
                started.append(current)
            blocks.setdefault(current, [])
            continue
        m = RESULT.match(line)
        if m:
            results[m.group(3)] = (m.group(2), float(m.group(4)))
            if m.group(2) == "PASS" and m.group(3) in failed_before:
                flaky.add(m.group(3))
            continue
        if current is not None:
            blocks[current].append(line)
    return results, started, blocks, flaky


def leaves(names):
    s = set(names)
    return [n for n in names if not any(o.startswith(n + "/") for o in s)]


def tempdir_name(name):
    """The directory part Go's t.TempDir() makes of a test name (testing.go's mapper, 64 max)."""
    allowed = "!#$%&()+,-.=@^_{}~ "
    out = "".join(c for c in name if (c.isascii() and (c.isalnum() or c in allowed)) or (not c.isascii() and c.isalnum()))
    return out[:64]


def proxy_lines(name, logdir, limit=4):
    """WARN/ERROR lines of the proxies the test (or its parent) started: a proxy's log starts
    with its grpc-proxy command line, whose --data-dir is under the test's t.TempDir()."""
    try:
        files = sorted(os.listdir(logdir))
    except OSError:
        return []
    heads = {}
    for f in files:
        try:
            with open(os.path.join(logdir, f), errors="replace") as fh:
                heads[f] = fh.readline()
        except OSError:
            pass
    for key in [name] + [name.rsplit("/", k)[0] for k in range(1, name.count("/") + 1)]:
        pat = re.compile(r"--data-dir[ =]\S*/" + re.escape(tempdir_name(key)) + r"\d+/")
        mine = [f for f in files if pat.search(heads.get(f, ""))]
        if not mine:
            continue
        seen, out = set(), []
        for f in mine:
            for line in open(os.path.join(logdir, f), errors="replace"):
                if not PROXY_RELEVANT.search(line):
                    continue
                text = TS.sub("", line.strip())
                if text in seen:
                    continue
                seen.add(text)
                out.append(f"[proxy {f}] {text}")
                if len(out) >= limit:
                    return out
        return out
    return []


def excerpt(name, blocks, proxy_logs, limit=8):
    """The first relevant lines of a failed test's output (its own block and its parents')."""
    lines = []
    for key in [name] + [name.rsplit("/", k)[0] for k in range(1, name.count("/") + 1)]:
        for line in blocks.get(key, []):
            if NOISE.search(line):
                continue
            if RELEVANT.search(line) or (lines and lines[-1].lstrip().startswith("Error:")):
                if line.strip() and line.strip() not in lines:
                    lines.append(line.strip())
            if len(lines) >= limit:
                break
        if lines:
            break
    return lines


def only_expected(suite, proxy, log):
    """Exit 0 when every failed leaf in `log` (one test's run) is one exceptions.tsv expects
    through `proxy`, else 1 (run.sh then runs the test again)."""
    results, started, _, _ = parse(log)
    names = list(dict.fromkeys(started + list(results)))
    exceptions = load_exceptions() if proxy == "cache" else []
    failed = [n for n in leaves(names) if results.get(n, ("FAIL", 0))[0] == "FAIL"]
    ok = bool(failed) and all(expected(exceptions, suite, n) for n in failed)
    sys.exit(0 if ok else 1)


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--expected":
        only_expected(sys.argv[2], sys.argv[3], sys.argv[4])
    out, seconds = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "?"
    jobs = sorted(
        (d for d in os.listdir(out) if re.match(r"^\d+-", d) and os.path.isdir(os.path.join(out, d))),
        key=lambda d: int(d.split("-", 1)[0]),
    )
    exceptions = load_exceptions()
    table = {}  # (suite, name) -> {proxy: status}
    totals = {"PASS": 0, "FAIL": 0, "SKIP": 0, "XFAIL": 0}
    xpass, flaky_all = [], []
    failures = []  # (proxy, suite, name, lines)
    tsv = []
    summaries = []
    for d in jobs:
        _, rest = d.split("-", 1)
        proxy, suite = rest.rsplit("-", 1)
        jdir = os.path.join(out, d)
        results, started, blocks, flaky = parse(os.path.join(jdir, "test.log"))
        names = list(dict.fromkeys(started + list(results)))
        counts = {"PASS": 0, "FAIL": 0, "SKIP": 0, "XFAIL": 0}
        rc = open(os.path.join(jdir, "rc")).read().strip() if os.path.exists(os.path.join(jdir, "rc")) else "?"
        secs = open(os.path.join(jdir, "seconds")).read().strip() if os.path.exists(os.path.join(jdir, "seconds")) else "?"
        for n in leaves(names):
            status, t = results.get(n, ("FAIL", 0.0))
            unfinished = n not in results
            reason = expected(exceptions, suite, n) if proxy == "cache" else None
            if n in flaky:
                flaky_all.append(f"{NAMES.get(proxy, proxy)} {suite} {n}")
            if reason and status == "PASS":
                xpass.append(f"{NAMES.get(proxy, proxy)} {suite} {n} (listed: {reason})")
            if reason and status == "FAIL":
                status = "XFAIL"
            counts[status] += 1
            totals[status] += 1
            table.setdefault((suite, n), {})[proxy] = status
            tsv.append(f"{NAMES.get(proxy, proxy)}\t{suite}\t{n}\t{status}\t{t}")
            note = " (no result: timed out or crashed)" if unfinished else ""
            if status == "XFAIL":
                note += f" (expected: {reason})"
            print(f"{status} {NAMES.get(proxy, proxy)} {suite} {n} ({t}s){note}")
            if status == "FAIL":
                ex = excerpt(n, blocks, None) + proxy_lines(n, os.path.join(jdir, "proxy-logs"))
                if unfinished:
                    ex = ex + ["(no --- PASS/FAIL line: the binary timed out or crashed, see test.log)"]
                failures.append((proxy, suite, n, ex, jdir))
        if not names and rc not in ("0", "?"):
            counts["FAIL"] += 1
            totals["FAIL"] += 1
            print(f"FAIL {NAMES.get(proxy, proxy)} {suite} (binary exited {rc} before any test: see {jdir}/test.log)")
        summaries.append(
            f"[{NAMES.get(proxy, proxy)} {suite}] {counts['PASS']} pass, {counts['FAIL']} fail, "
            f"{counts['XFAIL']} expected failures, {counts['SKIP']} skip in {secs} s "
            f"(exit {rc}; {jdir}/test.log)"
        )
    with open(os.path.join(out, "results.tsv"), "w") as f:
        f.write("proxy\tsuite\ttest\tresult\tseconds\n" + "\n".join(tsv) + "\n")

    if failures:
        print("\nfailures (first relevant lines; proxy logs in <job>/proxy-logs/):")
        for proxy, suite, n, ex, jdir in failures:
            print(f"  {NAMES.get(proxy, proxy)} {suite} {n}")
            for line in ex or ["(no assertion line found: see test.log)"]:
                print(f"      {line[:300]}")

    proxies = {p for v in table.values() for p in v}
    if {"cache", "grpc-proxy"} <= proxies:
        diff = [(s, n) for (s, n), v in table.items() if v.get("cache") == "FAIL" and v.get("grpc-proxy") == "PASS"]
        both = [(s, n) for (s, n), v in table.items() if v.get("cache") == "FAIL" and v.get("grpc-proxy") == "FAIL"]
        print(f"\nfail through etcd-cache-proxy, pass through grpc-proxy: {len(diff)}")
        for s, n in sorted(diff):
            print(f"  {s} {n}")
        if both:
            print(f"fail through both: {len(both)}")
            for s, n in sorted(both):
                print(f"  {s} {n}")
    if flaky_all:
        print(f"\nflaky (failed, then passed when run again): {len(flaky_all)}")
        for line in flaky_all:
            print(f"  {line}")
    if xpass:
        print(f"\nlisted in exceptions.tsv but passed (take them off the list): {len(xpass)}")
        for line in xpass:
            print(f"  {line}")
    print()
    for s in summaries:
        print(s)
    print(f"results: {out}/results.tsv; wall time {seconds} s")
    line = f"{totals['PASS']} passed, {totals['FAIL']} failed"
    if totals["XFAIL"]:
        line += f", {totals['XFAIL']} expected failures (exceptions.tsv)"
    if totals["SKIP"]:
        line += f", {totals['SKIP']} skipped"
    print(line)
    sys.exit(1 if totals["FAIL"] else 0)


if __name__ == "__main__":
    main()
