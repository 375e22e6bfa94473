"""ringlimit.v1's calls for client SDKs from Python: grpcio with stubs that grpc_tools (PyPI
grpcio-tools) compiles from our .proto when this script starts. `.ci/run` makes the environment.

    python tests/python/v1_sdk_calls.py PROTO_ROOT ADDR[,ADDR...] TOKEN KEY

Prints one JSON line per call: {"call": "topology", ...the TopologyResponse} from the first
address; {"call": "lease-anonymous", "error", "message"} for a Lease without a credential; and
{"call": "lease-<i>", "grants": [...]} for a Lease of KEY under `per-ip` (want 2) at each
address with the credential TOKEN — or {"call", "error": "<grpc status code>", "message"}.
"""
import json
import sys

import grpc
from google.protobuf.json_format import MessageToDict
from v1_stubs import compile_v1

root, addrs, token, key = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]
pb, rpc = compile_v1(root, "ringlimit-v1-sdk-py-")

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
