#!/usr/bin/env python3
"""Checks and compares run.sh's records: compare.py DIR... (one per target, e.g. proxy direct).

Per target: each watcher's events (kubectl's watch `a`, the raw watch `b` from a past resource
version, the WatchList `c`: round 1's state as initial events up to the bookmark that ends
them, then the later rounds' changes; the Secrets watch `s`: every Secret's create and delete) in
resourceVersion order, none missing, none twice, each the expected create/update/delete with
the expected data; every chunked list equal to the state the workload left, the final one on
every kube-apiserver (ConfigMaps, and Secrets: those named sec-, any other only counted); consistent reads that fell back to
etcd (apiserver_watch_cache_consistent_read_total{fallback="true"}); the watch cache's
consistency checks against etcd (apiserver_storage_consistency_checks_total: at least 2 passed
on ConfigMaps per kube-apiserver, none failed); with --kcm the Deployment's 5 Pods (with
--scheduler each unschedulable); etcd's watchers (etcd_debugging_mvcc_watcher_total), its
compactions, and its CPU per write over the rounds (all of it, and net of its rate while idle).
Across targets: the final lists equal (names and data, ConfigMaps and Secrets). Prints a table; exits 1 on any failed check or difference.
"""
import base64
import binascii
import glob
import json
import os
import re
import sys


def load_concatenated(path):
    """Every JSON value of a file of concatenated JSON values (kubectl -o json -w, raw watch)."""
    if not os.path.exists(path):
        return []
    text = open(path).read()
    dec, i, out = json.JSONDecoder(), 0, []
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        try:
            v, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out  # a last value cut by the kill
        out.append(v)


def expected(p):
    """Per name: its events [(type, data k)], and the state after each round {name: data k}."""
    events, states, state = {}, [], {}
    for r in range(1, p["rounds"] + 1):
        for w in p["writers"]:
            for i in range(p["n"]):
                name = f"cm-{w}-{r}-{i:03d}"
                evs = [("ADDED", f"v1-{w}-{r}-{i}")]
                state[name] = f"v1-{w}-{r}-{i}"
                if i < p["upd"]:
                    evs.append(("MODIFIED", f"v2-{w}-{r}-{i}"))
                    state[name] = f"v2-{w}-{r}-{i}"
                if i < p["del"]:
                    evs.append(("DELETED", state[name]))
                    del state[name]
                events[name] = evs
        states.append(dict(state))
    return events, states


def expected_secrets(p):
    """The Secrets' (sec-WRITER-ROUND-III): per name its events [(type, data k decoded)], and the
    state after the last round {name: data k decoded}: per round and writer n created, the
    first del deleted."""
    events, state = {}, {}
    for r in range(1, p["rounds"] + 1):
        for w in p["writers"]:
            for i in range(p["n"]):
                name, v = f"sec-{w}-{r}-{i:03d}", f"v1-{w}-{r}-{i}"
                events[name] = [("ADDED", v)]
                state[name] = v
                if i < p["del"]:
                    events[name].append(("DELETED", v))
                    del state[name]
    return events, state


def cm_value(obj):
    """A ConfigMap's data k."""
    return (obj.get("data") or {}).get("k")


def secret_value(obj):
    """A Secret's data k, base64-decoded (the undecodable as is, so that it shows as a difference)."""
    k = (obj.get("data") or {}).get("k")
    try:
        return base64.b64decode(k, validate=True).decode() if k is not None else None
    except (binascii.Error, UnicodeDecodeError):
        return f"undecodable {k!r}"


def check_watch(evs, want, bookmarks=False, prefix="cm-", value=cm_value):
    """(events seen, problems[]) for one watcher's events against the expected per-name events
    (only objects named `prefix`...; `value` their data)."""
    problems, last_rv, got = [], 0, {}
    for e in evs:
        if e.get("type") == "BOOKMARK" and bookmarks:
            continue
        if e.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
            problems.append(f"event of type {e.get('type')}: {str(e)[:200]}")
            continue
        md = e["object"]["metadata"]
        if not md["name"].startswith(prefix):
            continue  # kube-controller-manager's kube-root-ca.crt (run.sh --kcm), any other Secret
        rv = int(md["resourceVersion"])
        if rv <= last_rv:
            problems.append(f"resourceVersion {rv} after {last_rv} ({e['type']} {md['name']})")
        last_rv = max(last_rv, rv)
        got.setdefault(md["name"], []).append((e["type"], value(e["object"])))
    for name in sorted(set(want) | set(got)):
        if got.get(name, []) != want.get(name, []):
            problems.append(f"{name}: want {want.get(name, [])}, got {got.get(name, [])}")
    return sum(len(v) for v in got.values()), problems


def check_watch_list(evs, state, want):
    """(events seen, problems[]) for the WatchList watcher: its initial events (up to the bookmark
    annotated k8s.io/initial-events-end) against `state`, the events after it against `want`."""
    end = next((i for i, e in enumerate(evs) if e.get("type") == "BOOKMARK" and
                (e["object"]["metadata"].get("annotations") or {}).get("k8s.io/initial-events-end") == "true"),
               None)
    if end is None:
        return 0, ["no bookmark ends the initial events"]
    problems, initial = [], {}
    for e in evs[:end]:
        md = e["object"]["metadata"]
        if e.get("type") != "ADDED":
            problems.append(f"initial event of type {e.get('type')} ({md.get('name')})")
        elif md["name"].startswith("cm-"):
            if md["name"] in initial:
                problems.append(f"initial event twice: {md['name']}")
            initial[md["name"]] = (e["object"].get("data") or {}).get("k")
    if initial != state:
        problems.append(f"initial events: {len(initial)} objects, want {len(state)}; "
                        f"differ: {sorted(set(initial.items()) ^ set(state.items()))[:5]}")
    n, probs = check_watch(evs[end + 1:], want, bookmarks=True)
    return n + len(initial), problems + probs


def items(path, prefix="cm-", value=cm_value, others=None):
    """({name: data} of a list's objects named `prefix`..., error); the names of the others are
    added to the set `others` when given."""
    try:
        lst = json.load(open(path))
    except (OSError, ValueError) as e:
        return None, f"{path}: {e}"
    if others is not None:
        others.update(i["metadata"]["name"] for i in lst["items"] if not i["metadata"]["name"].startswith(prefix))
    return {i["metadata"]["name"]: value(i) for i in lst["items"]
            if i["metadata"]["name"].startswith(prefix)}, None


def metric_sum(path, name, label_re="", number=int):
    """Sum of a metric's samples whose labels match label_re; None when the file or metric is absent."""
    if not os.path.exists(path):
        return None
    total, seen = 0.0, False
    for line in open(path):
        m = re.match(rf"^{name}(\{{[^}}]*\}})?\s+(\S+)", line)
        if m and re.search(label_re, m.group(1) or ""):
            total += float(m.group(2))
            seen = True
    return number(total) if seen else None


def per_write(d, prefix, p):
    """CPU per etcd revision (write) of a process over the workload's rounds (the latency probe
    and the waits after them left out), in microseconds: all of it, and net of the process's
    CPU rate while the control plane idled for 10 s before the rounds. "-" when the process
    restarted in between."""
    if {"etcd": "etcd-restart", "proxy": "proxy-kill"}[prefix] in p.get("faults", []):
        return "-"
    kind = "metrics" if prefix == "etcd" else "cpu"
    cpu = {s: metric_sum(os.path.join(d, f"{prefix}-{kind}-{s}.txt"), "process_cpu_seconds_total", number=float)
           for s in ("idle", "start", "rounds")}
    revs = [metric_sum(os.path.join(d, f"etcd-metrics-{s}.txt"), "etcd_debugging_mvcc_current_revision")
            for s in ("start", "rounds")]
    try:
        t = {k: float(v) for k, v in (line.split() for line in open(os.path.join(d, "times.txt")))}
    except (OSError, ValueError):
        t = {}
    if None in cpu.values() or None in revs or revs[1] <= revs[0] or len(t) < 3:
        return "-"
    writes = revs[1] - revs[0]
    idle_rate = (cpu["start"] - cpu["idle"]) / (t["start"] - t["idle"])
    busy = cpu["rounds"] - cpu["start"]
    net = busy - idle_rate * (t["rounds"] - t["start"])
    return f"{busy / writes * 1e6:.0f} ({net / writes * 1e6:.0f} net) us"


def check_pods(d, p):
    """Problems with the Deployment's Pods and ReplicaSet (run.sh --kcm), and a summary."""
    try:
        pods = json.load(open(os.path.join(d, "pods.json")))["items"]
        rss = json.load(open(os.path.join(d, "replicasets.json")))["items"]
    except (OSError, ValueError, KeyError) as e:
        return [f"pods or replicasets: {e}"], "-"
    live = [x for x in pods if not x["metadata"].get("deletionTimestamp")]
    problems = []
    if len(live) != 5:
        problems.append(f"{len(live)} Pods of the Deployment, want 5")
    if len(rss) != 1 or rss[0].get("spec", {}).get("replicas") != 5:
        problems.append(f"ReplicaSets: {[(r['metadata']['name'], r.get('spec', {}).get('replicas')) for r in rss]}, want one of 5")
    unsched = sum(1 for x in live if any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                                         for c in x.get("status", {}).get("conditions", [])))
    if p.get("scheduler") and unsched != len(live):
        problems.append(f"{unsched} of {len(live)} Pods marked unschedulable by kube-scheduler")
    return problems, f"{len(live)} pods, {len(rss)} rs" + (f", {unsched} unsched." if p.get("scheduler") else "")


def target(d):
    p = json.load(open(os.path.join(d, "params.json")))
    want_events, want_states = expected(p)
    row, problems = {"target": p["target"], "etcd": p["etcd"], "seconds": p["seconds"]}, []
    for w in ("a", "b", "c"):
        evs = load_concatenated(os.path.join(d, f"watch-{w}.json"))
        if w == "c":
            later = {k: v for k, v in want_events.items() if not re.match(r"cm-[^-]+-1-", k)}
            n, probs = check_watch_list(evs, want_states[0], later)
            total = len(want_states[0]) + sum(len(v) for v in later.values())
        else:
            n, probs = check_watch(evs, want_events)
            total = sum(len(v) for v in want_events.values())
        row[f"watch {w} events"] = f"{n}/{total}"
        row[f"watch {w} problems"] = len(probs)
        problems += [f"watch {w}: {x}" for x in probs]
    bad_lists = 0
    for r, want in enumerate(want_states, 1):
        got, err = items(os.path.join(d, f"list-r{r}.json"))
        if got != want:
            bad_lists += 1
            problems.append(err or f"list after round {r}: {len(got)} objects, want {len(want)}; "
                            f"differ: {sorted(set(got.items()) ^ set(want.items()))[:5]}")
    final, err = items(os.path.join(d, "list-final.json"))
    if final != want_states[-1]:
        bad_lists += 1
        problems.append(err or "final list differs from the workload's state")
    for f in sorted(glob.glob(os.path.join(d, "list-final-*.json"))):
        got, err = items(f)
        if got != want_states[-1]:
            bad_lists += 1
            problems.append(err or f"{os.path.basename(f)} differs from the workload's state")
    row["chunked lists wrong"] = bad_lists
    row["final objects"] = len(final or {})
    final_secrets = None
    if p.get("secrets"):
        # The Secrets: watcher s (kubectl get secrets -w, before any write) and the final chunked
        # list on every kube-apiserver; Secrets not named sec- (none on v1.37 without kcm's
        # legacy token controller) are left out and counted.
        want_sec_events, want_sec_state = expected_secrets(p)
        n, probs = check_watch(load_concatenated(os.path.join(d, "watch-s.json")), want_sec_events,
                               prefix="sec-", value=secret_value)
        row["watch s events"] = f"{n}/{sum(len(v) for v in want_sec_events.values())}"
        row["watch s problems"] = len(probs)
        problems += [f"watch s: {x}" for x in probs]
        bad_sec, others, finals_sec = 0, set(), sorted(glob.glob(os.path.join(d, "secrets-final-*.json")))
        if not finals_sec:
            bad_sec += 1
            problems.append("no final Secret list (secrets-final-*.json)")
        for f in finals_sec:
            got, err = items(f, "sec-", secret_value, others)
            if f.endswith("-0.json"):
                final_secrets = got
            if got != want_sec_state:
                bad_sec += 1
                problems.append(err or f"{os.path.basename(f)}: {len(got)} Secrets, want {len(want_sec_state)}; "
                                f"differ: {sorted(set(got.items()) ^ set(want_sec_state.items()))[:5]}")
        row["secret lists wrong"] = bad_sec
        row["final secrets"] = len(final_secrets or {})
        row["other secrets in ns"] = len(others)
    ams = sorted(glob.glob(os.path.join(d, "apiserver-metrics*.txt")))

    def over_apiservers(name, labels):
        vals = [metric_sum(am, name, labels) for am in ams]
        return None if all(v is None for v in vals) else sum(v or 0 for v in vals)
    row["kube-apiservers"] = p.get("apiservers", 1)
    row["consistent reads (cache)"] = over_apiservers("apiserver_watch_cache_consistent_read_total", 'fallback="false"')
    fb = over_apiservers("apiserver_watch_cache_consistent_read_total", 'fallback="true"')
    row["consistent-read fallbacks"] = "absent" if fb is None else fb
    if fb:
        problems.append(f"{fb} consistent reads fell back to etcd")
    if p.get("watch_cache", True):
        cc = "apiserver_storage_consistency_checks_total"
        ok = [metric_sum(am, cc, 'resource="configmaps".*status="success"') or 0 for am in ams]
        bad = over_apiservers(cc, 'status="failure"') or 0
        err = over_apiservers(cc, 'status="error"') or 0
        row["consistency checks ok/failed/error"] = f"{over_apiservers(cc, 'status=.success.') or 0}/{bad}/{err}"
        if bad:
            problems.append(f"{bad} watch-cache consistency checks failed")
        if min(ok, default=0) < 2:
            problems.append(f"ConfigMaps' consistency check passed {ok} times per kube-apiserver, want 2 each")
    em = os.path.join(d, "etcd-metrics.txt")
    row["etcd watchers"] = metric_sum(em, "etcd_debugging_mvcc_watcher_total")
    row["etcd watch streams"] = metric_sum(em, "etcd_debugging_mvcc_watch_stream_total")
    row["etcd CPU per write"] = per_write(d, "etcd", p)
    try:
        row["etcd compactions"] = int(open(os.path.join(d, "etcd-compactions.txt")).read().strip() or 0)
    except (OSError, ValueError):
        row["etcd compactions"] = None
    try:
        lat = json.load(open(os.path.join(d, "latency.json")))
        row["watch latency p50/p99/max"] = f"{lat['p50_ms']}/{lat['p99_ms']}/{lat['max_ms']} ms"
        if lat["received"] != lat["count"] or lat["errors"]:
            problems.append(f"latency probe: {lat['received']} of {lat['count']} events, {lat['errors']} errors")
    except (OSError, ValueError, KeyError) as e:
        row["watch latency p50/p99/max"] = None
        problems.append(f"latency probe: {e}")
    if p.get("kcm"):
        probs, row["deployment"] = check_pods(d, p)
        problems += probs
    pm = os.path.join(d, "proxy-metrics.txt")
    if os.path.exists(pm):
        row["proxy watches created (cache/etcd)"] = "%s/%s" % (
            metric_sum(pm, "etcd_cache_proxy_watches_created_total", 'served="cache"'),
            metric_sum(pm, "etcd_cache_proxy_watches_created_total", 'served="etcd"'))
        # Where they are at the end: a watch created with etcd (below the cache's window,
        # as after a proxy restart) comes back to the cache once etcd has caught it up.
        row["proxy watches at the end (cache/etcd)"] = "%s/%s" % (
            metric_sum(pm, "etcd_cache_proxy_watches", 'served="cache"'),
            metric_sum(pm, "etcd_cache_proxy_watches", 'served="etcd"'))
        row["proxy watches back to the cache"] = metric_sum(pm, "etcd_cache_proxy_watches_rejoined_total")
        row["proxy CPU per write"] = per_write(d, "proxy", p)
    else:
        for k in ("proxy watches created (cache/etcd)", "proxy watches at the end (cache/etcd)",
                  "proxy watches back to the cache", "proxy CPU per write"):
            row[k] = "-"
    row["problems"] = len(problems)
    return row, problems, (final, final_secrets)


def main(dirs):
    rows, finals, failed = [], [], False
    for d in dirs:
        row, problems, final = target(d)
        rows.append(row)
        finals.append(final)
        for x in problems[:20]:
            print(f"[{row['target']}] {x}")
        if len(problems) > 20:
            print(f"[{row['target']}] ... {len(problems) - 20} more")
        failed |= bool(problems)
    if len(finals) > 1:
        same = all(f == finals[0] for f in finals[1:])
        for row in rows:
            row["final lists equal"] = "yes" if same else "NO"
        failed |= not same
    keys = [k for k in rows[0] if k != "target"]
    w = max(len(k) for k in keys)
    print(f"{'':<{w}}  " + "  ".join(f"{r['target']:>10}" for r in rows))
    for k in keys:
        print(f"{k:<{w}}  " + "  ".join(f"{'absent' if r.get(k) is None else r.get(k)!s:>10}" for r in rows))
    print("kubernetes: " + ("FAILED" if failed else "ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
