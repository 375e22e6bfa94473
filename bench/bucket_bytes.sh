#!/usr/bin/env bash
# Resident bytes per live bucket, measured as a user would: RSS of a release node after KEYS
# distinct keys through POST /v1/check/batch, minus its RSS when empty, divided by the buckets it
# holds (`ringlimit_buckets`). Reports the figure right after filling, after SETTLE seconds, and the
# peak (VmHWM) while filling, for each binary given, side by side:
#
#   bench/bucket_bytes.sh                       # this checkout's release build
#   BINS="/tmp/rl-before target/release/ringlimit" bench/bucket_bytes.sh
#
# With NODES=3 (REPLICAS=N, default 1, is passed as --replicas) the keys go through node 0 to
# their owners in a 3-node cluster, and the figures are the cluster's: every node's RSS summed,
# over the distinct buckets (the owners' `ringlimit_buckets` summed); `copies` is the replicas'
# `ringlimit_replica_buckets` summed, which those bytes include:
#
#   NODES=3 REPLICAS=1 KEYS=200000 bench/bucket_bytes.sh
#
# Env: KEYS (default 1000000; --max-keys is the same), ALGO (token_bucket|fixed_window|
# sliding_window|leaky_bucket; default token_bucket), SETTLE (default 5), RUNS (default 1),
# HTTP_THREADS (default 2), EXTRA_ENV (e.g. "MIMALLOC_PURGE_DELAY=0"), SKIP_BUILD=1, BASE_PORT,
# OUT_DIR (node logs; bench/lib.sh).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
KEYS="${KEYS:-1000000}"
ALGO="${ALGO:-token_bucket}"
SETTLE="${SETTLE:-5}"
RUNS="${RUNS:-1}"
HTTP_THREADS="${HTTP_THREADS:-2}"
NODE_ENV="${EXTRA_ENV:-} TOKIO_WORKER_THREADS=$HTTP_THREADS"
build_node

NODES="${NODES:-1}"
CLUSTER_ARGS=()
((NODES > 1)) && CLUSTER_ARGS=(--replicas "${REPLICAS:-1}")

# metric NAME: summed over the nodes.
metric() {
  local i sum=0 v
  for ((i = 0; i < NODES; i++)); do
    v=$(curl -sf "http://127.0.0.1:$(http_port "$i")/metrics" | awk -v m="$1" '$1 == m {print $2}')
    sum=$((sum + ${v:-0}))
  done
  echo "$sum"
}
# kb FIELD: a /proc status figure summed over the nodes.
kb() {
  local p sum=0
  for p in "${PIDS[@]}"; do sum=$((sum + $(proc_kb "$1" "$p"))); done
  echo "$sum"
}

printf '%-28s %4s %10s %10s %10s %12s %12s %12s\n' binary run buckets copies empty_MB "B/bkt_filled" "B/bkt_settled" "peak/settled"
for run in $(seq 1 "$RUNS"); do
  for bin in $BINS; do
    NODE_BIN=$bin start_nodes "$NODES" "$run-$(basename "$bin")" --http-threads "$HTTP_THREADS" \
      --max-keys "$KEYS" "${CLUSTER_ARGS[@]}"
    empty=$(kb VmRSS)
    node_fill "$KEYS" k "\"limit\":100,\"period_ms\":60000,\"algorithm\":\"$ALGO\""
    filled=$(kb VmRSS)
    sleep "$SETTLE"
    settled=$(kb VmRSS)
    hwm=$(kb VmHWM)
    n=$(metric ringlimit_buckets)
    copies=$(metric ringlimit_replica_buckets)
    stop_nodes
    awk -v b="$bin" -v r="$run" -v n="$n" -v c="$copies" -v e="$empty" -v f="$filled" -v s="$settled" -v h="$hwm" 'BEGIN {
      printf "%-28s %4d %10d %10d %10.1f %12.1f %12.1f %12.2f\n", substr(b, length(b) - 27), r, n, c, e / 1000,
        (f - e) * 1024 / n, (s - e) * 1024 / n, (h - e) / (s - e) }'
  done
done
