"""Envoy's ShouldRateLimit from Python: grpcio (Debian's python3-grpcio) carrying Envoy's own
generated types (PyPI `envoy-data-plane`). `.ci/run` makes the environment.

    python tests/python/rls_client.py ADDR[,ADDR...]

Sends the calls below, round-robin over the addresses (the nodes of a cluster), and prints one
JSON line per call: {"call", "overall", "statuses": [{"code", "limit", "remaining",
"reset_s"}], "headers"} — or {"call", "error": "<grpc status code>"}.
"""
import json
import sys

import grpc
from envoy_data_plane.envoy.extensions.common.ratelimit.v3 import (
    RateLimitDescriptor,
    RateLimitDescriptorEntry,
    RateLimitDescriptorRateLimitOverride,
)
from envoy_data_plane.envoy.service.ratelimit.v3 import (
    RateLimitRequest,
    RateLimitResponse,
    RateLimitResponseCode,
)
from envoy_data_plane.envoy.type.v3 import RateLimitUnit

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
stubs = [
    grpc.insecure_channel(a).unary_unary(
        METHOD,
        request_serializer=bytes,
        response_deserializer=lambda b: RateLimitResponse().parse(b),
    )
    for a in sys.argv[1].split(",")
]
turn = 0


def call(name, descriptors, hits=0, domain="edge"):
    global turn
    stub = stubs[turn % len(stubs)]
    turn += 1
    req = RateLimitRequest(
        domain=domain,
        hits_addend=hits,
        descriptors=[
            RateLimitDescriptor(
                entries=[RateLimitDescriptorEntry(key=k, value=v) for k, v in entries],
                limit=RateLimitDescriptorRateLimitOverride(
                    requests_per_unit=override[0], unit=RateLimitUnit(override[1])
                )
                if override
                else None,
            )
            for entries, override in descriptors
        ],
    )
    try:
        r = stub(req, timeout=5)
    except grpc.RpcError as e:
        print(json.dumps({"call": name, "error": e.code().name}), flush=True)
        return
    print(json.dumps({
        "call": name,
        "overall": RateLimitResponseCode(r.overall_code).name,
        "statuses": [{
            "code": RateLimitResponseCode(s.code).name,
            "limit": s.current_limit.requests_per_unit if s.current_limit else None,
            "remaining": s.limit_remaining,
            "reset_s": s.duration_until_reset.seconds if s.duration_until_reset else None,
        } for s in r.statuses],
        "headers": {h.key: h.value for h in r.response_headers_to_add},
    }), flush=True)


login = [([("remote_address", "10.9.0.1")], None), ([("path", "/login")], None)]
for i in range(3):
    call(f"login-{i}", login)
call("address-alone", [([("remote_address", "10.9.0.1")], None)])
for i in range(3):
    call(f"shadow-{i}", [([("trial", "t")], None)])
call("unlimited", [([("internal", "x")], None)])
call("nested", [([("tenant", "acme"), ("user", "u1")], None)])
call("nested-parent-only", [([("tenant", "acme")], None)])
call("unknown-descriptor", [([("nothing", "here")], None)])
call("unknown-domain", [([("remote_address", "1.1.1.1")], None)], domain="nope")
call("override", [([("remote_address", "10.9.0.2")], (10, 3))], hits=4)
call("empty-domain", [([("remote_address", "1.1.1.1")], None)], domain="")
call("bad-unit", [([("remote_address", "10.9.0.3")], (10, 0))])  # UNKNOWN
