"""How long a node takes to refuse an oversized Envoy ShouldRateLimit request (64,000
descriptors used to take 3.15 s of CPU in a release build before being refused).

    python bench/rls_bound.py GRPC_ADDR NODE_PID [N ...]

For each N (default: 64000 and `empty`; `full`, the most address descriptors that fit in gRPC's 4 MB
message; `empty`, the most empty descriptors that fit in the node's 64 KiB request bound, the
most a request it decodes can hold), sends
RUNS (default 20) requests of N descriptors, serialised once beforehand so that the client's own
encoding is not timed, and prints per N: the gRPC status, the median and worst round trip (ms)
and the node's CPU time per request (utime + stime from /proc/PID/stat, ms). Envoy's generated
types (PyPI envoy-data-plane) and grpcio, from the venv `.ci/run` makes.
"""
import os
import statistics
import sys
import time

import grpc
from envoy_data_plane.envoy.extensions.common.ratelimit.v3 import (
    RateLimitDescriptor,
    RateLimitDescriptorEntry,
)
from envoy_data_plane.envoy.service.ratelimit.v3 import RateLimitRequest

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
RUNS = int(os.environ.get("RUNS", "20"))
TICK = os.sysconf("SC_CLK_TCK")


def cpu_ms(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / TICK


def request(n, empty=False):
    return bytes(
        RateLimitRequest(
            domain="edge",
            descriptors=[
                RateLimitDescriptor(
                    entries=[]
                    if empty
                    else [RateLimitDescriptorEntry(key="remote_address", value=f"10.0.{i // 250}.{i % 250}")]
                )
                for i in range(n)
            ],
        )
    )


def fill(limit, empty):
    """The most descriptors whose request stays within `limit` bytes (bisection: sizes grow
    with the index, and each serialisation of a large request takes seconds)."""
    lo, hi = 0, 1
    while len(request(hi, empty)) <= limit:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if len(request(mid, empty)) <= limit:
            lo = mid
        else:
            hi = mid
    return lo


def main():
    addr, pid = sys.argv[1], int(sys.argv[2])
    sizes = sys.argv[3:] or ["64000", "empty"]
    channel = grpc.insecure_channel(addr)
    stub = channel.unary_unary(METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    print("descriptors\tbytes\tstatus\tmedian_ms\tmax_ms\tnode_cpu_ms_per_request")
    for size in sizes:
        empty = size == "empty"
        if size == "full":
            n = fill(4 * 1024 * 1024 - 64, False)
        elif empty:
            n = fill(64 * 1024, True)
        else:
            n = int(size)
        body = request(n, empty)
        times, status = [], "OK"
        cpu0 = cpu_ms(pid)
        for _ in range(RUNS):
            t0 = time.perf_counter()
            try:
                stub(body, timeout=60)
            except grpc.RpcError as e:
                status = e.code().name
            times.append((time.perf_counter() - t0) * 1000)
        cpu = (cpu_ms(pid) - cpu0) / RUNS
        print(f"{n}{' empty' if empty else ''}\t{len(body)}\t{status}\t{statistics.median(times):.2f}\t{max(times):.2f}\t{cpu:.2f}", flush=True)


if __name__ == "__main__":
    main()
