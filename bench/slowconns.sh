#!/usr/bin/env bash
# A node under thousands of slow and idle connections, while real clients check through it.
#
#   bench/slowconns.sh                       # 10,000 hostile connections, 10 s, 3 rounds
#   SLOW=20000 MAX_CONNECTIONS=10000 bench/slowconns.sh
#   OPEN_RATE=20000 bench/slowconns.sh       # real clients at a fixed rate (open loop), not wrk
#   FLOOD_IDLE=1 OPEN_RATE=20000 bench/slowconns.sh   # the flood's process on idle CPU only
#   PIN=1 OPEN_RATE=20000 bench/slowconns.sh # node alone on CPU 0; flood (idle-class), clients on CPU 1
#   PROTO=grpc bench/slowconns.sh            # the gRPC port: h2load's ShouldRateLimit calls
#   PROTO=grpc OPEN_RATE=10000 bench/slowconns.sh     # ... at a fixed rate (h2load --rps)
#
# bench/slowconns.py keeps SLOW connections open to one release node on 127.0.0.1: half send
# half a request header and then a byte now and then (slowloris), half connect and say nothing;
# every one the node closes is reopened at once. Meanwhile wrk -c8 sends POST /v1/check
# (bench/wrk/check.lua). Reported: wrk's checks/s and p50/p99 with and without the flood, the
# connections the flood held open, and how many the node closed (header timeout, idle, cap).
# With OPEN_RATE, the real clients are bench/openloop at that many checks/s over CONNS
# connections instead (latency from each request's scheduled time): what clients that do not
# saturate the machine see, where wrk's closed loop keeps both cores busy by itself.
# With 2-second drips the slowloris half is closed by the header timeout (5 s) and reopened.
# PROTO=grpc floods the gRPC port instead (its slow half: HTTP/2 preface, then a PING every 2 s,
# never a call), and the real clients are h2load sending ShouldRateLimit with three descriptors
# over H2_CONNS connections (STREAMS in flight); with OPEN_RATE, h2load --rps (each call's
# latency from its sending, not its schedule).
# Needs a high open-files limit: the script raises its own (as root) before starting anything.
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION="${DURATION:-10}"
RUNS="${RUNS:-3}"
SLOW="${SLOW:-10000}"
export CONNS="${CONNS:-8}"
MAX_CONNECTIONS="${MAX_CONNECTIONS:-10000}"
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
need wrk
build_node

PROTO="${PROTO:-http}"
if [ "$PROTO" = grpc ]; then
  GRPC_PORT=$(aux_port 0)
  STREAMS="${STREAMS:-8}"
  H2_CONNS="${H2_CONNS:-2}"
  # shellcheck source=bench/grpc_setup.sh
  source "$BENCH_DIR/grpc_setup.sh"
  cap=()
  # A build from before the gRPC port had limits (BIN=..., for a before/after) lacks the flag.
  if "$BIN" serve --help | grep -q grpc-max-connections; then
    cap=(--grpc-max-connections "$MAX_CONNECTIONS")
  fi
  # shellcheck disable=SC2046
  start_nodes 1 slow $(grpc_flags) "${cap[@]}"
  grpc_probe
  TARGET="127.0.0.1:$GRPC_PORT"
  FLOOD_KIND=h2
else
  start_nodes 1 slow --http-max-connections "$MAX_CONNECTIONS"
  TARGET="127.0.0.1:$(http_port 0)"
  FLOOD_KIND=http
fi
HTTP="127.0.0.1:$(http_port 0)"

# FLOOD_IDLE=1 / PIN=1 (bench/lib.sh, FLOOD_WRAP): the Python flood's bursts (5,000 drips at
# once) otherwise take the cores from the node and its clients.

if [ -n "${OPEN_RATE:-}" ] && [ "$PROTO" = http ]; then
  build_openloop
fi

run_wrk() { # LABEL -> "rps p50 p99"
  if [ "$PROTO" = grpc ]; then
    local rps=""
    [ -n "${OPEN_RATE:-}" ] && rps=$((OPEN_RATE / H2_CONNS))
    RPS="$rps" h2_load rls3 "$1"
    return
  fi
  if [ -z "${OPEN_RATE:-}" ]; then
    wrk_load "$1" check.lua
    return
  fi
  # shellcheck disable=SC2086
  ${GEN_WRAP:-} "$OPENLOOP" --url "http://$HTTP/v1/check" --rate "$OPEN_RATE" --duration "$DURATION" \
    --warmup 2 --connections "$CONNS" --json >"$OUT_DIR/open-$1.json"
  python3 - "$OUT_DIR/open-$1.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{r['achieved']:.0f} {r['p50_ms']:.3f} {r['p99_ms']:.3f} {r['errors'] + r['timeouts']}")
PY
}

: >"$OUT_DIR/results.tsv"
for ((run = 1; run <= RUNS; run++)); do
  log "round $run: without the flood"
  echo "$run quiet $(run_wrk "quiet-$run") 0" >>"$OUT_DIR/results.tsv"
  log "round $run: with $SLOW slow/idle connections"
  # shellcheck disable=SC2086
  $FLOOD_WRAP python3 "$BENCH_DIR/slowconns.py" "$TARGET" "$SLOW" $((DURATION + 8)) "$FLOOD_KIND" >"$OUT_DIR/slow-$run.txt" &
  flood=$!
  HELPERS+=("$flood")
  sleep 5 # let the flood reach its size before measuring
  echo "$run flood $(run_wrk "flood-$run")" >>"$OUT_DIR/results.tsv"
  wait "$flood" || true
  HELPERS=()
done
python3 - "$OUT_DIR" "$RUNS" <<'PY'
import statistics, sys, glob
out, runs = sys.argv[1], int(sys.argv[2])
rows = [l.split() for l in open(f"{out}/results.tsv") if l.strip()]
def med(mode, col):
    return statistics.median(float(r[col]) for r in rows if r[1] == mode)
print(f"{'medians of ' + str(runs) + ' rounds':28}{'quiet':>12}{'flood':>12}")
for label, col in [("checks/s", 2), ("p50 ms", 3), ("p99 ms", 4)]:
    print(f"{label:28}{med('quiet', col):12.3f}{med('flood', col):12.3f}")
for f in sorted(glob.glob(f"{out}/slow-*.txt")):
    print(f.rsplit('/', 1)[1], open(f).read().strip())
print("per round:", " | ".join(f"{r[0]} {r[1]} {float(r[2]):.0f}/s p99 {r[4]}" for r in rows))
p99 = med("flood", 4)
print(f"target p99 < 5 ms under the flood: {'PASS' if p99 < 5 else 'MISS'} ({p99:.3f} ms)")
PY
log "raw results in $OUT_DIR"
