#!/usr/bin/env bash
# One request held to three limits (per user, per IP, per endpoint) through one node of three:
# one POST /v1/check/all against three POST /v1/check calls, side by side, alternating each
# round, on the same 3-node cluster on 127.0.0.1.
#
#   bench/all.sh                          # 10 s per load, 3 rounds
#   DURATION=5 RUNS=5 bench/all.sh
#   BENCH_NICE=-10 bench/all.sh           # nodes ahead of the machine's other work (root)
#   OPEN_RATES="5000 9000" bench/all.sh   # also check/all at fixed rates (open loop)
#
# Figures per request of three limits: requests/s, latency (for the separate calls, per call:
# a request needs three in turn), and the nodes' CPU time per request (utime + stime of all
# three nodes over the load, steadier than throughput on a shared machine).
# With OPEN_RATES, then check/all alone at each rate (requests/s), RUNS times, from
# bench/openloop (8 connections, latency from each request's scheduled time, so a stall is not
# hidden by the closed loop's waiting): p50, p99, p99.9.
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION="${DURATION:-10}"
RUNS="${RUNS:-3}"
CONNS="${CONNS:-8}"
export KEYSPACE="${KEYSPACE:-100000}"
need wrk
build_node

# Limits high enough that nearly every request is admitted (what is measured is the path).
cat >"$OUT_DIR/rules.yaml" <<'YAML'
rules:
  - { name: per-user, limit: 1000000000, period: 1h }
  - { name: per-ip, limit: 1000000000, period: 1h }
YAML

start_nodes 3 all --config "$OUT_DIR/rules.yaml"
# BENCH_NICE=-10 (as root): the nodes ahead of everything else on the machine, wrk included.
if [ -n "${BENCH_NICE:-}" ]; then
  renice -n "$BENCH_NICE" -p "${PIDS[@]}" >/dev/null
fi
HZ=$(getconf CLK_TCK)

# LABEL MODE -> "requests_of_3_per_s p50_ms p99_ms cpu_us_per_request"
measure() {
  local label=$1 mode=$2 c0 c1 rps p50 p99 per
  c0=$(nodes_cpu)
  read -r rps p50 p99 <<<"$(MODE=$mode wrk_load "$label" all.lua)"
  c1=$(nodes_cpu)
  per=1
  [ "$mode" = three ] && per=3
  awk -v rps="$rps" -v per="$per" -v p50="$p50" -v p99="$p99" -v dc="$((c1 - c0))" \
    -v hz="$HZ" -v d="$DURATION" 'BEGIN {
      req = rps / per
      printf "%.0f %s %s %.1f\n", req, p50, p99, (dc / hz * 1e6) / (req * d)
    }'
}

log "warm-up"
MODE=all wrk_load warmup-all all.lua >/dev/null
MODE=three wrk_load warmup-three all.lua >/dev/null
: >"$OUT_DIR/results.tsv"
for ((run = 1; run <= RUNS; run++)); do
  order="all three"
  ((run % 2 == 0)) && order="three all"
  for mode in $order; do
    log "round $run: $mode"
    echo "$run $mode $(measure "$mode-$run" "$mode")" >>"$OUT_DIR/results.tsv"
  done
done

python3 - "$OUT_DIR/results.tsv" "$CONNS" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
conns = sys.argv[2]
def med(mode, col):
    return statistics.median(float(r[col]) for r in rows if r[1] == mode)
print(f"{'per request of 3 limits, ' + conns + ' connections':44}{'check/all':>12}{'3x check':>12}{'ratio':>8}")
for label, col in [("requests/s", 2), ("p50 ms (3x check: per call)", 3),
                   ("p99 ms (3x check: per call)", 4), ("node CPU us per request", 5)]:
    a, t = med("all", col), med("three", col)
    print(f"{label:44}{a:12.3f}{t:12.3f}{a / t if t else float('nan'):8.2f}")
print("per round:", " | ".join(f"{r[0]} {r[1]} {float(r[2]):.0f}/s p99 {r[4]} ms" for r in rows))
a_rps, t_rps, a_p99 = med("all", 2), med("three", 2), med("all", 4)
print(f"targets: check/all p99 < 1 ms: {'PASS' if a_p99 < 1 else 'MISS'} ({a_p99:.3f}); "
      f">= 2x the requests/s of three calls: {'PASS' if a_rps >= 2 * t_rps else 'MISS'} ({a_rps / t_rps:.2f}x)")
PY

if [ -n "${OPEN_RATES:-}" ]; then
  build_openloop
  body='{"checks":[{"key":"user:{n}","rule":"per-user"},{"key":"ip:{n}","rule":"per-ip"},'
  body+='{"key":"POST /orders","limit":1000000,"period_ms":1000}]}'
  echo "check/all at a fixed rate (open loop, $CONNS connections, $DURATION s per run), ms:"
  printf '%10s %4s %9s %8s %8s %8s %7s\n' rate run achieved p50 p99 p99.9 errors
  for rate in $OPEN_RATES; do
    for ((run = 1; run <= RUNS; run++)); do
      "$OPENLOOP" --url "http://127.0.0.1:$(http_port 0)/v1/check/all" --rate "$rate" \
        --duration "$DURATION" --warmup 2 --connections "$CONNS" --keyspace "$KEYSPACE" \
        --body-template "$body" --json >"$OUT_DIR/open-$rate-$run.json"
      python3 - "$OUT_DIR/open-$rate-$run.json" "$rate" "$run" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]:>10} {sys.argv[3]:>4} {r['achieved']:9.0f} {r['p50_ms']:8.3f} "
      f"{r['p99_ms']:8.3f} {r['p999_ms']:8.3f} {r['errors'] + r['timeouts']:7d}")
PY
    done
  done
fi
log "raw results in $OUT_DIR"
