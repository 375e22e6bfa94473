#!/usr/bin/env bash
# A key flood: millions of distinct keys at the highest rate this machine allows, while real
# clients check a small set of other keys; the node must stay within --max-keys and keep those
# clients' p99 low.
#
#   bench/keyflood.sh
#   MAX_KEYS=200000 DURATION=30 bench/keyflood.sh
#   FLOOD_CONNS=1 bench/keyflood.sh         # a lighter flood: one connection, closed loop
#   BENCH_NICE=-10 bench/keyflood.sh        # the node ahead of the load generators (root)
#   OPEN_RATE=5000 bench/keyflood.sh        # the clients at a fixed rate (open loop), not wrk
#   FLOOD_IDLE=1 bench/keyflood.sh          # the flood's wrk on idle CPU only (SCHED_IDLE)
#   CLIENT_NICE=-10 bench/keyflood.sh       # the clients' generator ahead of the node (root)
#   PIN=1 OPEN_RATE=5000 bench/keyflood.sh  # the node alone on CPU 0, both generators on CPU 1
#
# One release node on 127.0.0.1 with --max-keys MAX_KEYS. The flood: wrk -t1 -cFLOOD_CONNS (16) sending
# POST /v1/check/batch of 100 never-seen keys (bench/wrk/flood.lua). The clients: wrk -t1 -c2
# POST /v1/check on 1,000 keys (bench/wrk/check.lua), first alone (quiet), then with the flood.
# Sampled each second: VmRSS, buckets held and evictions (/metrics). Reported: keys flooded and
# per second, most buckets held, evictions, peak RSS, and the clients' checks/s, p50 and p99.
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION="${DURATION:-20}"
MAX_KEYS="${MAX_KEYS:-1000000}"
FLOOD_CONNS="${FLOOD_CONNS:-16}"
need wrk
build_node

# PIN=1 (bench/lib.sh): the node alone on CPU 0, so with one HTTP thread, saturated by a flood
# whose CPU is not its own.
start_nodes 1 flood --max-keys "$MAX_KEYS"
PORT=$(http_port 0)
PID=${PIDS[0]}
# BENCH_NICE=-10 (as root): the node ahead of both wrk processes, to tell the node's own
# queueing from the CPU its load generators take.
if [ -n "${BENCH_NICE:-}" ]; then
  renice -n "$BENCH_NICE" -p "$PID" >/dev/null
fi

if [ -n "${OPEN_RATE:-}" ]; then
  build_openloop
fi

# CLIENT_NICE=-10 (as root): the clients' generator wakes ahead of the node's busy threads, to
# tell the node's queueing from the generator's own wait for a core.
CLIENT_WRAP="${GEN_WRAP:-}"
if [ -n "${CLIENT_NICE:-}" ]; then CLIENT_WRAP="$CLIENT_WRAP nice -n $CLIENT_NICE"; fi

probe() { # LABEL -> "rps p50 p99"
  local out="$OUT_DIR/$1.txt"
  if [ -n "${OPEN_RATE:-}" ]; then
    # Latency from each request's scheduled time: the flood's stalls are not hidden by a
    # closed loop that stops sending while it waits.
    # shellcheck disable=SC2086 # a command prefix, split on purpose
    $CLIENT_WRAP "$OPENLOOP" --url "http://127.0.0.1:$PORT/v1/check" --rate "$OPEN_RATE" --duration "$DURATION" \
      --warmup 1 --connections 2 --keyspace 1000 \
      --body-template '{"key":"probe:{n}","limit":100,"period_ms":1000}' --json >"$out"
    python3 - "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{r['achieved']:.0f} {r['p50_ms']:.3f} {r['p99_ms']:.3f}")
PY
    return
  fi
  # shellcheck disable=SC2086 # a command prefix, split on purpose
  KEYSPACE=1000 KEY_PREFIX="probe:" timeout $((DURATION + 30)) $CLIENT_WRAP wrk -t1 -c2 -d"${DURATION}s" \
    --latency -s "$BENCH_DIR/wrk/check.lua" "http://127.0.0.1:$PORT" >"$out" 2>&1
  echo "$(awk '/^Requests\/sec/ {print $2}' "$out") $(to_ms "$(awk '$1 == "50%" {print $2}' "$out")") $(to_ms "$(awk '$1 == "99%" {print $2}' "$out")")"
}

sample() { # every second until killed: "t rss_kb buckets evictions"
  local t=0
  while true; do
    local rss buckets evictions
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/$PID/status")
    # One scrape a second: rendering /metrics takes the node's HTTP thread ~0.4 ms with a full
    # store, time the clients' checks then wait for.
    read -r buckets evictions < <(curl -s "http://127.0.0.1:$PORT/metrics" |
      awk '/^ringlimit_buckets / {b = $2} /^ringlimit_evictions_total / {e = $2} END {print b, e}')
    echo "$t $rss $buckets $evictions"
    sleep 1
    t=$((t + 1))
  done
}

log "clients alone for ${DURATION}s"
read -r q_rps q_p50 q_p99 < <(probe quiet)
sample >"$OUT_DIR/samples.txt" &
SAMPLER=$!
HELPERS+=("$SAMPLER")
log "flood (wrk -c$FLOOD_CONNS, 100 new keys a request) and clients for ${DURATION}s"
# FLOOD_IDLE=1 (bench/lib.sh): wrk building 100-key batches otherwise shares the 2 cores with
# the node and its clients, and each of its scheduler slices is a wait for them.
# shellcheck disable=SC2086 # a command prefix, split on purpose
timeout $((DURATION + 30)) $FLOOD_WRAP wrk -t1 -c"$FLOOD_CONNS" -d"$((DURATION + 2))s" -s "$BENCH_DIR/wrk/flood.lua" \
  "http://127.0.0.1:$PORT" >"$OUT_DIR/flood.txt" 2>&1 &
FLOOD=$!
HELPERS+=("$FLOOD")
sleep 1
read -r f_rps f_p50 f_p99 < <(probe flooded)
wait "$FLOOD" || true
sleep 1
stop_pids "$SAMPLER"
HELPERS=()
keys=$(sed -n 's/.*keys=\([0-9]*\).*/\1/p' "$OUT_DIR/flood.txt")
bad=$(sed -n 's/.*bad_responses=\([0-9]*\).*/\1/p' "$OUT_DIR/flood.txt")
hwm=$(awk '/^VmHWM/ {print $2}' "/proc/$PID/status")
read -r max_rss max_buckets last_evictions < <(awk '
  { if ($2 > r) r = $2; if ($3 > b) b = $3; e = $4 } END { print r, b, e }' "$OUT_DIR/samples.txt")
{
  echo "max-keys                    $MAX_KEYS"
  echo "keys flooded                $keys in $((DURATION + 2)) s ($((keys / (DURATION + 2)))/s), bad responses $bad"
  echo "most buckets held           $max_buckets"
  echo "evictions                   $last_evictions"
  echo "RSS: most sampled, peak     $((max_rss / 1024)) MiB, $((hwm / 1024)) MiB"
  printf '%-28s%12s%12s\n' "clients (${OPEN_RATE:+open loop }${OPEN_RATE:-wrk -c2}${OPEN_RATE:+/s})" quiet flooded
  printf '%-28s%12s%12s\n' "checks/s" "$q_rps" "$f_rps"
  printf '%-28s%12s%12s\n' "p50 ms" "$q_p50" "$f_p50"
  printf '%-28s%12s%12s\n' "p99 ms" "$q_p99" "$f_p99"
} | tee "$OUT_DIR/summary.txt"
