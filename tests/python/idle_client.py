"""grpc.health.v1 over one grpcio channel (Debian's python3-grpcio), with pauses between the
calls long enough for the server to close the idle connection in between.

    python tests/python/idle_client.py ADDR CALLS PAUSE_S

Prints one JSON line per call: {"call", "status"} (the health status's name) or
{"call", "error": "<grpc status code>"}.
"""
import json
import sys
import time

import grpc

METHOD = "/grpc.health.v1.Health/Check"
STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def status_of(raw):
    # HealthCheckResponse: field 1 (status), a varint: b"\x08\x01" is SERVING; empty is 0.
    return STATUS.get(raw[1] if len(raw) >= 2 and raw[0] == 0x08 else 0, "?")


addr, calls, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
channel = grpc.insecure_channel(addr)
check = channel.unary_unary(METHOD, request_serializer=bytes, response_deserializer=bytes)
for i in range(calls):
    if i:
        time.sleep(pause)
    try:
        # An empty HealthCheckRequest: the whole server.
        status = status_of(check(b"", timeout=5))
        print(json.dumps({"call": str(i), "status": status}), flush=True)
    except grpc.RpcError as e:
        print(json.dumps({"call": str(i), "error": e.code().name}), flush=True)
channel.close()
