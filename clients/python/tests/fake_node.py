"""An in-process stand-in for ringlimit nodes' ringlimit.v1 service (grpc server on loopback),
for unit tests of what the client does with Topology, WatchTopology, Lease, GiveBack and
holds: plain counters per bucket (a budget of ``limit`` per rule and key, never refilled),
and a record of every call."""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Dict, List, Optional, Tuple

import grpc

from ringlimit import _hash
from ringlimit.v1 import ratelimiter_pb2 as pb
from ringlimit.v1 import ratelimiter_pb2_grpc as pb_grpc


class Shared:
    """What every fake node of one cluster shares: members, rules, buckets, the call log."""

    def __init__(self, rules: List[pb.RuleInfo]) -> None:
        self.lock = threading.Condition()
        self.members: List[pb.Member] = []
        self.rules = rules
        self.version = 1
        self.used: Dict[Tuple[str, str], int] = {}
        self.calls: List[Tuple[str, str, object]] = []
        self.metadata: List[Optional[str]] = []
        self.leases_enabled = True
        #: CheckStream: offered (False: UNIMPLEMENTED, as an older node); its requests left
        #: unanswered while ``stream_hangs``; the stream broken (UNAVAILABLE) at its request
        #: number ``stream_breaks_at`` (counted over all streams).
        self.stream_enabled = True
        self.stream_hangs = False
        self.stream_breaks_at: Optional[int] = None
        self.stream_requests = 0

    def topology(self, node_id: str) -> pb.TopologyResponse:
        return pb.TopologyResponse(
            node_id=node_id,
            cluster_id="ringlimit",
            version=self.version,
            members=self.members,
            ring=pb.RingParams(scheme=_hash.SCHEME, vnodes_per_member=_hash.VNODES_PER_MEMBER),
            rules=self.rules,
        )

    def change(self, members: List[pb.Member]) -> None:
        with self.lock:
            self.members = members
            self.version += 1
            self.lock.notify_all()

    def limit_of(self, msg) -> Tuple[str, int]:
        if msg.WhichOneof("rule_spec") == "rule":
            rule = next(r for r in self.rules if r.name == msg.rule)
            return f"rule:{msg.rule}", rule.limit
        return f"inline:{msg.inline.limit}/{msg.inline.period_ms}", msg.inline.limit


class Servicer(pb_grpc.RateLimiterServicer):
    def __init__(self, shared: Shared, node_id: str) -> None:
        self.s = shared
        self.node_id = node_id

    def _log(self, call: str, context, what: object) -> None:
        md = dict(context.invocation_metadata())
        with self.s.lock:
            self.s.calls.append((self.node_id, call, what))
            self.s.metadata.append(md.get("authorization"))

    def _decide(self, req: pb.CheckRequest, n: int) -> pb.CheckResponse:
        spec, limit = self.s.limit_of(req)
        cost = req.cost if req.HasField("cost") else 1
        with self.s.lock:
            used = self.s.used.get((spec, req.key), 0)
            ok = used + max(cost, 1) <= limit
            if ok and cost > 0:
                used += cost
                self.s.used[(spec, req.key)] = used
        r = pb.CheckResponse(allowed=ok, limit=limit, remaining=limit - used, reset_at_ms=10, retry_after_ms=0 if ok else 5_000)
        if ok and req.hold:
            r.hold.CopyFrom(pb.Mark(reset_ns=n, at_ns=cost))
        return r

    def Check(self, request, context):
        self._log("Check", context, request.key)
        return self._decide(request, 1)

    def CheckBatch(self, request, context):
        self._log("CheckBatch", context, [c.key for c in request.checks])
        return pb.CheckBatchResponse(
            results=[pb.CheckBatchResult(answer=self._decide(c, i + 1)) for i, c in enumerate(request.checks)]
        )

    def CheckStream(self, request_iterator, context):
        if not self.s.stream_enabled:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        self._log("CheckStream", context, None)
        for request in request_iterator:
            with self.s.lock:
                self.s.stream_requests += 1
                n = self.s.stream_requests
                self.s.calls.append((self.node_id, "CheckStreamRequest", [c.key for c in request.checks]))
                while self.s.stream_hangs and context.is_active():
                    self.s.lock.wait(0.02)
            if not context.is_active():
                return
            if n == self.s.stream_breaks_at:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the fake node broke the stream")
            yield pb.CheckStreamResponse(
                id=request.id,
                results=[pb.CheckBatchResult(answer=self._decide(c, i + 1)) for i, c in enumerate(request.checks)],
            )

    def Topology(self, request, context):
        self._log("Topology", context, None)
        return self.s.topology(self.node_id)

    def WatchTopology(self, request, context):
        self._log("WatchTopology", context, None)
        seen = -1
        while context.is_active():
            with self.s.lock:
                if seen == self.s.version:
                    self.s.lock.wait(0.2)
                if seen == self.s.version:
                    continue
                seen = self.s.version
                msg = self.s.topology(self.node_id)
            yield msg

    def Lease(self, request, context):
        self._log("Lease", context, [(a.key, a.want) for a in request.asks])
        grants = []
        for ask in request.asks:
            spec, limit = self.s.limit_of(ask)
            if not self.s.leases_enabled:
                grants.append(pb.LeaseGrant(refused=pb.CheckResponse(allowed=True, limit=limit)))
                continue
            with self.s.lock:
                used = self.s.used.get((spec, ask.key), 0)
                n = min(ask.want, limit - used)
                if n <= 0:
                    grants.append(pb.LeaseGrant(refused=pb.CheckResponse(allowed=False, limit=limit, retry_after_ms=60_000)))
                    continue
                self.s.used[(spec, ask.key)] = used + n
            grants.append(
                pb.LeaseGrant(
                    granted=pb.Granted(
                        tokens=n,
                        valid_ns=60_000_000_000,
                        mark=pb.Mark(reset_ns=7, at_ns=n),
                        answer=pb.CheckResponse(allowed=True, limit=limit, remaining=limit - used - n, reset_at_ms=10),
                    )
                )
            )
        return pb.LeaseResponse(grants=grants)

    def GiveBack(self, request, context):
        self._log("GiveBack", context, [(i.key, i.tokens, i.mark.reset_ns) for i in request.items])
        honoured = []
        for item in request.items:
            spec, _ = self.s.limit_of(item)
            with self.s.lock:
                used = self.s.used.get((spec, item.key), 0)
                back = min(item.tokens, used)
                self.s.used[(spec, item.key)] = used - back
            honoured.append(back)
        return pb.GiveBackResponse(honoured=honoured)


class FakeCluster:
    """``n`` fake nodes sharing one state; ``seeds`` are ``grpc://`` addresses."""

    def __init__(self, n: int = 3, rules: Optional[List[pb.RuleInfo]] = None) -> None:
        self.shared = Shared(rules or [])
        self.servers = []
        members = []
        for i in range(n):
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
            node_id = f"f{i}"
            pb_grpc.add_RateLimiterServicer_to_server(Servicer(self.shared, node_id), server)
            port = server.add_insecure_port("127.0.0.1:0")
            server.start()
            self.servers.append(server)
            members.append(pb.Member(node_id=node_id, grpc_addr=f"127.0.0.1:{port}"))
        self.shared.members = members

    @property
    def seeds(self) -> List[str]:
        return [f"grpc://{m.grpc_addr}" for m in self.shared.members]

    def calls(self, name: str) -> List[Tuple[str, str, object]]:
        with self.shared.lock:
            return [c for c in self.shared.calls if c[1] == name]

    def stop(self) -> None:
        for s in self.servers:
            s.stop(grace=None)

    def __enter__(self) -> "FakeCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def rule(name: str, limit: int, algorithm=pb.FIXED_WINDOW, leasable: bool = True) -> pb.RuleInfo:
    return pb.RuleInfo(
        name=name,
        algorithm=algorithm,
        limit=limit,
        period_ms=3_600_000,
        period="1h",
        mode=pb.OWNER,
        leasable=leasable,
        seed=_hash.named_seed(name, algorithm),
    )
