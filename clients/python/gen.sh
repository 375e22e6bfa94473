#!/usr/bin/env bash
# Regenerates the ringlimit.v1 stubs (src/ringlimit/v1/*_pb2*.py, .pyi) from the node's proto
# (crates/proto/proto/ringlimit/v1/ratelimiter.proto, the one source of the contract: no copy
# of it is kept here). The generated files are
# checked in so that installing the package needs no protoc; tests/test_generated.py fails when
# they differ from what this script writes. Needs grpcio-tools (the [dev] extra); OUT=dir writes
# elsewhere (the test's way to compare).
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
OUT="${OUT:-src}"
mkdir -p "$OUT/ringlimit/v1"
PROTO="../../crates/proto/proto"
"$PY" -m grpc_tools.protoc -I "$PROTO" \
  --python_out="$OUT" --pyi_out="$OUT" --grpc_python_out="$OUT" \
  "$PROTO/ringlimit/v1/ratelimiter.proto"
