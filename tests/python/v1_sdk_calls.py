"""ringlimit.v1's calls for client SDKs from Python: grpcio with stubs that grpc_tools (PyPI
grpcio-tools) compiles from our .proto when this script starts. `.ci/run` makes the environment.

    python tests/python/v1_sdk_calls.py PROTO_ROOT ADDR[,ADDR...] TOKEN KEY

Prints one JSON line per call: {"call": "topology", ...the TopologyResponse} from the first
address; {"call": "lease-anonymous", "error", "message"} for a Lease without a credential; and
{"call": "lease-<i>", "grants": [...]} for a Lease of KEY under `per-ip` (want 2) at each
address with the credential TOKEN — or {"call", "error": "<grpc status code>", "message"}.
"""
import importlib
import json
import os
import sys
import tempfile

import grpc
from google.protobuf.json_format import MessageToDict
from grpc_tools import protoc

root, addrs, token, key = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]
out = tempfile.mkdtemp(prefix="ringlimit-v1-sdk-py-")
include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
rc = protoc.main(
    [
        "protoc",
        f"-I{root}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        "ringlimit/v1/ratelimiter.proto",
    ]
)
if rc != 0:
    sys.exit(f"protoc failed: {rc}")
sys.path.insert(0, out)
pb = importlib.import_module("ringlimit.v1.ratelimiter_pb2")
rpc = importlib.import_module("ringlimit.v1.ratelimiter_pb2_grpc")

stubs = [rpc.RateLimiterStub(grpc.insecure_channel(a)) for a in addrs]
credential = (("authorization", f"Bearer {token}"),)


def d(message):
    return MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def emit(name, f):
    try:
        line = {"call": name, **f()}
    except grpc.RpcError as e:
        line = {"call": name, "error": e.code().name, "message": e.details()}
    print(json.dumps(line), flush=True)


def lease():
    return pb.LeaseRequest(
        holder="python-client-1", asks=[pb.LeaseAsk(key=key, rule="per-ip", want=2)]
    )


emit("topology", lambda: d(stubs[0].Topology(pb.TopologyRequest(), timeout=5)))
emit("lease-anonymous", lambda: d(stubs[0].Lease(lease(), timeout=5)))
for i, s in enumerate(stubs):
    emit(f"lease-{i}", lambda s=s: d(s.Lease(lease(), timeout=5, metadata=credential)))
