"""Envoy's ShouldRateLimit from Python grpcio (Debian's python3-grpcio, python3-grpc-tools).

    /usr/bin/python3 tests/python/rls_client.py HOST:PORT

Compiles tests/python/proto/rls_subset.proto into a temporary directory, then sends the calls
below and prints one JSON line per call, and one for grpc.health.v1 when available:
{"call": ..., "overall": "OK"|"OVER_LIMIT", "statuses": [...], "headers": {...}}.
"""
import importlib, json, os, sys, tempfile

import grpc
from grpc_tools import protoc

here = os.path.dirname(os.path.abspath(__file__))
out = tempfile.mkdtemp(prefix="ringlimit-rls-")
include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
rc = protoc.main(["protoc", f"-I{here}/proto", f"-I{include}", f"--python_out={out}",
                  f"--grpc_python_out={out}", f"{here}/proto/rls_subset.proto"])
if rc != 0:
    sys.exit(f"protoc failed: {rc}")
sys.path.insert(0, out)
pb = importlib.import_module("rls_subset_pb2")
pb_grpc = importlib.import_module("rls_subset_pb2_grpc")

channel = grpc.insecure_channel(sys.argv[1])
stub = pb_grpc.RateLimitServiceStub(channel)
Code = pb.RateLimitResponse.Code


def call(name, descriptors, hits=0):
    req = pb.RateLimitRequest(domain="edge", hits_addend=hits)
    for entries, override in descriptors:
        d = req.descriptors.add()
        for k, v in entries:
            d.entries.add(key=k, value=v)
        if override:
            d.limit.requests_per_unit, d.limit.unit = override
    r = stub.ShouldRateLimit(req, timeout=5)
    print(json.dumps({
        "call": name,
        "overall": Code.Name(r.overall_code),
        "statuses": [{
            "code": Code.Name(s.code),
            "limit": s.current_limit.requests_per_unit if s.HasField("current_limit") else None,
            "remaining": s.limit_remaining,
            "reset_s": s.duration_until_reset.seconds,
        } for s in r.statuses],
        "headers": {h.key: h.value for h in r.response_headers_to_add},
    }), flush=True)


login = [([("remote_address", "10.9.0.1")], None), ([("path", "/login")], None)]
for i in range(3):
    call(f"login-{i}", login)
call("address-alone", [([("remote_address", "10.9.0.1")], None)])
call("unknown", [([("nothing", "here")], None)])
call("override", [([("remote_address", "10.9.0.2")], (10, 3))], hits=4)
