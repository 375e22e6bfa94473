"""The Python SDK's benchmark: prints one JSON object.

- ``leased``: in-process checks per second on one hot key from one thread, on slices leased
  from its owner (``leases=True``), with the admissions counted against the limit;
- ``round_trip``: p50/p99 of a check's round trip to its owner without leases (one thread,
  one check at a time), and the checks sent.

Against ``--seeds`` (nodes' HTTP addresses), or a three-node cluster it starts from
``$RINGLIMIT_BIN`` (``ringlimit serve``, loopback, killed at the end)::

    RINGLIMIT_BIN=target/release/ringlimit python bench/bench.py --seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent / "tests"))

import ringlimit  # noqa: E402
from ringlimit import Inline  # noqa: E402


#: The client credential (leases need one on nodes with a secret).
TOKEN = os.environ.get("RINGLIMIT_CLIENT_TOKEN") or None


def percentile(sorted_ns: list, p: float) -> float:
    i = min(int(len(sorted_ns) * p), len(sorted_ns) - 1)
    return sorted_ns[i] / 1e6


def run(seeds: list, grpc_addrs: dict, seconds: float, round_trips: int, limit: int, named: str, only: str = "all", threads: int = 32) -> dict:
    out: dict = {}
    if only in ("all", "round_trip"):
        round_trip(out, seeds, grpc_addrs, round_trips)
    if only in ("all", "leased"):
        leased(out, seeds, grpc_addrs, seconds, limit, named)
    if only == "concurrent":
        concurrent(out, seeds, grpc_addrs, seconds, threads)
    return out


def concurrent(out: dict, seeds: list, grpc_addrs: dict, seconds: float, threads: int) -> None:
    """``threads`` threads checking keys spread over 100,000 (a token bucket of 1,000,000 a
    minute, as the Rust SDK's ``sdk_load`` does) without leases: the per-owner batching's load."""
    import random
    import threading

    with ringlimit.Client(seeds, token=TOKEN, grpc_addrs=grpc_addrs, deadline_ms=1_000) as c:
        stop = threading.Event()
        counts = [0] * threads
        degraded = [0] * threads
        lats: list = [[] for _ in range(threads)]

        def worker(w: int) -> None:
            rng = random.Random(w)
            lat = lats[w]
            while not stop.is_set():
                key = f"load:{rng.randrange(100_000)}"
                t = time.perf_counter_ns()
                a = c.check(key, limit=1_000_000, period_ms=60_000)
                lat.append(time.perf_counter_ns() - t)
                counts[w] += 1
                degraded[w] += a.degraded

        ts = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in ts:
            t.join()
        elapsed = time.perf_counter() - t0
        all_lat = sorted(x for l in lats for x in l)
        s = c.stats()
        out["concurrent"] = {
            "threads": threads,
            "checks": sum(counts),
            "checks_per_s": round(sum(counts) / elapsed),
            "p50_ms": round(percentile(all_lat, 0.50), 3),
            "p99_ms": round(percentile(all_lat, 0.99), 3),
            "degraded": sum(degraded),
            "checks_sent": s["checks_sent"],
            "batches": s["batches"],
        }


def round_trip(out: dict, seeds: list, grpc_addrs: dict, round_trips: int) -> None:
    with ringlimit.Client(seeds, token=TOKEN, grpc_addrs=grpc_addrs, deadline_ms=1_000) as c:
        lat = []
        start = time.perf_counter()
        for i in range(round_trips):
            t = time.perf_counter_ns()
            c.check(f"bench:rt:{i % 1000}", limit=1_000_000, period_ms=3_600_000)
            lat.append(time.perf_counter_ns() - t)
        seconds = time.perf_counter() - start
        lat.sort()
        s = c.stats()
        out["round_trip"] = {
            "checks": round_trips,
            # The loop's own time: its rate is the Rust SDK's in the like-for-like comparison.
            "seconds": round(seconds, 3),
            "p50_ms": round(percentile(lat, 0.50), 3),
            "p99_ms": round(percentile(lat, 0.99), 3),
            "checks_sent": s["checks_sent"],
            "degraded": s["degraded"],
        }


def leased(out: dict, seeds: list, grpc_addrs: dict, seconds: float, limit: int, named: str) -> None:
    # A named rule (its name's hash is cached by Python: the fast path's lookup is cheapest)
    # when the benchmark started the cluster with its rules file, else an inline rule.
    rule = named if named else Inline(limit, 3_600_000, "fixed_window")
    with ringlimit.Client(seeds, token=TOKEN, grpc_addrs=grpc_addrs, leases=True, deadline_ms=1_000) as c:
        check = c.check
        admitted = 0
        # Warm up until the key is leased (bounded).
        end = time.monotonic() + 10
        while time.monotonic() < end:
            a = check("bench:hot", rule)
            admitted += a.allowed
            if a.leased:
                break
        n = 0
        t0 = time.perf_counter()
        stop = t0 + seconds
        while True:
            # 1000 checks between clock reads: the loop's own cost stays out of the figure.
            for _ in range(1000):
                a = check("bench:hot", rule)
                if a.allowed:
                    admitted += 1
            n += 1000
            if time.perf_counter() >= stop:
                break
        elapsed = time.perf_counter() - t0
        s = c.stats()
        out["leased"] = {
            "rule": "named" if named else "inline",
            "checks": n,
            "seconds": round(elapsed, 3),
            "checks_per_s": round(n / elapsed),
            "admitted": admitted,
            "limit": limit,
            "admitted_within_limit": admitted <= limit,
            "lease_grants": s["lease_grants"],
            "checks_sent": s["checks_sent"],
            "degraded": s["degraded"],
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", help="nodes' HTTP addresses, comma-separated (default: start a cluster)")
    p.add_argument("--seconds", type=float, default=5.0, help="length of the leased run")
    p.add_argument("--round-trips", type=int, default=2_000)
    p.add_argument("--limit", type=int, default=100_000_000, help="the hot key's limit per hour")
    p.add_argument("--rule", help="with --seeds: the hot key's named rule (a fixed window of --limit per hour in the nodes' rules), instead of the same rule inline")
    p.add_argument("--only", choices=("all", "round_trip", "leased", "concurrent"), default="all", help="one phase only (concurrent: only when asked)")
    p.add_argument("--threads", type=int, default=32, help="callers of the concurrent phase")
    args = p.parse_args()
    if args.seeds:
        result = run(args.seeds.split(","), {}, args.seconds, args.round_trips, args.limit, args.rule or "", args.only, args.threads)
    else:
        if not os.environ.get("RINGLIMIT_BIN"):
            sys.exit("give --seeds or set RINGLIMIT_BIN to a ringlimit binary")
        from cluster import Cluster

        rules = f"rules:\n  - name: bench-hot\n    limit: {args.limit}\n    period: 1h\n    algorithm: fixed_window\n"
        with Cluster(3, rules=rules) as cl:
            result = run(cl.seeds, cl.grpc_addrs, args.seconds, args.round_trips, args.limit, "bench-hot", args.only, args.threads)
    result["python"] = sys.version.split()[0]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
