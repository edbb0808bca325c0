#!/usr/bin/env python3
"""Checks and compares run.sh's records: compare.py DIR... (one per target, e.g. proxy direct).

Per target: each watcher's events (kubectl's watch `a`, the raw watch `b` from a past resource
version) in resourceVersion order, none missing, none twice, each the expected create/update/
delete with the expected data; every chunked list equal to the state the workload left;
consistent reads that fell back to etcd (apiserver_watch_cache_consistent_read_total
{fallback="true"}); etcd's watchers (etcd_debugging_mvcc_watcher_total). Across targets: the
final lists equal (names and data). Prints a table; exits 1 on any failed check or difference.
"""
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


def check_watch(evs, want):
    """(events seen, problems[]) for one watcher's events against the expected per-name events."""
    problems, last_rv, got = [], 0, {}
    for e in evs:
        if e.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
            problems.append(f"event of type {e.get('type')}: {str(e)[:200]}")
            continue
        md = e["object"]["metadata"]
        if not md["name"].startswith("cm-"):
            continue  # kube-controller-manager's kube-root-ca.crt (run.sh --kcm)
        rv = int(md["resourceVersion"])
        if rv <= last_rv:
            problems.append(f"resourceVersion {rv} after {last_rv} ({e['type']} {md['name']})")
        last_rv = max(last_rv, rv)
        got.setdefault(md["name"], []).append((e["type"], (e["object"].get("data") or {}).get("k")))
    for name in sorted(set(want) | set(got)):
        if got.get(name, []) != want.get(name, []):
            problems.append(f"{name}: want {want.get(name, [])}, got {got.get(name, [])}")
    return sum(len(v) for v in got.values()), problems


def items(path):
    try:
        lst = json.load(open(path))
    except (OSError, ValueError) as e:
        return None, f"{path}: {e}"
    return {i["metadata"]["name"]: (i.get("data") or {}).get("k") for i in lst["items"]
            if i["metadata"]["name"].startswith("cm-")}, None


def metric_sum(path, name, label_re=""):
    """Sum of a metric's samples whose labels match label_re; None when the file or metric is absent."""
    if not os.path.exists(path):
        return None
    total, seen = 0.0, False
    for line in open(path):
        m = re.match(rf"^{name}(\{{[^}}]*\}})?\s+(\S+)", line)
        if m and re.search(label_re, m.group(1) or ""):
            total += float(m.group(2))
            seen = True
    return int(total) if seen else None


def target(d):
    p = json.load(open(os.path.join(d, "params.json")))
    want_events, want_states = expected(p)
    row, problems = {"target": p["target"], "etcd": p["etcd"], "seconds": p["seconds"]}, []
    for w, f in (("a", "watch-a.json"), ("b", "watch-b.json")):
        n, probs = check_watch(load_concatenated(os.path.join(d, f)), want_events)
        row[f"watch {w} events"] = f"{n}/{sum(len(v) for v in want_events.values())}"
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
    row["chunked lists wrong"] = bad_lists
    row["final objects"] = len(final or {})
    am = os.path.join(d, "apiserver-metrics.txt")
    row["consistent reads (cache)"] = metric_sum(am, "apiserver_watch_cache_consistent_read_total", 'fallback="false"')
    fb = metric_sum(am, "apiserver_watch_cache_consistent_read_total", 'fallback="true"')
    row["consistent-read fallbacks"] = "absent" if fb is None else fb
    if fb:
        problems.append(f"{fb} consistent reads fell back to etcd")
    row["etcd watchers"] = metric_sum(os.path.join(d, "etcd-metrics.txt"), "etcd_debugging_mvcc_watcher_total")
    row["etcd watch streams"] = metric_sum(os.path.join(d, "etcd-metrics.txt"), "etcd_debugging_mvcc_watch_stream_total")
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
    else:
        for k in ("proxy watches created (cache/etcd)", "proxy watches at the end (cache/etcd)",
                  "proxy watches back to the cache"):
            row[k] = "-"
    row["problems"] = len(problems)
    return row, problems, final


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
