#!/usr/bin/env python3
"""What one RLQS client can make a node hold (bench/rlqs.sh MODE=probe): a real gRPC client
(grpcio with Envoy's generated types, PyPI envoy-data-plane) on `StreamRateLimitQuotas`.

  rlqs_probe.py ADDR [--hold 0] [--ready PATH] junk [--reports 200] [--junk-bytes 1048576]
      [--settle 3]
  rlqs_probe.py ADDR [--hold 0] [--ready PATH] fill [--streams 10] [--buckets 10000]
      [--settle 3]

junk: one stream, REPORTS reports, each a new bucket {name: api, tenant: t1, junk: <JUNK_BYTES>}
(the config matches name and tenant and ignores the rest), then one ordinary bucket {name: api,
tenant: t2}; answers read all along and for SETTLE s after. fill: STREAMS streams of BUCKETS
ordinary buckets each (a report each), answers read for SETTLE s. Then the streams stay open
HOLD s more, PATH created at its start (the caller samples the node meanwhile). Prints one JSON
line: what was sent, what came back (answers, bytes, the largest
message, abandons, assignments, whether the ordinary bucket of `junk` was assigned), how each
stream ended.
"""
import argparse
import asyncio
import json
import time

import betterproto2
import grpc
import grpc.aio
from envoy_data_plane.envoy.service.rate_limit_quota.v3 import (
    BucketId,
    RateLimitQuotaResponse,
    RateLimitQuotaUsageReports,
    RateLimitQuotaUsageReportsBucketQuotaUsage as Usage,
)

METHOD = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]


def ident(b):
    return b


def report(buckets):
    usages = [Usage(bucket_id=BucketId(bucket=b), num_requests_allowed=1) for b in buckets]
    return bytes(RateLimitQuotaUsageReports(domain="edge", bucket_quota_usages=usages))


class Stream:
    """One stream: reports queued in, answers counted out."""

    def __init__(self, channel):
        self.queue = asyncio.Queue()
        self.call = channel.stream_stream(METHOD, request_serializer=ident,
                                          response_deserializer=ident)(self.requests())
        self.answers = self.bytes = self.largest = self.abandons = self.assignments = 0
        self.assigned = set()
        self.end = None
        self.reader = asyncio.create_task(self.read())

    async def requests(self):
        while True:
            item = await self.queue.get()
            if item is None:
                return
            yield item

    async def read(self):
        try:
            async for raw in self.call:
                self.answers += 1
                self.bytes += len(raw)
                self.largest = max(self.largest, len(raw))
                for a in RateLimitQuotaResponse().parse(raw).bucket_action:
                    kind, _ = betterproto2.which_one_of(a, "bucket_action")
                    if kind == "abandon_action":
                        self.abandons += 1
                    else:
                        self.assignments += 1
                        self.assigned.add(a.bucket_id.bucket.get("tenant", ""))
            self.end = "OK"
        except grpc.aio.AioRpcError as e:
            self.end = f"{e.code().name}: {e.details()}"

    def send(self, raw):
        self.queue.put_nowait(raw)

    async def close(self):
        self.end = self.end or "open until the client closed it"
        self.queue.put_nowait(None)
        self.call.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)

    def summary(self):
        return {"answers": self.answers, "answer_bytes": self.bytes,
                "largest_answer_bytes": self.largest, "abandons": self.abandons,
                "assignments": self.assignments, "end": self.end}


async def hold(a):
    """The streams stay open HOLD s, PATH created at the start."""
    if a.ready:
        with open(a.ready, "w"):
            pass
    await asyncio.sleep(a.hold)


async def junk(a):
    async with grpc.aio.insecure_channel(a.addr, options=OPTIONS) as channel:
        s = Stream(channel)
        sent = 0
        t0 = time.monotonic()
        for i in range(a.reports):
            raw = report([{"name": "api", "tenant": "t1",
                           "junk": f"{i:08d}" + "x" * a.junk_bytes}])
            sent += len(raw)
            s.send(raw)
            await asyncio.sleep(0)
        s.send(report([{"name": "api", "tenant": "t2"}]))
        # Until the ordinary bucket is assigned (or SETTLE s pass), then SETTLE s more.
        deadline = time.monotonic() + a.settle + 10
        while "t2" not in s.assigned and time.monotonic() < deadline and s.end is None:
            await asyncio.sleep(0.05)
        await asyncio.sleep(a.settle)
        elapsed = time.monotonic() - t0
        await hold(a)
        await s.close()
        out = {"probe": "junk", "reports": a.reports, "sent_bytes": sent,
               "ordinary_bucket_assigned": "t2" in s.assigned, "seconds": round(elapsed, 2)}
        out.update(s.summary())
        print(json.dumps(out), flush=True)


async def fill(a):
    async with grpc.aio.insecure_channel(a.addr, options=OPTIONS) as channel:
        streams = []
        for s in range(a.streams):
            st = Stream(channel)
            st.send(report([{"name": "api", "tenant": f"{s}-{i}"} for i in range(a.buckets)]))
            streams.append(st)
        await asyncio.sleep(a.settle)
        await hold(a)
        for st in streams:
            await st.close()
        per = [st.summary() for st in streams]
        print(json.dumps({"probe": "fill", "streams": a.streams, "buckets": a.buckets,
                          "answers": sum(p["answers"] for p in per),
                          "answer_bytes": sum(p["answer_bytes"] for p in per),
                          "largest_answer_bytes": max(p["largest_answer_bytes"] for p in per),
                          "abandons": sum(p["abandons"] for p in per),
                          "assignments": sum(p["assignments"] for p in per),
                          "ends": sorted({str(p["end"]) for p in per})}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("addr")
    ap.add_argument("--hold", type=float, default=0.0)
    ap.add_argument("--ready")
    sub = ap.add_subparsers(dest="probe", required=True)
    j = sub.add_parser("junk")
    j.add_argument("--reports", type=int, default=200)
    j.add_argument("--junk-bytes", type=int, default=1 << 20)
    j.add_argument("--settle", type=float, default=3.0)
    f = sub.add_parser("fill")
    f.add_argument("--streams", type=int, default=10)
    f.add_argument("--buckets", type=int, default=10000)
    f.add_argument("--settle", type=float, default=3.0)
    a = ap.parse_args()
    asyncio.run(junk(a) if a.probe == "junk" else fill(a))


if __name__ == "__main__":
    main()
