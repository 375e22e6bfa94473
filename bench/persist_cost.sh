#!/usr/bin/env bash
# What `--data-dir` costs: server CPU per check of a node keeping its buckets on disk against
# the same binary without, both running at once, the load moved from one to the other in short
# slices (the target: at most 1.10x, single check and batch of 100 on distinct keys).
#
#   bench/persist_cost.sh                          # 30 pairs of 2 s slices per path
#   PAIRS=60 SLICE=2 PATHS="batch100" bench/persist_cost.sh
#   AA=1 bench/persist_cost.sh                     # the method's own check: neither keeps
#                                                  # buckets on disk, the ratio should be 1
#
# Why slices, not rounds in turn (bench/cpu.sh): this host's speed drifts within a run by more
# than what is measured here (cpu.sh's baseline moved 0.93-1.26 us per check from one round to
# the next, its rounds' ratios 0.89-1.48, for a cost of about a tenth). Two nodes started once
# and loaded in turn, slice after slice, the order swapped every pair (ABBA), see the same host
# alike. Both answer the same load (wrk, the same script and keys' range), one at a time.
#
# Each node's CPU is counted over its whole timeline, cut at the end of each of its slices: a
# slice's figure is its node's utime+stime from the end of its previous slice to the end of
# this one (so the commit and the snapshot that finish after a slice, and the idle node's own
# timers, are counted, each once) over the checks the node counted in that slice. What a node
# spends in the SETTLE seconds (default 2) after a path's last pair counts in its totals. Both
# are single nodes (no seeds), `--http-threads HTTP_THREADS --max-keys MAX_KEYS`; the one with
# a data directory gets a fresh one (removed on exit).
#
# Paths (PATHS, default "batch100 check"): batchN = POST /v1/check/batch of N
# (bench/wrk/batch.lua, BATCH_BODIES bodies per wrk thread), check = POST /v1/check
# (bench/wrk/check.lua). Keys over KEYSPACE, an inline rule of CHECK_PERIOD_MS (default a day:
# every bucket is kept on disk, the worst case for writes).
#
# Output: a line per pair, and per path the ratio of the totals (all slices' CPU over all
# slices' checks, on / off), the median of the pairs' ratios and its quartiles. Raw lines in
# OUT_DIR/slices.tsv.
#
# Env: BIN (one binary for both, bench/lib.sh), PAIRS (30), SLICE seconds (2), WARMUP seconds
# per node and path before the pairs (5), WRK_THREADS (2), CONNS (8), HTTP_THREADS (2),
# MAX_KEYS (1000000), KEYSPACE (1000000), CHECK_PERIOD_MS (86400000), BATCH_BODIES (1000).
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PAIRS="${PAIRS:-30}"
SLICE="${SLICE:-2}"
WARMUP="${WARMUP:-5}"
WRK_THREADS="${WRK_THREADS:-2}"
CONNS="${CONNS:-8}"
HTTP_THREADS="${HTTP_THREADS:-2}"
MAX_KEYS="${MAX_KEYS:-1000000}"
PATHS="${PATHS:-batch100 check}"
export KEYSPACE="${KEYSPACE:-1000000}"
export CHECK_PERIOD_MS="${CHECK_PERIOD_MS:-86400000}"
export BATCH_BODIES="${BATCH_BODIES:-1000}"
need wrk curl python3
build_node
HZ="$(getconf CLK_TCK)"

DATA=$(mktemp -d "${TMPDIR:-/tmp}/ringlimit-persist-cost.XXXXXX")
at_exit "rm -rf '$DATA'"

# Node 0 without a data directory, node 1 with one.
NAMES=(off on)
for i in 0 1; do
  ports_free "$(http_port "$i")" "$(peer_port "$i")"
  extra=()
  [ "$i" = 1 ] && [ "${AA:-0}" != 1 ] && extra=(--data-dir "$DATA")
  RUST_LOG=warn "$BIN" serve --node-id "bench-${NAMES[$i]}" --http "127.0.0.1:$(http_port "$i")" \
    --peer "127.0.0.1:$(peer_port "$i")" --http-threads "$HTTP_THREADS" --max-keys "$MAX_KEYS" \
    "${extra[@]}" 2>"$OUT_DIR/node-${NAMES[$i]}.log" &
  PIDS+=($!)
done
for i in 0 1; do
  wait_ready "http://127.0.0.1:$(http_port "$i")/readyz" "${PIDS[$i]}" "$OUT_DIR/node-${NAMES[$i]}.log" \
    "node ${NAMES[$i]}"
done

checks_of() { # NODE: every ringlimit_checks_total series, summed
  curl -sf --max-time 5 "http://127.0.0.1:$(http_port "$1")/metrics" |
    awk '/^ringlimit_checks_total[{ ]/ { s += $NF } END { printf "%.0f\n", s }'
}

load() { # NODE PATH SECONDS
  local lua upath size=1
  case $2 in
    check) lua=check.lua upath=/v1/check ;;
    batch*) lua=batch.lua upath=/v1/check/batch size=${2#batch} ;;
    *) die "unknown path $2" ;;
  esac
  BATCH_SIZE=$size job timeout --kill-after=5 $(($3 + 30)) wrk -t"$WRK_THREADS" -c"$CONNS" -d"$3s" \
    -s "$BENCH_DIR/wrk/$lua" "http://127.0.0.1:$(http_port "$1")$upath" >"$OUT_DIR/wrk-last.txt" 2>&1 ||
    { cat "$OUT_DIR/wrk-last.txt" >&2; die "wrk failed on node ${NAMES[$1]}"; }
  # Socket errors, and answers other than 200/429 or batch items answered with an error (counted
  # by the wrk scripts): a slice of errors would measure something else than checks.
  local errors
  errors=$(wrk_script_errors "$OUT_DIR/wrk-last.txt")
  grep -q "Socket errors" "$OUT_DIR/wrk-last.txt" && errors=$((errors + 1))
  if ((errors > 0)); then
    local kept="$OUT_DIR/wrk-errors-${NAMES[$1]}-$2-$SECONDS.txt"
    cp "$OUT_DIR/wrk-last.txt" "$kept"
    log "WARNING: errors on node ${NAMES[$1]} ($2): see $kept"
  fi
  return 0
}

printf 'path\tpair\tnode\tchecks\tticks\tus_per_check\n' >"$OUT_DIR/slices.tsv"
for path in $PATHS; do
  log "$path: warm-up ${WARMUP}s on each node"
  for i in 0 1; do load "$i" "$path" "$WARMUP"; done
  # Where each node's timeline was last cut: its ticks and checks at the end of its last slice.
  last_ticks=("$(pid_ticks "${PIDS[0]}")" "$(pid_ticks "${PIDS[1]}")")
  for ((pair = 1; pair <= PAIRS; pair++)); do
    order=(0 1)
    ((pair % 2)) || order=(1 0)
    line="$path pair $pair:"
    for i in "${order[@]}"; do
      c0=$(checks_of "$i")
      load "$i" "$path" "$SLICE"
      c1=$(checks_of "$i")
      t=$(pid_ticks "${PIDS[$i]}")
      dt=$((t - last_ticks[i]))
      last_ticks[i]=$t
      us=$(awk -v t="$dt" -v c=$((c1 - c0)) -v hz="$HZ" 'BEGIN { printf "%.3f", (c > 0 ? t * 1e6 / hz / c : 0) }')
      printf '%s\t%d\t%s\t%d\t%d\t%s\n' "$path" "$pair" "${NAMES[$i]}" $((c1 - c0)) "$dt" "$us" >>"$OUT_DIR/slices.tsv"
      line="$line ${NAMES[$i]} $us"
    done
    log "$line us/check"
  done
  sleep "${SETTLE:-2}"
  for i in 0 1; do
    t=$(pid_ticks "${PIDS[$i]}")
    printf '%s\t0\t%s\t0\t%d\t0\n' "$path" "${NAMES[$i]}" $((t - last_ticks[i])) >>"$OUT_DIR/slices.tsv"
  done
done

python3 - "$OUT_DIR/slices.tsv" "$HZ" <<'PY' | tee "$OUT_DIR/summary.txt"
import collections, statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
by = collections.defaultdict(dict)
settle = collections.defaultdict(int)  # pair 0: ticks after a path's last pair
for path, pair, node, checks, ticks, us in rows:
    if int(pair) == 0:
        settle[(path, node)] += int(ticks)
    else:
        by[(path, int(pair))][node] = (int(checks), int(ticks))
print("path      pairs  off_us  on_us  on/off(totals)  on/off(median of pairs)  quartiles")
for path in dict.fromkeys(p for p, _ in by):
    pairs = [v for (p, _), v in sorted(by.items()) if p == path and len(v) == 2]
    tot = {n: [sum(v[n][0] for v in pairs), sum(v[n][1] for v in pairs) + settle[(path, n)]]
           for n in ("off", "on")}
    us = {n: tot[n][1] / tot[n][0] for n in tot}  # ticks per check; the ratio needs no unit
    ratios = sorted((v["on"][1] / v["on"][0]) / (v["off"][1] / v["off"][0]) for v in pairs)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    hz = int(sys.argv[2])
    print(f"{path:9} {len(pairs):5}  {us['off'] * 1e6 / hz:6.3f} {us['on'] * 1e6 / hz:6.3f}"
          f"  {us['on'] / us['off']:14.3f}  {statistics.median(ratios):23.3f}  {q[0]:.3f}-{q[2]:.3f}")
PY
