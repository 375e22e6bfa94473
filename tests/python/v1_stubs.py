"""ringlimit.v1's Python stubs, compiled by grpc_tools (PyPI grpcio-tools) from our .proto when
a client script starts, as a Go, Java or Python service would: shared by the scripts that call
ringlimit.v1 (v1_client.py, v1_sdk_calls.py, tls_client.py)."""
import importlib
import os
import sys
import tempfile

from grpc_tools import protoc


def compile_v1(root, prefix):
    """(pb, rpc): the ratelimiter_pb2 and _pb2_grpc modules compiled from PROTO_ROOT `root`
    into a temporary directory named after `prefix`; exits the script when protoc fails."""
    out = tempfile.mkdtemp(prefix=prefix)
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
    return pb, rpc
