"""ringlimit.v1.RateLimiter from Python: grpcio with stubs that grpc_tools (PyPI grpcio-tools)
compiles from our .proto when this script starts, as a Go, Java or Python service would.
`.ci/run` makes the environment.

    python tests/python/v1_client.py PROTO_ROOT ADDR[,ADDR...]

Sends the calls below, round-robin over the addresses (the nodes of a cluster), and prints one
JSON line per call: {"call", "answer": {...}} for Check, {"call", "results": [...]} for
CheckBatch, {"call", "allowed", "binding_index", "results": [...]} for CheckAll — or
{"call", "error": "<grpc status code>", "message": "..."}.
"""
import json
import sys

import grpc
from google.protobuf.json_format import MessageToDict
from v1_stubs import compile_v1

root, addrs = sys.argv[1], sys.argv[2].split(",")
pb, rpc = compile_v1(root, "ringlimit-v1-py-")

stubs = [rpc.RateLimiterStub(grpc.insecure_channel(a)) for a in addrs]
turn = 0


def stub():
    global turn
    s = stubs[turn % len(stubs)]
    turn += 1
    return s


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


def named(rule, key, cost=None):
    r = pb.CheckRequest(key=key, rule=rule)
    if cost is not None:
        r.cost = cost
    return r


def check(name, request):
    emit(name, lambda: {"answer": d(stub().Check(request, timeout=5))})


def check_all(name, checks):
    def f():
        r = stub().CheckAll(pb.CheckAllRequest(checks=checks), timeout=5)
        return {
            "allowed": r.allowed,
            "binding_index": r.binding_index,
            "results": [d(x) for x in r.results],
        }

    emit(name, f)


# A per-user limit of 3 through every node in turn: exact across the cluster.
for i in range(4):
    check(f"user-{i}", named("per-user", "py-user"))
check("inline", pb.CheckRequest(
    key="py-inline",
    inline=pb.InlineRule(limit=5, period_ms=60000, algorithm=pb.SLIDING_LOG),
    cost=2,
))
# All-or-nothing: an IP shared by two users, each held to 3.
for i in range(4):
    check_all(f"all-{i}", [named("per-ip", "py-ip"), named("per-user", "py-all"), named("trial", "py-all")])
check("ip-after", named("per-ip", "py-ip", cost=0))


def batch():
    r = stub().CheckBatch(pb.CheckBatchRequest(checks=[
        named("per-ip", "py-batch"),
        pb.CheckRequest(key="no-rule"),
        named("nope", "py-batch"),
    ]), timeout=5)
    return {"results": [d(x) for x in r.results]}


emit("batch", batch)
check("empty-key", named("per-user", ""))
check("unknown-rule", named("nope", "k"))
check("bad-algorithm", pb.CheckRequest(key="k", inline=pb.InlineRule(limit=1, period_ms=1000, algorithm=42)))
check_all("all-empty", [])
