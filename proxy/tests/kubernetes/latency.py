#!/usr/bin/env python3
"""Watch latency as a kube-apiserver's client sees it: latency.py WRITE_URL WATCH_URL TOKEN OUT.

Creates ConfigMaps lat-0000, lat-0001, ... in namespace `lat` through the kube-apiserver at
WRITE_URL, at a steady rate, while a watch on that namespace through the kube-apiserver at
WATCH_URL (another one when run.sh runs several) records when each ADDED event arrives. A
probe's latency is from just before its create was sent to its event's arrival (the create's
own round trip included). Writes {"count", "received", "errors", "p50_ms", "p99_ms",
"max_ms"} to OUT. Environment: LATENCY_PROBES (default 200), LATENCY_RATE per second
(default 20).
"""
import http.client
import json
import os
import ssl
import sys
import threading
import time
import urllib.parse

NS = "lat"


def conn(url):
    u = urllib.parse.urlparse(url)
    return http.client.HTTPSConnection(u.hostname, u.port, context=ssl._create_unverified_context(), timeout=30)


def call(url, token, method, path, body=None):
    c = conn(url)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    c.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def percentile(sorted_ms, q):
    if not sorted_ms:
        return None
    return round(sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))], 1)


def main(write_url, watch_url, token, out):
    count = int(os.environ.get("LATENCY_PROBES", "200"))
    rate = float(os.environ.get("LATENCY_RATE", "20"))
    status, _ = call(write_url, token, "POST", "/api/v1/namespaces",
                     {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    if status not in (201, 409):
        sys.exit(f"latency.py: creating namespace {NS}: HTTP {status}")
    # The namespace's current resource version, read through the watching kube-apiserver.
    status, data = call(watch_url, token, "GET", f"/api/v1/namespaces/{NS}/configmaps?limit=1")
    if status != 200:
        sys.exit(f"latency.py: listing {NS}: HTTP {status}")
    rv = json.loads(data)["metadata"]["resourceVersion"]
    sent, arrived, done = {}, {}, threading.Event()
    wc = conn(watch_url)
    wc.request("GET", f"/api/v1/namespaces/{NS}/configmaps?watch=1&resourceVersion={rv}",
               headers={"Authorization": f"Bearer {token}"})
    wr = wc.getresponse()
    if wr.status != 200:
        sys.exit(f"latency.py: watch: HTTP {wr.status}")

    def read():
        while not done.is_set():
            line = wr.readline()
            if not line:
                return
            now = time.monotonic()
            ev = json.loads(line)
            name = ev.get("object", {}).get("metadata", {}).get("name", "")
            if ev.get("type") == "ADDED" and name.startswith("lat-"):
                arrived.setdefault(name, now)
                if len(arrived) == count:
                    return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    errors, start = 0, time.monotonic()
    for i in range(count):
        name = f"lat-{i:04d}"
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        sent[name] = time.monotonic()
        status, _ = call(write_url, token, "POST", f"/api/v1/namespaces/{NS}/configmaps",
                         {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})
        if status != 201:
            errors += 1
    reader.join(timeout=30)
    done.set()
    ms = sorted((arrived[n] - sent[n]) * 1000 for n in sent if n in arrived)
    result = {"count": count, "received": len(ms), "errors": errors, "p50_ms": percentile(ms, 0.5),
              "p99_ms": percentile(ms, 0.99), "max_ms": round(ms[-1], 1) if ms else None}
    json.dump(result, open(out, "w"))
    print(f"latency.py: {result}")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
