#!/usr/bin/env python3
"""Explains a linearization failure from the suite's history.html (porcupine's visualisation).

  explain.py HISTORY_HTML [WINDOW_SECONDS]

Prints, for each partition porcupine could not linearize: the operations of the largest partial
linearization's end, the earliest operations left out of it (by start time), and every
compaction and write within WINDOW_SECONDS (default 0.15) of the first one left out, with their
start/end times in seconds from the run's start and the revisions they answered.
"""
import json
import re
import sys


def load(path):
    s = open(path).read()
    i = s.find("const data =")
    if i < 0:
        sys.exit("no 'const data =' in %s" % path)
    data, _ = json.JSONDecoder().raw_decode(s[i + len("const data ="):].lstrip())
    return data


def fmt(o):
    return "client %-3s %8.4f-%8.4f  %s" % (o["ClientId"], o["Start"] / 1e9, o["End"] / 1e9,
                                           o["Description"][:260])


def main():
    path = sys.argv[1]
    window = float(sys.argv[2]) if len(sys.argv) > 2 else 0.15
    for n, p in enumerate(load(path)):
        h = p["History"]
        pls = p.get("PartialLinearizations") or []
        best = max(pls, key=len) if pls else []
        idx = [x["Index"] if isinstance(x, dict) else x for x in best]
        if len(idx) == len(h):
            continue
        inl = set(idx)
        left = sorted((j for j in range(len(h)) if j not in inl), key=lambda j: h[j]["Start"])
        print("partition %d: %d operations, the largest linearization holds %d" % (n, len(h), len(idx)))
        print("  its last operations:")
        for j in idx[-5:]:
            print("    " + fmt(h[j]))
        print("  the first left out:")
        for j in left[:4]:
            print("    " + fmt(h[j]))
        t0 = h[left[0]]["Start"] / 1e9
        print("  compactions and writes within %.2f s of %.4f:" % (window, t0))
        for o in sorted(h, key=lambda o: o["Start"]):
            d = o["Description"]
            if abs(o["Start"] / 1e9 - t0) > window and abs(o["End"] / 1e9 - t0) > window:
                continue
            if d.startswith("compact") or re.match(r"(put|delete|txn|if\()", d):
                print("    " + fmt(o))


if __name__ == "__main__":
    main()
