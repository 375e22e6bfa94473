#!/usr/bin/env bash
# Issue 29 item 7: an oversized Envoy ShouldRateLimit request must be refused before any
# per-descriptor work. Starts one release node with --grpc and deploy/k8s's envoyproxy/ratelimit
# file, then bench/rls_bound.py sends requests of 64,000 descriptors and of as many as fit in
# 4 MB (RUNS each, default 20) and prints the round trip and the node's CPU per request.
#
#   bench/rls_bound.sh                 # builds the release binary first
#   BIN=target/release/ringlimit bench/rls_bound.sh
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$BENCH_DIR/.." && pwd)"
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p ringlimit-node --bin ringlimit --manifest-path "$REPO/Cargo.toml"
  BIN="${CARGO_TARGET_DIR:-$REPO/target}/release/ringlimit"
fi
VENV=/tmp/ringlimit-grpc-venv
if ! "$VENV/bin/python" -c "import grpc, envoy_data_plane" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "envoy-data-plane==2.2.0" "grpcio>=1.51"
fi
WORK=$(mktemp -d)
PORT="${PORT:-18480}"
TOKIO_WORKER_THREADS=2 RUST_LOG=warn "$BIN" serve --node-id rls-bound --http "127.0.0.1:$PORT" \
  --peer "127.0.0.1:$((PORT + 1))" --grpc "127.0.0.1:$((PORT + 2))" \
  --envoy-config "$REPO/deploy/k8s/envoy-ratelimit.yaml" 2>"$WORK/node.log" &
NODE=$!
trap 'kill $NODE 2>/dev/null || true; wait $NODE 2>/dev/null || true; rm -rf "$WORK"' EXIT
deadline=$((SECONDS + 20))
until curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null; do
  [ $SECONDS -lt $deadline ] || { cat "$WORK/node.log" >&2; exit 1; }
  sleep 0.1
done
"$VENV/bin/python" "$BENCH_DIR/rls_bound.py" "127.0.0.1:$((PORT + 2))" "$NODE" "$@"
