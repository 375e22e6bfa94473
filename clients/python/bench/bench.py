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


def percentile(sorted_ns: list, p: float) -> float:
    i = min(int(len(sorted_ns) * p), len(sorted_ns) - 1)
    return sorted_ns[i] / 1e6


def run(seeds: list, grpc_addrs: dict, seconds: float, round_trips: int, limit: int, named: bool) -> dict:
    out: dict = {}
    with ringlimit.Client(seeds, grpc_addrs=grpc_addrs, deadline_ms=1_000) as c:
        lat = []
        for i in range(round_trips):
            t = time.perf_counter_ns()
            c.check(f"bench:rt:{i % 1000}", limit=1_000_000, period_ms=3_600_000)
            lat.append(time.perf_counter_ns() - t)
        lat.sort()
        s = c.stats()
        out["round_trip"] = {
            "checks": round_trips,
            "p50_ms": round(percentile(lat, 0.50), 3),
            "p99_ms": round(percentile(lat, 0.99), 3),
            "checks_sent": s["checks_sent"],
            "degraded": s["degraded"],
        }
    # A named rule (its name's hash is cached by Python: the fast path's lookup is cheapest)
    # when the benchmark started the cluster with its rules file, else an inline rule.
    rule = "bench-hot" if named else Inline(limit, 3_600_000, "fixed_window")
    with ringlimit.Client(seeds, grpc_addrs=grpc_addrs, leases=True, deadline_ms=1_000) as c:
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
        leased_admitted = 0
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
        del leased_admitted
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", help="nodes' HTTP addresses, comma-separated (default: start a cluster)")
    p.add_argument("--seconds", type=float, default=5.0, help="length of the leased run")
    p.add_argument("--round-trips", type=int, default=2_000)
    p.add_argument("--limit", type=int, default=100_000_000, help="the hot key's limit per hour")
    args = p.parse_args()
    if args.seeds:
        result = run(args.seeds.split(","), {}, args.seconds, args.round_trips, args.limit, False)
    else:
        if not os.environ.get("RINGLIMIT_BIN"):
            sys.exit("give --seeds or set RINGLIMIT_BIN to a ringlimit binary")
        from cluster import Cluster

        rules = f"rules:\n  - name: bench-hot\n    limit: {args.limit}\n    period: 1h\n    algorithm: fixed_window\n"
        with Cluster(3, rules=rules) as cl:
            result = run(cl.seeds, cl.grpc_addrs, args.seconds, args.round_trips, args.limit, True)
    result["python"] = sys.version.split()[0]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
