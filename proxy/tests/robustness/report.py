#!/usr/bin/env python3
"""Reports run.sh's robustness runs.

  report.py OUT_DIR [SECONDS]   table per scenario x target, each failure with its validation,
                                OUT_DIR/results.tsv; exit 1 on a failure exceptions.tsv does
                                not expect
  report.py --line RUN_DIR      one line for one run (run.sh prints it as each run ends)

A run's result: PASS, FAIL (the validation that failed: linearization, a watch guarantee,
serializable reads, or the first error of the test), SKIP (the suite's reason, e.g. no gofail),
XFAIL/XSKIP (listed in exceptions.tsv, with its reason). The suite's report (member data,
client operations, history.html: porcupine's visualisation) is saved under RUN_DIR/results/
for failed runs (and every run with --persist).
"""
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

LEAF = re.compile(r"^\s*--- (PASS|FAIL|SKIP): (\S+) \(([\d.]+)s\)")


def load_exceptions():
    out = []
    path = os.path.join(HERE, "exceptions.tsv")
    if not os.path.exists(path):
        return out
    for line in open(path):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.rstrip("\n").split("\t")
        if len(parts) < 4:
            continue
        scen, target, kind, reason = parts[:4]
        detail = re.compile(parts[4]) if len(parts) > 4 and parts[4] else None
        out.append((re.compile(scen), target, kind, reason, detail))
    return out


def expected(exc, scenario, target, status, failpoint="", details=""):
    subject = "%s failpoint=%s" % (scenario, failpoint)
    for rx, tgt, kind, reason, detail in exc:
        if tgt not in ("*", target):
            continue
        if not rx.search(subject):
            continue
        if detail is not None and not detail.search(details):
            continue
        if kind == "fail" and status == "FAIL":
            return "XFAIL", reason
        if kind == "skip" and status == "SKIP":
            return "XSKIP", reason
    return None


def read_meta(d):
    meta = {}
    try:
        for line in open(os.path.join(d, "meta")):
            k, _, v = line.rstrip("\n").partition("\t")
            meta[k] = v
    except OSError:
        pass
    return meta


def analyse(d):
    meta = read_meta(d)
    scen = meta.get("scenario", "?")
    try:
        text = open(os.path.join(d, "test.log"), errors="replace").read()
    except OSError:
        text = ""
    lines = text.splitlines()
    leaves = []
    for l in lines:
        m = LEAF.match(l)
        if m:
            leaves.append((m.group(1), m.group(2), float(m.group(3))))
    # The deepest leaf decides; a failure anywhere is a failure.
    status = None
    name = scen
    if leaves:
        deepest = max(leaves, key=lambda x: x[1].count("/"))
        status, name = deepest[0], deepest[1]
        if any(x[0] == "FAIL" for x in leaves):
            status = "FAIL"
    rc = meta.get("rc")
    if status is None:
        status = "FAIL"
    if status == "PASS" and rc not in (None, "0"):
        status = "FAIL"
    failpoint = ""
    if name.startswith("TestRobustnessExploratory/") and name.count("/") >= 3:
        failpoint = name.split("/")[3]
    m = re.search(r'"failpoint":\s*"([^"]+)"', text)
    if m and not failpoint:
        failpoint = m.group(1)
    reason = ""
    if status == "SKIP":
        for l in lines:
            if "please run" in l or re.search(r"^\s+\S+\.go:\d+: ", l) and "SKIP" not in l:
                reason = l.strip()
                if "please run" in l:
                    break
    details = []
    if status == "FAIL":
        pats = [
            (r"failed triggering failpoint, err: ([^\n]*)", "failpoint not injected: {0}"),
            (r"Failed linearization", "linearization"),
            (r"Linearization has timed out", "linearization timed out"),
            (r"Failed validating watch history, err: (.*)", "watch: {0}"),
            (r"Failed validating serializable operations, err: (.*)", "serializable: {0}"),
            (r"Unhandled raft request[^\n]{0,200}", "WAL reader: {0}"),
            (r"Broke watch guarantee.*\"guarantee\": \"(\w+)\"", "watch guarantee {0}"),
            (r"Received unexpected error:\s*\n\s*([^\n]*)\n(?:[^\n]*\n){0,3}?\s*Messages:\s*([^\n]*)", "{1}: {0}"),
            (r"Traffic finished before failure was injected", "traffic finished before the failpoint was injected"),
            (r"Error:\s+Received unexpected error:\s*\n\s*([^\n]*)\n\s*Test:", "{0}"),
        ]
        for pat, fmt in pats:
            for mm in re.finditer(pat, text):
                s = fmt.format(*[g.strip() for g in mm.groups()]) if mm.groups() else fmt
                if fmt.startswith("WAL"):
                    s = "WAL reader: " + mm.group(0)[:200]
                if s not in details:
                    details.append(s)
        if not details:
            mm = re.search(r"panic: ([^\n]{0,200})", text)
            if mm:
                details.append("panic: " + mm.group(1))
        if not details:
            # The first error the test reported.
            for i, l in enumerate(lines):
                if "Error:" in l and i > 0:
                    details.append(l.strip()[:300])
                    break
                if re.search(r"^\s+\S+\.go:\d+: ", l) and "--- " not in l:
                    details.append(l.strip()[:300])
                    break
        if not leaves:
            details.append("no result: the test binary did not report (timeout or crash; exit %s)" % rc)
    results = ""
    m = re.search(r'Saving robustness test report[^\n]*"path":\s*"([^"]+)"', text)
    if m:
        results = m.group(1)
    elif os.path.isdir(os.path.join(d, "results")):
        results = os.path.join(d, "results")
    history = ""
    if results and os.path.exists(os.path.join(results, "history.html")):
        history = os.path.join(results, "history.html")
    return {
        "scenario": scen,
        "target": meta.get("target", "?"),
        "run": meta.get("run", "?"),
        "status": status,
        "failpoint": failpoint,
        "seconds": meta.get("seconds", ""),
        "reason": reason,
        "details": details,
        "results": history or results,
        "dir": d,
        "leaf": name,
    }


def line(r):
    extra = ""
    if r["failpoint"]:
        extra += " failpoint=%s" % r["failpoint"]
    if r["status"] in ("FAIL", "XFAIL"):
        extra += " :: " + "; ".join(r["details"][:4])
        if r["results"]:
            extra += " (report: %s)" % r["results"]
    if r["status"] in ("SKIP", "XSKIP"):
        extra += " :: " + r["reason"][:200]
    if r.get("expected"):
        extra += " (expected: %s)" % r["expected"]
    return "%-5s %-10s %s #%s (%ss)%s" % (r["status"], r["target"], r["scenario"], r["run"], r["seconds"], extra)


def run_dirs(out):
    for root, dirs, files in os.walk(out):
        if "meta" in files and "test.log" in files:
            dirs[:] = []
            yield root


def main():
    args = sys.argv[1:]
    exc = load_exceptions()
    if args and args[0] == "--line":
        r = analyse(args[1])
        e = expected(exc, r["scenario"], r["target"], r["status"], r["failpoint"], "; ".join(r["details"]))
        if e:
            r["status"], r["expected"] = e
        print(line(r), flush=True)
        return 0
    out = args[0]
    secs = args[1] if len(args) > 1 else None
    rs = []
    for d in sorted(run_dirs(out)):
        r = analyse(d)
        e = expected(exc, r["scenario"], r["target"], r["status"], r["failpoint"], "; ".join(r["details"]))
        if e:
            r["status"], r["expected"] = e
        rs.append(r)
    rs.sort(key=lambda r: (r["scenario"], r["target"], int(r["run"]) if r["run"].isdigit() else 0))
    with open(os.path.join(out, "results.tsv"), "w") as f:
        f.write("scenario\ttarget\trun\tstatus\tfailpoint\tseconds\tdetail\treport\n")
        for r in rs:
            detail = "; ".join(r["details"]) if r["status"] in ("FAIL", "XFAIL") else r["reason"]
            f.write("\t".join([r["scenario"], r["target"], r["run"], r["status"], r["failpoint"],
                               r["seconds"], detail.replace("\t", " "), r["results"]]) + "\n")
    targets = sorted({r["target"] for r in rs})
    scens = []
    for r in rs:
        if r["scenario"] not in scens:
            scens.append(r["scenario"])
    print()
    print("| scenario | " + " | ".join(targets) + " |")
    print("|---|" + "---|" * len(targets))
    for s in scens:
        cells = []
        for t in targets:
            sub = [r for r in rs if r["scenario"] == s and r["target"] == t]
            if not sub:
                cells.append("")
                continue
            counts = {}
            for r in sub:
                counts[r["status"]] = counts.get(r["status"], 0) + 1
            cells.append(", ".join("%d %s" % (v, k.lower()) for k, v in sorted(counts.items())))
        print("| %s | %s |" % (s, " | ".join(cells)))
    print()
    bad = [r for r in rs if r["status"] == "FAIL"]
    for r in rs:
        if r["status"] in ("FAIL", "XFAIL"):
            print(line(r))
            print("      log: %s" % os.path.join(r["dir"], "test.log"))
    counts = {}
    for r in rs:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = ", ".join("%d %s" % (v, k.lower()) for k, v in sorted(counts.items()))
    print("%s%s (results: %s)" % (summary or "no runs", " in %s s" % secs if secs else "",
                                  os.path.join(out, "results.tsv")))
    return 1 if bad or not rs else 0


if __name__ == "__main__":
    sys.exit(main())
