#!/usr/bin/env bash
# Blocked checks against owned ones: server CPU per check of a blocked key checked through the
# nodes that do not own it, against the same load on keys each receiving node owns (decided
# where they arrive); then a flood of FLOOD distinct blocked keys (a DDoS against a per-IP
# rule) against those unblocked owned keys.
#
#   bench/blocks.sh                        # 10 s per load, one round
#   DURATION=5 RUNS=3 bench/blocks.sh      # medians over 3 rounds
#
# Loads (3 wrk at once, one per node, each `wrk -t1 -cCONNS` of bench/wrk/check.lua):
#   owned      node i checks a key node i owns, rule `open` (the floor)
#   blocked    every node checks one key that node 1 owns, blocked through the admin API:
#              nodes 0 and 2 answer it without forwarding (target: at most 1.0x owned)
#   flood      every node checks FLOOD distinct keys, each blocked (managed blocks put through
#              the admin API before the load), rule `per-ip` (target: within 1.1x of owned)
# The figure is the cluster's CPU (utime + stime of the three nodes, /proc) over the checks
# answered (wrk's requests), and each load's ratio to owned.
#
# Env: DURATION (10), RUNS (1), CONNS (8 per wrk), FLOOD (100000), BIN (bench/lib.sh).
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION="${DURATION:-10}"
RUNS="${RUNS:-1}"
CONNS="${CONNS:-8}"
FLOOD="${FLOOD:-100000}"
export RINGLIMIT_ADMIN_TOKEN="bench-admin-token"
need wrk curl python3
build_node

RULES="$OUT_DIR/rules.yaml"
cat >"$RULES" <<'RULES_END'
rules:
  - name: open
    limit: 1000000
    period: 1s
    lease: off
  - name: per-ip
    limit: 1000000
    period: 1s
    lease: off
RULES_END

# owner KEY RULE: the node id that owns KEY under RULE (asked of node 0).
owner() {
  curl -sf -H "authorization: Bearer $RINGLIMIT_ADMIN_TOKEN" \
    "http://127.0.0.1:$(http_port 0)/v1/admin/keys/$1?rule=$2" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["owner"])'
}

# prefix_owned_by NODE RULE: a KEY_PREFIX p whose key "p0" node bench-NODE owns.
prefix_owned_by() {
  local n
  for ((n = 0; n < 200; n++)); do
    if [ "$(owner "own$n:0" "$2")" = "bench-$1" ]; then
      echo "own$n:"
      return
    fi
  done
  die "no key owned by bench-$1"
}

# block_keys PREFIX COUNT: managed blocks of PREFIX0 .. PREFIX(COUNT-1), through node 0.
block_keys() {
  python3 - "$(http_port 0)" "$1" "$2" "$RINGLIMIT_ADMIN_TOKEN" <<'PY'
import http.client, json, sys
port, prefix, count, token = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
conn = http.client.HTTPConnection("127.0.0.1", port)
body = json.dumps({"ttl": "1h", "reason": "bench"})
head = {"authorization": f"Bearer {token}", "content-type": "application/json"}
for n in range(count):
    conn.request("PUT", f"/v1/admin/blocks/{prefix}{n}", body, head)
    r = conn.getresponse()
    r.read()
    if r.status != 200:
        sys.exit(f"PUT {prefix}{n}: {r.status}")
PY
}

# three LABEL RULE KEYSPACE PREFIX0 PREFIX1 PREFIX2: wrk on node i with KEY_PREFIX PREFIXi,
# all at once; prints "requests ticks" (cluster CPU ticks).
three() {
  local label=$1 rule=$2 keyspace=$3 i pids=() before after
  before=$(nodes_cpu)
  for i in 0 1 2; do
    local p=$((4 + i))
    RULE=$rule KEYSPACE=$keyspace KEY_PREFIX=${!p} timeout --foreground --kill-after=5 \
      $((DURATION + 30)) wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$BENCH_DIR/wrk/check.lua" \
      "http://127.0.0.1:$(http_port "$i")" >"$OUT_DIR/$label-$i.txt" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  after=$(nodes_cpu)
  python3 - "$OUT_DIR/$label" "$((after - before))" <<'PY'
import re, sys
base, ticks = sys.argv[1], int(sys.argv[2])
req = sum(int(re.search(r"(\d+) requests in", open(f"{base}-{i}.txt").read()).group(1)) for i in range(3))
print(req, ticks)
PY
}

HZ=$(getconf CLK_TCK)
us_per_check() { awk -v t="$1" -v r="$2" -v hz="$HZ" 'BEGIN {printf "%.2f", t / hz * 1e6 / r}'; }

declare -A R
for ((run = 1; run <= RUNS; run++)); do
  log "round $run: three nodes"
  start_nodes 3 "run$run" --config "$RULES"
  o0=$(prefix_owned_by 0 open)
  o1=$(prefix_owned_by 1 open)
  o2=$(prefix_owned_by 2 open)
  block_keys "$o1" 1
  log "blocking $FLOOD flood keys"
  block_keys "flood:" "$FLOOD"
  sleep 2 # an announce round, and then some
  three "warm-$run" open 1 "$o0" "$o1" "$o2" >/dev/null
  for load in owned blocked flood; do
    case $load in
      owned) set -- open 1 "$o0" "$o1" "$o2" ;;
      blocked) set -- open 1 "$o1" "$o1" "$o1" ;;
      flood) set -- per-ip "$FLOOD" "flood:" "flood:" "flood:" ;;
    esac
    read -r req ticks <<<"$(three "$load-$run" "$@")"
    R[${load}_rps]+="$(awk -v r="$req" -v d="$DURATION" 'BEGIN {printf "%.0f", r / d}') "
    R[${load}_us]+="$(us_per_check "$ticks" "$req") "
    log "$load: $req checks, $(us_per_check "$ticks" "$req") us of cluster CPU each"
  done
  curl -s "http://127.0.0.1:$(http_port 0)/metrics" | grep -E '^ringlimit_(block|forwarded)' \
    >"$OUT_DIR/metrics-n0-$run.txt" || true
  stop_nodes
done

med() { tr ' ' '\n' <<<"${R[$1]}" | grep -v '^$' | median; }
{
  printf 'load\tchecks_per_s\tcluster_cpu_us_per_check\tratio_to_owned\n'
  owned=$(med owned_us)
  for load in owned blocked flood; do
    us=$(med "${load}_us")
    printf '%s\t%s\t%s\t%s\n' "$load" "$(med "${load}_rps")" "$us" \
      "$(awk -v a="$us" -v b="$owned" 'BEGIN {printf "%.2f", a / b}')"
  done
} | tee "$OUT_DIR/summary.txt"
