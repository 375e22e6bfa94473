#!/usr/bin/env bash
# An oversized Envoy ShouldRateLimit request must be refused before any per-descriptor work. Starts
# one release node with --grpc and deploy/k8s's envoyproxy/ratelimit file, then bench/rls_bound.py
# sends requests of 64,000 descriptors and of as many as fit in 4 MB (RUNS each, default 20) and
# prints the round trip and the node's CPU per request.
#
#   bench/rls_bound.sh                 # builds the release binary first
#   BIN=target/release/ringlimit bench/rls_bound.sh
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
build_node
VENV=/tmp/ringlimit-grpc-venv
if ! "$VENV/bin/python" -c "import grpc, envoy_data_plane" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "envoy-data-plane==2.2.0" "grpcio>=1.51"
fi
GRPC="127.0.0.1:$(aux_port 0)"
ports_free "$(aux_port 0)"
NODE_ENV=TOKIO_WORKER_THREADS=2 start_nodes 1 rls-bound --grpc "$GRPC" \
  --envoy-config "$REPO/deploy/k8s/envoy-ratelimit.yaml"
"$VENV/bin/python" "$BENCH_DIR/rls_bound.py" "$GRPC" "${PIDS[0]}" "$@"
