#!/usr/bin/env bash
# What `--replicas 1` costs against `--replicas 0` (the cost target: server CPU per check at most
# 1.15x), on three paths, interleaved in one run on the same 3-node cluster layout, and the
# replication lag under that load:
#   - sdk:    the client SDK straight to each key's owner, at a fixed RATE checks/s;
#   - single: POST /v1/check through node 0 (wrk -t2 -c8, bench/wrk/check.lua);
#   - batch:  POST /v1/check/batch of 100 through node 0 (bench/wrk/batch.lua).
# Keys are spread over KEYSPACE (default 100,000), so nearly every check changes a bucket of its
# own: the worst case for replication (a hot key's changes coalesce).
#
#   bench/replica_cost.sh                       # RUNS=3 rounds of 0, 1; 8 s per load
#   RUNS=5 SECS=8 PATHS="sdk batch" bench/replica_cost.sh
#   FILL=0 bench/replica_cost.sh                # keys created during the loads
#
# FILL=1 (default) creates every key's bucket before the loads (batches of 1,000 through node 0),
# so that the loads measure a steady key population; with FILL=0 about a quarter of the SDK
# load's checks create their bucket (an owner with replicas then also looks for a copy of it).
#
# Server CPU is the three nodes' utime+stime from /proc over the load, divided by the checks the
# load generator had answered. The machine has 2 shared cores: read the medians and the ratio.
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
RUNS="${RUNS:-3}"
SECS="${SECS:-8}"
RATE="${RATE:-30000}" # RATE=0: the SDK flat out (8 callers, closed loop), as wrk runs the others
RATE_ARGS=()
if [ "$RATE" != 0 ]; then RATE_ARGS=(--rate "$RATE"); fi
PATHS="${PATHS:-sdk single batch}"
REPLICAS="${REPLICAS:-0 1}"
export KEYSPACE="${KEYSPACE:-100000}"
need wrk python3
build_node
cargo_release -p ringlimit-client --example sdk_load
LOAD="$CARGO_TARGET_DIR/release/examples/sdk_load"
[ -x "$LOAD" ] || die "no sdk_load at $LOAD"

# One load on the running cluster: appends {"path","replicas","run","checks","cpu_us_per_check",
# "p50_ms","p99_ms"}.
measure() { # PATH REPLICAS RUN
  local path=$1 r=$2 run=$3 c0 c1 checks p50 p99
  c0=$(nodes_cpu)
  case $path in
    sdk)
      # shellcheck disable=SC2086
      ${GEN_WRAP:-} "$LOAD" --seeds "$SEEDS" --mode sdk --seconds "$SECS" --concurrency 8 \
        "${RATE_ARGS[@]}" --keys "$KEYSPACE" >"$OUT_DIR/sdk-$r-$run.json"
      read -r checks p50 p99 < <(python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))
print(j["checks"], j["p50_us"] / 1e3, j["p99_us"] / 1e3)' "$OUT_DIR/sdk-$r-$run.json")
      ;;
    single | batch)
      local script=check.lua per=1
      if [ "$path" = batch ]; then script=batch.lua per=100; fi
      read -r _ p50 p99 < <(DURATION=$SECS CONNS=8 BATCH_SIZE=100 wrk_load "$path-$r-$run" "$script")
      checks=$(awk -v per=$per '/requests in/ {print $1 * per}' "$OUT_DIR/$path-$r-$run.txt")
      ;;
  esac
  c1=$(nodes_cpu)
  python3 -c 'import json,sys
p,r,run,ticks,hz,checks,p50,p99=sys.argv[1:]
print(json.dumps({"path":p,"replicas":int(r),"run":int(run),"checks":int(checks),
  "cpu_us_per_check":int(ticks)*1e6/int(hz)/max(int(checks),1),
  "p50_ms":float(p50),"p99_ms":float(p99)}))' \
    "$path" "$r" "$run" "$((c1 - c0))" "$(getconf CLK_TCK)" "$checks" "$p50" "$p99" >>"$OUT_DIR/results.jsonl"
  log "  $path, replicas $r: $(tail -1 "$OUT_DIR/results.jsonl")"
}

# Each node's replication lag histogram after the loads, as "node le count" lines.
lag() { # REPLICAS RUN
  local i
  for ((i = 0; i < 3; i++)); do
    curl -sf "http://127.0.0.1:$(http_port "$i")/metrics" |
      awk -v n="$i" -v r="$1" -v run="$2" '/^ringlimit_replication_lag_seconds_bucket/ {
        match($0, /le="[^"]*"/); print r, run, n, substr($0, RSTART + 4, RLENGTH - 5), $NF }'
  done >>"$OUT_DIR/lag.txt"
}

SEEDS="http://127.0.0.1:$(http_port 0),http://127.0.0.1:$(http_port 1),http://127.0.0.1:$(http_port 2)"
for ((run = 1; run <= RUNS; run++)); do
  for r in $REPLICAS; do
    log "round $run: --replicas $r"
    start_nodes 3 "r$r-$run" --replicas "$r"
    if [ "${FILL:-1}" = 1 ]; then
      node_fill "$KEYSPACE" "load:" '"limit":1000000,"period_ms":60000'
      node_fill "$KEYSPACE" "user:" '"limit":100,"period_ms":1000,"algorithm":"token_bucket"'
    fi
    # Warm-up: connections, the SDK's ring, the tables' first growth.
    "$LOAD" --seeds "$SEEDS" --mode sdk --seconds 2 --concurrency 8 --keys "$KEYSPACE" >/dev/null
    for path in $PATHS; do measure "$path" "$r" "$run"; done
    lag "$r" "$run"
    stop_nodes
  done
done

python3 - "$OUT_DIR/results.jsonl" "$OUT_DIR/lag.txt" <<'PY'
import json, statistics, sys
from collections import defaultdict
rows = [json.loads(l) for l in open(sys.argv[1])]
paths = list(dict.fromkeys(r["path"] for r in rows))
# ratio: of the medians; paired: the median of each round's replicas-1 / replicas-0 (the two
# clusters of a round run back to back, so a slow spell of the machine hits both)
print(f"{'server CPU us/check':22}{'replicas 0':>34}{'replicas 1':>34}{'ratio':>8}{'paired':>8}")
for p in paths:
    v = {k: [r["cpu_us_per_check"] for r in rows if r["path"] == p and r["replicas"] == k] for k in (0, 1)}
    m = {k: statistics.median(x) if x else float("nan") for k, x in v.items()}
    fmt = lambda x: ", ".join(f"{y:.2f}" for y in x)
    ratio = m[1] / m[0] if m[0] == m[0] and m[0] else float("nan")
    by_run = {(r["run"], r["replicas"]): r["cpu_us_per_check"] for r in rows if r["path"] == p}
    pairs = [by_run[(n, 1)] / by_run[(n, 0)] for (n, k) in by_run if k == 0 and (n, 1) in by_run and by_run[(n, 0)]]
    paired = statistics.median(pairs) if pairs else float("nan")
    print(f"{p:22}{fmt(v[0]):>34}{fmt(v[1]):>34}{ratio:8.2f}{paired:8.2f}")
# latency as the load generator saw it (sdk_load's own percentiles; wrk --latency), per round
print(f"{'p50/p99 ms per round':22}{'replicas 0':>34}  {'replicas 1':>34}{'p99 ratio':>10}")
for p in paths:
    q = {k: [(r["p50_ms"], r["p99_ms"]) for r in rows if r["path"] == p and r["replicas"] == k] for k in (0, 1)}
    fmt = lambda x: " ".join(f"{a:.3f}/{b:.3f}" for a, b in x)
    m = {k: statistics.median(b for _, b in x) if x else float("nan") for k, x in q.items()}
    ratio = m[1] / m[0] if m[0] == m[0] and m[0] else float("nan")
    print(f"{p:22}{fmt(q[0]):>34}  {fmt(q[1]):>34}{ratio:10.2f}")
# lag: per node and round, the smallest bucket bound holding 99% of observations
buckets = defaultdict(list)
try:
    for line in open(sys.argv[2]):
        r, run, node, le, count = line.split()
        buckets[(int(r), run, node)].append((float("inf") if le == "+Inf" else float(le), float(count)))
except FileNotFoundError:
    pass
for (r, run, node), b in sorted(buckets.items()):
    if r == 0 or not b or b[-1][1] == 0:
        continue
    total = max(c for _, c in b)
    p50 = next(le for le, c in sorted(b) if c >= 0.5 * total)
    p99 = next(le for le, c in sorted(b) if c >= 0.99 * total)
    print(f"lag, round {run} node {node}: {int(total)} frames, p50 <= {p50 * 1e3:g} ms, p99 <= {p99 * 1e3:g} ms")
PY
log "raw results in $OUT_DIR"
