#!/usr/bin/env bash
# Global rules benchmark, two parts, all on 127.0.0.1:
#
# 1. Throughput: the same named rule over a small hot key set, checked through one node of
#    three, once as `mode: global` (answered on the spot from gossiped counters) and once as
#    `mode: owner` (two thirds of the checks forwarded to their owner). wrk, bench/wrk/check.lua with RULE.
# 2. Accuracy: over-admission as a function of --global-publish-ms. For each interval, three
#    fresh nodes; a steady LOAD_RATE checks/s on one hot key, round-robin over the three, for one
#    aligned window of a fixed-window global rule of ACC_LIMIT per ACC_PERIOD_MS; admitted vs
#    the limit. The load is paced (not closed-loop): 250 checks/s by default, the rate the
#    global rules' accuracy target is stated at.
#
#   bench/global.sh                                  # defaults below
#   DURATION=5 RUNS=3 ACC_RUNS=3 bench/global.sh     # medians over 3 rounds
#   INTERVALS="25 100" SKIP_THROUGHPUT=1 bench/global.sh
#
# All three nodes and the load generator share this machine's cores: read the global/owner
# ratio and the over-admission, not absolute checks/s.
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION="${DURATION:-10}"
RUNS="${RUNS:-1}"
CONNS="${CONNS:-8}"
export KEYSPACE="${KEYSPACE:-100}"
INTERVALS="${INTERVALS:-10 50 100 250 500}"
ACC_LIMIT="${ACC_LIMIT:-300}"
ACC_PERIOD_MS="${ACC_PERIOD_MS:-4000}"
LOAD_RATE="${LOAD_RATE:-250}"
ACC_RUNS="${ACC_RUNS:-1}"
GOSSIP_MS="${GOSSIP_MS:-100}"
need wrk
build_node

RULES="$OUT_DIR/rules.yaml"
cat >"$RULES" <<YAML
rules:
  # Throughput: never limiting, so both modes measure their admit path.
  - name: hot-global
    limit: 1000000000
    period: 1m
    algorithm: sliding_window
    mode: global
  - name: hot-owner
    limit: 1000000000
    period: 1m
    algorithm: sliding_window
    mode: owner
  # Accuracy.
  - name: acc
    limit: $ACC_LIMIT
    period: ${ACC_PERIOD_MS}ms
    algorithm: fixed_window
    mode: global
YAML

# Three nodes with the rules above, publishing global counters every PUBLISH_MS.
start_global_nodes() { # PUBLISH_MS LABEL
  start_nodes 3 "$2" --config "$RULES" --gossip-interval-ms "$GOSSIP_MS" --global-publish-ms "$1"
}

# wrk with check.lua naming RULE over the hot keys; prints "rps p50_ms p99_ms".
load() { # label rule
  RULE="$2" KEY_PREFIX=hot: wrk_load "$1" check.lua
}

forwarded() { # node 0's forwarded checks so far
  curl -s "http://127.0.0.1:$(http_port 0)/v1/cluster" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["forwarding"]["forwarded"])'
}


# One aligned window of paced load on the `acc` rule, round-robin over three nodes.
# Prints "admitted sent late_ms_max".
paced_window() {
  python3 - "$LOAD_RATE" "$ACC_PERIOD_MS" "$(http_port 0)" "$(http_port 1)" "$(http_port 2)" <<'PY'
import http.client, json, sys, threading, time
rate, period = float(sys.argv[1]), int(sys.argv[2])
ports = [int(p) for p in sys.argv[3:]]
n = len(ports)
now = time.time() * 1000
start = (now // period + 1) * period           # next window boundary (Unix ms)
t0 = start + 50                                 # a little after it
stop = start + period - 300                     # and well before its end
count = int((stop - t0) / 1000 * rate)
results = [[] for _ in ports]

def worker(k):
    conn = http.client.HTTPConnection("127.0.0.1", ports[k], timeout=5)
    body = json.dumps({"key": "acc-hot", "rule": "acc"})
    late = 0.0
    for i in range(k, count, n):                # check i goes to node i % n at t0 + i / rate
        due = (t0 + i * 1000 / rate) / 1000
        wait = due - time.time()
        if wait > 0:
            time.sleep(wait)
        else:
            late = max(late, -wait * 1000)
        conn.request("POST", "/v1/check", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        a = json.loads(r.read())
        results[k].append((a["allowed"], a["reset_at_ms"], a["degraded"]))
    results[k].append(late)

time.sleep(max(0, (t0 - time.time() * 1000) / 1000))
threads = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
for t in threads: t.start()
for t in threads: t.join()
end = start + period
admitted = sum(1 for r in results for x in r[:-1] if x[0] and x[1] == end)
other_window = sum(1 for r in results for x in r[:-1] if x[1] != end)
degraded = sum(1 for r in results for x in r[:-1] if x[2])
sent = sum(len(r) - 1 for r in results)
late = max(r[-1] for r in results)
if other_window or degraded:
    print(f"warning: {other_window} checks outside the window, {degraded} degraded", file=sys.stderr)
print(admitted, sent, round(late, 1))
PY
}

declare -A R
if [ "${SKIP_THROUGHPUT:-0}" != 1 ]; then
  for ((run = 1; run <= RUNS; run++)); do
    log "throughput round $run: one node of three, $KEYSPACE hot keys"
    start_global_nodes 100 tput
    load "warmup" hot-global >/dev/null
    f0=$(forwarded)
    read -r rps p50 p99 <<<"$(load "global-$run" hot-global)"
    f1=$(forwarded)
    R[g_rps]+="$rps "; R[g_p50]+="$p50 "; R[g_p99]+="$p99 "; R[g_fwd]+="$((f1 - f0)) "
    read -r rps p50 p99 <<<"$(load "owner-$run" hot-owner)"
    f2=$(forwarded)
    R[o_rps]+="$rps "; R[o_p50]+="$p50 "; R[o_p99]+="$p99 "; R[o_fwd]+="$((f2 - f1)) "
    curl -s "http://127.0.0.1:$(http_port 0)/v1/cluster" >"$OUT_DIR/cluster-$run.json"
    stop_nodes
  done
fi

declare -A ACC
for interval in $INTERVALS; do
  for ((run = 1; run <= ACC_RUNS; run++)); do
    log "accuracy: --global-publish-ms $interval, round $run"
    start_global_nodes "$interval" "acc-$interval"
    read -r admitted sent late <<<"$(paced_window 2>>"$OUT_DIR/acc-$interval.err")"
    echo "$admitted $sent $late" >>"$OUT_DIR/acc-$interval.txt"
    ACC[$interval]+="$admitted "
    ACC[sent_$interval]+="$sent "
    ACC[late_$interval]+="$late "
    stop_nodes
  done
done

m() { tr ' ' '\n' <<<"$1" | grep -v '^$' | median; }
{
  echo
  echo "ringlimit global rules benchmark — $(date -u +%FT%TZ), $(nproc) cores"
  if [ "${SKIP_THROUGHPUT:-0}" != 1 ]; then
    echo
    echo "throughput through one node of three: wrk -t2 -c$CONNS, ${DURATION}s, $KEYSPACE keys, RUNS=$RUNS (median)"
    printf '%-34s %12s %10s %10s %14s\n' mode "checks/s" "p50 ms" "p99 ms" "forwarded"
    printf '%-34s %12s %10s %10s %14s\n' "global (decided on the spot)" "$(m "${R[g_rps]}")" "$(m "${R[g_p50]}")" "$(m "${R[g_p99]}")" "$(m "${R[g_fwd]}")"
    printf '%-34s %12s %10s %10s %14s\n' "owner (2/3 forwarded)" "$(m "${R[o_rps]}")" "$(m "${R[o_p50]}")" "$(m "${R[o_p99]}")" "$(m "${R[o_fwd]}")"
    awk -v g="$(m "${R[g_rps]}")" -v o="$(m "${R[o_rps]}")" 'BEGIN {printf "ratio global / owner: %.2f\n", g / o}'
  fi
  echo
  echo "over-admission vs publish interval: limit $ACC_LIMIT per $ACC_PERIOD_MS ms (fixed window, global),"
  echo "$LOAD_RATE checks/s on one key round-robin over 3 nodes for one window, gossip every $GOSSIP_MS ms, ACC_RUNS=$ACC_RUNS (median)"
  printf '%-20s %10s %8s %12s %8s %10s\n' "--global-publish-ms" admitted limit "over %" sent "late ms"
  for interval in $INTERVALS; do
    a=$(m "${ACC[$interval]}")
    printf '%-20s %10s %8s %12s %8s %10s\n' "$interval" "$a" "$ACC_LIMIT" \
      "$(awk -v a="$a" -v l="$ACC_LIMIT" 'BEGIN {printf "%+.1f", 100 * (a - l) / l}')" \
      "$(m "${ACC[sent_$interval]}")" "$(m "${ACC[late_$interval]}")"
  done
  echo "(late ms: how far the paced load fell behind its schedule at worst; keep it small)"
  echo "raw outputs: $OUT_DIR"
} | tee "$OUT_DIR/summary.txt"
