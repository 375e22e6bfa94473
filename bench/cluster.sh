#!/usr/bin/env bash
# Cluster forwarding benchmark: the same load through one node alone, then through one node of
# three (two thirds of the keys forwarded to their owners), side by side in one run.
#
#   bench/cluster.sh                       # 10 s per load
#   DURATION=5 RUNS=3 bench/cluster.sh     # medians over 3 rounds
#
# Everything runs on 127.0.0.1. All three nodes and wrk share this machine's cores, so the
# ratio (cluster / single) is the figure to read, not the absolutes.
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION="${DURATION:-10}"
RUNS="${RUNS:-1}"
CONNS="${CONNS:-8}"
export KEYSPACE="${KEYSPACE:-100000}"
export CHECK_LIMIT="${CHECK_LIMIT:-100}"
export CHECK_PERIOD_MS="${CHECK_PERIOD_MS:-1000}"
need wrk
build_node

load() { wrk_load "$@"; }

# /v1/cluster of node 0 into $OUT_DIR/<name>.json
snap() { curl -s "http://127.0.0.1:$(http_port 0)/v1/cluster" >"$OUT_DIR/$1.json"; }
# checks per peer frame between two snapshots
factor() {
  python3 - "$OUT_DIR/$1.json" "$OUT_DIR/$2.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["forwarding"] for p in sys.argv[1:3])
frames = b["peer_frames"] - a["peer_frames"]
print(round((b["peer_checks"] - a["peer_checks"]) / frames, 2) if frames else 0)
PY
}


declare -A R
for ((run = 1; run <= RUNS; run++)); do
  log "round $run: single node"
  start_nodes 1 single
  load "single-warmup" check.lua >/dev/null
  read -r rps p50 p99 <<<"$(load "single-$run" check.lua)"
  R[single_rps]+="$rps "; R[single_p99]+="$p99 "; R[single_p50]+="$p50 "
  stop_nodes

  log "round $run: one node of three"
  start_nodes 3 cluster
  load "cluster-warmup" check.lua >/dev/null
  snap "before-$run"
  read -r rps p50 p99 <<<"$(load "cluster-$run" check.lua)"
  R[cluster_rps]+="$rps "; R[cluster_p99]+="$p99 "; R[cluster_p50]+="$p50 "
  snap "checks-$run"
  read -r brps _ _ <<<"$(load "cluster-batch-$run" batch.lua)"
  R[cluster_batch]+="$(awk -v r="$brps" 'BEGIN {printf "%.0f", r * 1000}') "
  snap "batch-$run"
  R[batching]+="$(factor "before-$run" "checks-$run") "
  R[batching_batch]+="$(factor "checks-$run" "batch-$run") "
  R[fail_open]+="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["forwarding"]["fail_open"])' "$OUT_DIR/batch-$run.json") "
  stop_nodes
done

m() { tr ' ' '\n' <<<"${R[$1]}" | grep -v '^$' | median; }
single_rps=$(m single_rps); cluster_rps=$(m cluster_rps)
ratio=$(awk -v a="$cluster_rps" -v b="$single_rps" 'BEGIN {printf "%.3f", a / b}')
cluster_p99=$(m cluster_p99)
{
  echo
  echo "ringlimit cluster benchmark — $(date -u +%FT%TZ), $(nproc) cores, DURATION=${DURATION}s, RUNS=$RUNS, wrk -t2 -c$CONNS"
  echo "keys: random of $KEYSPACE, inline token bucket $CHECK_LIMIT per $CHECK_PERIOD_MS ms; 3 nodes + wrk share the cores"
  printf '%-42s %14s   %s\n' figure median "per round"
  printf '%-42s %14s   %s\n' "single node check/s" "$single_rps" "${R[single_rps]}"
  printf '%-42s %14s   %s\n' "single node p50 / p99 ms" "$(m single_p50) / $(m single_p99)" "${R[single_p99]}"
  printf '%-42s %14s   %s\n' "1 of 3 nodes check/s" "$cluster_rps" "${R[cluster_rps]}"
  printf '%-42s %14s   %s\n' "1 of 3 nodes p50 / p99 ms" "$(m cluster_p50) / $cluster_p99" "${R[cluster_p99]}"
  printf '%-42s %14s   %s\n' "ratio cluster / single" "$ratio" ""
  printf '%-42s %14s   %s\n' "1 of 3 nodes batch checks/s (x1000)" "$(m cluster_batch)" "${R[cluster_batch]}"
  printf '%-42s %14s   %s\n' "checks per peer frame, single checks" "$(m batching)" "${R[batching]}"
  printf '%-42s %14s   %s\n' "checks per peer frame, batch endpoint" "$(m batching_batch)" "${R[batching_batch]}"
  printf '%-42s %14s   %s\n' "fail-open answers (expect 0)" "$(m fail_open)" "${R[fail_open]}"
  echo
  echo "targets: p99 < 1 ms @$CONNS through one node of three | throughput >= 0.5 x single node"
  awk -v p="$cluster_p99" 'BEGIN {printf "  p99 %-36s %s\n", p " ms", (p < 1 ? "PASS" : "MISS")}'
  awk -v r="$ratio" 'BEGIN {printf "  ratio %-34s %s\n", r, (r >= 0.5 ? "PASS" : "MISS")}'
  echo "raw outputs: $OUT_DIR"
} | tee "$OUT_DIR/summary.txt"
