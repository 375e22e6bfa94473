"""ringlimit's gRPC port over TLS (`--tls-cert`) from Python grpcio, trusting a CA file, as a
Python service would. `.ci/run` makes the environment.

    python tests/python/tls_client.py PROTO_ROOT ADDR CA_FILE SECONDS

Calls grpc.health.v1.Health/Check and ringlimit.v1.RateLimiter/Check (stubs that grpc_tools
compiles from our .proto when this script starts) once, then both again and again for SECONDS
seconds, each pair on a channel of its own with its own subchannel (so each is a new
connection and TLS handshake: a certificate rotated meanwhile is what new ones see). Prints
one JSON line per first call, {"call", "status"} / {"call", "answer"}, then
{"call": "loop", "calls": N, "failed": K, "errors": [...]} (at most 5 errors), or
{"call", "error": "<grpc status code>", "message": "..."} when a first call fails.
"""
import json
import sys
import time

import grpc
from google.protobuf.json_format import MessageToDict
from v1_stubs import compile_v1

root, addr, ca_file, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
pb, rpc = compile_v1(root, "ringlimit-tls-py-")

with open(ca_file, "rb") as f:
    credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
OPTIONS = (
    # The certificate names localhost (and 127.0.0.1).
    ("grpc.ssl_target_name_override", "localhost"),
    # No subchannel shared between channels: a new channel is a new connection.
    ("grpc.use_local_subchannel_pool", 1),
)


def health(channel):
    """grpc.health.v1.Health/Check for the whole server, by hand (no stubs needed): an empty
    request; the answer's field 1 is the status (1: SERVING)."""
    call = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    answer = call(b"", timeout=5)
    return answer[1] if len(answer) >= 2 and answer[0] == 0x08 else 0


def check(channel, key):
    request = pb.CheckRequest(
        key=key, inline=pb.InlineRule(limit=1000000, period_ms=60000)
    )
    return rpc.RateLimiterStub(channel).Check(request, timeout=5)


def emit(name, f):
    try:
        line = {"call": name, **f()}
    except grpc.RpcError as e:
        line = {"call": name, "error": e.code().name, "message": e.details()}
    print(json.dumps(line), flush=True)


def first():
    with grpc.secure_channel(addr, credentials, options=OPTIONS) as channel:
        emit("first-health", lambda: {"status": health(channel)})
        emit(
            "first-check",
            lambda: {
                "answer": MessageToDict(
                    check(channel, "py-first"), preserving_proto_field_name=True
                )
            },
        )


first()
calls, failed, errors = 0, 0, []
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    calls += 1
    try:
        with grpc.secure_channel(addr, credentials, options=OPTIONS) as channel:
            if health(channel) != 1:
                raise RuntimeError("not SERVING")
            if not check(channel, "py-loop").allowed:
                raise RuntimeError("denied")
    except (grpc.RpcError, RuntimeError) as e:
        failed += 1
        if len(errors) < 5:
            errors.append(str(e))
print(json.dumps({"call": "loop", "calls": calls, "failed": failed, "errors": errors}), flush=True)
