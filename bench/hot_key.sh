#!/usr/bin/env bash
# One hot key through every node: server CPU per check of one key checked through all three nodes at
# once, against the same load on keys each receiving node owns, and against the hot key with leases
# off (every check forwarded to its owner); then, with a limit that denies, what one window admits
# through every node (never over the limit; false denies under 2%).
#
#   bench/hot_key.sh                       # 10 s per load, one round
#   DURATION=5 RUNS=3 bench/hot_key.sh     # medians over 3 rounds
#
# Loads (3 wrk at once, one per node, each `wrk -t1 -cCONNS` of bench/wrk/check.lua on a single
# key, so every request is one check of that key):
#   owned      node i checks a key node i owns (the floor: decided where it arrives)
#   hot        every node checks one key that node 1 owns: nodes 0 and 2 lease it (rule `hot`)
#   forwarded  the same with `lease: off` (rule `hot-off`): nodes 0 and 2 forward every check
# The figure is the cluster's CPU (utime + stime of the three nodes, /proc) over the checks
# answered (wrk's requests), and the ratio hot / owned (target: at most 1.2).
#   window     rule `hot-window` (fixed window, WINDOW_LIMIT per 10 s) through every node,
#              started just after a window opens and stopped before it closes: admitted
#              (200s) against the limit, never over; false denies = limit - admitted.
# Everything runs on 127.0.0.1; the three nodes and the three wrk share this machine's cores,
# so read ratios and medians. OUT_DIR keeps the wrk outputs, node logs and metrics.
#
# Env: DURATION (10), RUNS (1), CONNS (8 per wrk), WINDOW_LIMIT (20000), BIN (bench/lib.sh).
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION="${DURATION:-10}"
RUNS="${RUNS:-1}"
CONNS="${CONNS:-8}"
WINDOW_LIMIT="${WINDOW_LIMIT:-20000}"
export RINGLIMIT_ADMIN_TOKEN="bench-admin-token"
need wrk curl python3
build_node

RULES="$OUT_DIR/rules.yaml"
cat >"$RULES" <<EOF
rules:
  - name: hot
    limit: 1000000
    period: 1s
    algorithm: token_bucket
  - name: hot-off
    limit: 1000000
    period: 1s
    algorithm: token_bucket
    lease: off
  - name: hot-window
    limit: $WINDOW_LIMIT
    period: 10s
    algorithm: fixed_window
EOF

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
    if [ "$(owner "hot$n:0" "$2")" = "bench-$1" ]; then
      echo "hot$n:"
      return
    fi
  done
  die "no key owned by bench-$1"
}

# three LABEL RULE PREFIX0 PREFIX1 PREFIX2 [DURATION]: wrk on node i with KEY_PREFIX PREFIXi,
# all at once; prints "requests allowed ticks" (cluster CPU ticks).
three() {
  local label=$1 rule=$2 d=${6:-$DURATION} i pids=() before after
  before=$(nodes_cpu)
  for i in 0 1 2; do
    local p=$((3 + i))
    RULE=$rule KEYSPACE=1 KEY_PREFIX=${!p} timeout --foreground --kill-after=5 $((d + 30)) \
      wrk -t1 -c"$CONNS" -d"${d}s" -s "$BENCH_DIR/wrk/check.lua" \
      "http://127.0.0.1:$(http_port "$i")" >"$OUT_DIR/$label-$i.txt" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  after=$(nodes_cpu)
  python3 - "$OUT_DIR/$label" "$((after - before))" <<'PY'
import re, sys
base, ticks = sys.argv[1], int(sys.argv[2])
req = allowed = 0
for i in range(3):
    text = open(f"{base}-{i}.txt").read()
    req += int(re.search(r"(\d+) requests in", text).group(1))
    allowed += int(re.search(r"allowed_200=(\d+)", text).group(1))
print(req, allowed, ticks)
PY
}

# metric NODE SERIES: one series of node NODE's /metrics.
metric() {
  curl -s "http://127.0.0.1:$(http_port "$1")/metrics" |
    awk -v s="$2" '$1 == s {print $2; found = 1} END {if (!found) print 0}'
}

HZ=$(getconf CLK_TCK)
us_per_check() { awk -v t="$1" -v r="$2" -v hz="$HZ" 'BEGIN {printf "%.2f", t / hz * 1e6 / r}'; }

declare -A R
for ((run = 1; run <= RUNS; run++)); do
  log "round $run: three nodes"
  start_nodes 3 "run$run" --config "$RULES"
  o0=$(prefix_owned_by 0 hot)
  o1=$(prefix_owned_by 1 hot)
  o2=$(prefix_owned_by 2 hot)
  h=$o1
  hoff=$(prefix_owned_by 1 hot-off)
  hwin=$(prefix_owned_by 1 hot-window)
  log "owned keys ${o0}0 ${o1}0 ${o2}0; hot key ${h}0 (owner bench-1)"
  three "warm-$run" hot "$o0" "$o1" "$o2" 2 >/dev/null
  for load in owned hot forwarded; do
    case $load in
      owned) set -- hot "$o0" "$o1" "$o2" ;;
      hot) set -- hot "$h" "$h" "$h" ;;
      forwarded) set -- hot-off "$hoff" "$hoff" "$hoff" ;;
    esac
    # The hot key's first second is spent getting leased: warm it first.
    [ "$load" = owned ] || three "warm-$load-$run" "$@" 2 >/dev/null
    read -r req allowed ticks <<<"$(three "$load-$run" "$@")"
    R[${load}_rps]+="$(awk -v r="$req" -v d="$DURATION" 'BEGIN {printf "%.0f", r / d}') "
    R[${load}_us]+="$(us_per_check "$ticks" "$req") "
    log "$load: $req checks ($allowed allowed), $(us_per_check "$ticks" "$req") us of cluster CPU each"
  done
  leased=$(($(metric 0 'ringlimit_leased_checks_total{result="allowed"}') + $(metric 2 'ringlimit_leased_checks_total{result="allowed"}')))
  R[leased]+="$leased "
  curl -s "http://127.0.0.1:$(http_port 0)/metrics" | grep -E '^ringlimit_(lease|leased|hot)' >"$OUT_DIR/metrics-n0-$run.txt" || true

  # A window of hot-window through every node: start 200 ms into a window, stop 1 s before
  # it ends (the window is 10 s: WINDOW_D 8 s of load).
  python3 -c 'import time; t = time.time(); time.sleep(10 - t % 10 + 0.2)'
  read -r req allowed _ <<<"$(three "window-$run" hot-window "$hwin" "$hwin" "$hwin" 8)"
  R[window_allowed]+="$allowed "
  R[window_checks]+="$req "
  log "window: $allowed admitted of $WINDOW_LIMIT ($req checks)"
  stop_nodes
done

med() { tr ' ' '\n' <<<"${R[$1]}" | grep -v '^$' | median; }
{
  printf 'load\tchecks_per_s\tcluster_cpu_us_per_check\tratio_to_owned\n'
  owned=$(med owned_us)
  for load in owned hot forwarded; do
    us=$(med "${load}_us")
    printf '%s\t%s\t%s\t%s\n' "$load" "$(med "${load}_rps")" "$us" \
      "$(awk -v a="$us" -v b="$owned" 'BEGIN {printf "%.2f", a / b}')"
  done
  printf '\nwindow (limit %s per 10 s): admitted %s (runs: %s), checks %s; over the limit: %s\n' \
    "$WINDOW_LIMIT" "$(med window_allowed)" "${R[window_allowed]}" "$(med window_checks)" \
    "$(for a in ${R[window_allowed]}; do ((a > WINDOW_LIMIT)) && echo yes; done | grep -q yes && echo YES || echo no)"
  printf 'checks decided on leases at nodes 0 and 2 (per run): %s\n' "${R[leased]}"
} | tee "$OUT_DIR/summary.txt"
