#!/usr/bin/env python3
"""Load for bench/skew.sh: a global rule's checks at a fixed rate, spread over the nodes, and
what each window admitted (standard library only).

  skew.py --rate 180 --seconds 40 --period-ms 10000 --limit 300 PORT...

Checks go round-robin to the HTTP ports on 127.0.0.1 (keep-alive), one every 1/rate s from one
thread per node. Each admitted check is counted in the window its answer's `reset_at_ms` ends
(a fixed window resets at its end, on the cluster clock). Prints a JSON line: the admitted per
window in order (the first and last partly loaded: the first is where a skewed node used to
admit its own window's worth beside the others', so it is kept) and the failed checks.
"""
import argparse
import http.client
import json
import threading
import time
from collections import Counter


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=180)
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--period-ms", type=int, default=10000)
    ap.add_argument("--limit", type=int, default=300)
    ap.add_argument("--rule", default="g")
    ap.add_argument("ports", type=int, nargs="+")
    a = ap.parse_args()
    admitted = Counter()
    failed = [0]
    lock = threading.Lock()
    body = json.dumps({"key": "tenant", "rule": a.rule}).encode()
    n = len(a.ports)
    start = time.monotonic() + 0.2
    step = n / a.rate

    def run(i, port):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        t = start + i / a.rate
        while t < start + a.seconds:
            d = t - time.monotonic()
            if d > 0:
                time.sleep(d)
            try:
                conn.request("POST", "/v1/check", body, {"content-type": "application/json"})
                r = conn.getresponse()
                ans = json.loads(r.read())
                if r.status == 200:
                    with lock:
                        admitted[ans["reset_at_ms"] // a.period_ms] += 1
                elif r.status != 429:
                    with lock:
                        failed[0] += 1
            except Exception:
                with lock:
                    failed[0] += 1
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            t += step

    threads = [threading.Thread(target=run, args=(i, p)) for i, p in enumerate(a.ports)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    windows = [admitted[w] for w in sorted(admitted)]
    print(json.dumps({"windows": windows, "failed": failed[0]}))


if __name__ == "__main__":
    main()
