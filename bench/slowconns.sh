#!/usr/bin/env bash
# A node under thousands of slow and idle connections, while real clients check through it.
#
#   bench/slowconns.sh                       # 10,000 hostile connections, 10 s, 3 rounds
#   SLOW=20000 MAX_CONNECTIONS=10000 bench/slowconns.sh
#
# bench/slowconns.py keeps SLOW connections open to one release node on 127.0.0.1: half send
# half a request header and then a byte now and then (slowloris), half connect and say nothing;
# every one the node closes is reopened at once. Meanwhile wrk -c8 sends POST /v1/check
# (bench/wrk/check.lua). Reported: wrk's checks/s and p50/p99 with and without the flood, the
# connections the flood held open, and how many the node closed (header timeout, idle, cap).
# With 2-second drips the slowloris half is closed by the header timeout (5 s) and reopened.
# Needs a high open-files limit: the script raises its own (as root) before starting anything.
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$BENCH_DIR/.." && pwd)"
DURATION="${DURATION:-10}"
RUNS="${RUNS:-3}"
SLOW="${SLOW:-10000}"
export CONNS="${CONNS:-8}"
MAX_CONNECTIONS="${MAX_CONNECTIONS:-10000}"
OUT_DIR="${OUT_DIR:-$BENCH_DIR/out/slowconns-$(date +%Y%m%d-%H%M%S)}"
BASE_PORT="${BASE_PORT:-39800}"
mkdir -p "$OUT_DIR"
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

SCRIPT=slowconns.sh
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"

start_nodes 1 slow --http-max-connections "$MAX_CONNECTIONS"
HTTP="127.0.0.1:$(http_port 0)"

run_wrk() { # LABEL -> "rps p50 p99"
  wrk_load "$1" check.lua
}

: >"$OUT_DIR/results.tsv"
for ((run = 1; run <= RUNS; run++)); do
  log "round $run: without the flood"
  echo "$run quiet $(run_wrk "quiet-$run") 0" >>"$OUT_DIR/results.tsv"
  log "round $run: with $SLOW slow/idle connections"
  python3 "$BENCH_DIR/slowconns.py" "$HTTP" "$SLOW" $((DURATION + 8)) >"$OUT_DIR/slow-$run.txt" &
  flood=$!
  sleep 5 # let the flood reach its size before measuring
  echo "$run flood $(run_wrk "flood-$run")" >>"$OUT_DIR/results.tsv"
  wait "$flood" || true
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
