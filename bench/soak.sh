#!/usr/bin/env bash
# The soak: 3 release nodes on 127.0.0.1 for MINUTES (default 30) with owner and global rules and
# several limits per request, one node killed (SIGKILL) and restarted every KILL_EVERY seconds
# (default 180), under RATE requests/s (default 600). See bench/soak.py for what is measured.
#
#   bench/soak.sh
#   MINUTES=5 KILL_EVERY=60 bench/soak.sh
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$BENCH_DIR/.." && pwd)"
OUT_DIR="${OUT_DIR:-$BENCH_DIR/out/soak-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT_DIR"
# Nodes form clusters only with a secret (issue 29); the benchmarks run the secure path
# (RINGLIMIT_CLUSTER_SECRET= with RINGLIMIT_ALLOW_UNAUTHENTICATED_PEERS=true runs without it).
export RINGLIMIT_CLUSTER_SECRET="${RINGLIMIT_CLUSTER_SECRET-ringlimit-bench-$$-$RANDOM}"
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p ringlimit-node --bin ringlimit --manifest-path "$REPO/Cargo.toml"
  BIN="${CARGO_TARGET_DIR:-$REPO/target}/release/ringlimit"
fi
python3 "$BENCH_DIR/soak.py" --bin "$(realpath "$BIN")" --out "$OUT_DIR" \
  --minutes "${MINUTES:-30}" --kill-every "${KILL_EVERY:-180}" --rate "${RATE:-600}" \
  | tee "$OUT_DIR/summary.txt"
