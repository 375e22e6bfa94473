#!/usr/bin/env bash
# gRPC through one node: Envoy's ShouldRateLimit (one and three descriptors) and ringlimit.v1
# Check, beside POST /v1/check, side by side in alternating order on the same node.
#
#   bench/grpc.sh                      # 10 s per load, 3 rounds, 8 concurrent streams
#   DURATION=5 RUNS=5 bench/grpc.sh
#
# The gRPC load comes from h2load (Debian's nghttp2-client: a client we did not write) posting
# a fixed gRPC frame over STREAMS concurrent HTTP/2 streams (H2_CONNS connections of
# STREAMS/H2_CONNS each); POST /v1/check from wrk with CONNS=STREAMS connections. Each request
# names the same buckets (h2load sends one body), so the HTTP load does too (KEYSPACE=1): what
# is measured is the path, not the store. Limits are high enough that every call is admitted.
# Figures: calls/s, p50/p99 (h2load's per-request log; wrk's --latency), and the node's CPU
# time per call (utime + stime over the load: steadier than throughput on a shared machine).
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION="${DURATION:-10}"
RUNS="${RUNS:-3}"
STREAMS="${STREAMS:-8}"
H2_CONNS="${H2_CONNS:-2}"
export CONNS="$STREAMS"
GRPC_PORT=$(aux_port 0)
need wrk
build_node
# shellcheck source=bench/grpc_setup.sh
source "$BENCH_DIR/grpc_setup.sh"

# shellcheck disable=SC2046
start_nodes 1 grpc $(grpc_flags)
HZ=$(getconf CLK_TCK)
grpc_probe

measure() { # MODE LABEL -> "calls_per_s p50_ms p99_ms cpu_us_per_call"
  local mode=$1 label=$2 c0 c1 rps p50 p99
  c0=$(nodes_cpu)
  if [ "$mode" = http ]; then
    read -r rps p50 p99 <<<"$(KEYSPACE=1 RULE=bench wrk_load "$label" check.lua)"
  else
    read -r rps p50 p99 <<<"$(h2_load "$mode" "$label")"
  fi
  c1=$(nodes_cpu)
  awk -v rps="$rps" -v p50="$p50" -v p99="$p99" -v dc="$((c1 - c0))" -v hz="$HZ" \
    -v d="$DURATION" 'BEGIN { printf "%.0f %s %s %.1f\n", rps, p50, p99, (dc / hz * 1e6) / (rps * d) }'
}

log "warm-up"
DURATION=2 measure http warmup-http >/dev/null
DURATION=2 measure rls3 warmup-rls3 >/dev/null
MODES=(http rls1 rls3 v1)
: >"$OUT_DIR/results.tsv"
for ((run = 1; run <= RUNS; run++)); do
  # Rotate the order each round so that no load always runs first.
  order=("${MODES[@]:$(((run - 1) % 4))}" "${MODES[@]:0:$(((run - 1) % 4))}")
  for mode in "${order[@]}"; do
    log "round $run: $mode"
    echo "$run $mode $(measure "$mode" "$mode-$run")" >>"$OUT_DIR/results.tsv"
  done
done

python3 - "$OUT_DIR/results.tsv" "$STREAMS" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
def med(mode, col):
    return statistics.median(float(r[col]) for r in rows if r[1] == mode)
names = {"http": "POST /v1/check", "rls1": "RLS 1 descr.", "rls3": "RLS 3 descr.", "v1": "v1 Check"}
print(f"{sys.argv[2]} concurrent streams/connections, medians of {len(rows) // 4} rounds")
print(f"{'':26}" + "".join(f"{names[m]:>16}" for m in names))
for label, col in [("calls/s", 2), ("p50 ms", 3), ("p99 ms", 4), ("node CPU us per call", 5)]:
    print(f"{label:26}" + "".join(f"{med(m, col):16.3f}" for m in names))
print(f"{'calls/s vs POST /v1/check':26}" + "".join(f"{med(m, 2) / med('http', 2):16.2f}" for m in names))
print("per round:", " | ".join(f"{r[0]} {r[1]} {float(r[2]):.0f}/s p99 {r[4]}" for r in rows))
for m in ("rls1", "rls3"):
    p99 = med(m, 4)
    print(f"target {names[m]} p99 < 1 ms: {'PASS' if p99 < 1 else 'MISS'} ({p99:.3f} ms)")
PY
log "raw results in $OUT_DIR"
