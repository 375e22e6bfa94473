#!/usr/bin/env bash
# HTTP load benchmark for ringlimit, with a Redis + Lua token-bucket baseline.
#
#   bench/http.sh                 # one round, 10 s per load
#   DURATION=5 RUNS=3 bench/http.sh
#
# Everything runs on 127.0.0.1 only. See bench/README.md for what each figure means.
#
# Env:
#   DURATION         seconds per load (default 10)
#   RUNS             rounds of all loads against the same server; the summary gives the median (default 1)
#   WARMUP           seconds of check.lua load before measuring (default 2, 0 to skip)
#   FOREIGN_WARN_PCT rerun / flag a load during which other processes used more than this % of the
#                    machine (default 10; an idle machine shows 0-3)
#   RETRIES          rerun a load up to this many times when FOREIGN_WARN_PCT was exceeded, keeping
#                    the cleanest attempt (default 2); RETRY_WAIT: bounded idle wait before each (30)
#   WAIT_IDLE        before starting and before each round, wait up to this many seconds for the
#                    CPUs to be under IDLE_BUSY_PCT % busy (default 60 and 15; 0 to not wait)
#   BENCH_NICE       run servers and load generators under `nice -n BENCH_NICE` (e.g. -10 as root,
#                    to keep concurrent builds on a shared machine from skewing the figures)
#   WRK_THREADS      wrk threads (default 2)
#   HTTP_THREADS     ringlimit --http-threads (default: the server's own, one per CPU).
#                    HTTP_THREADS=1 WRK_THREADS=1 gives each side one core, as redis-server and
#                    redis-benchmark --threads 1 have
#   REDIS_THREADS    redis-benchmark client threads (default 1)
#   MAX_KEYS         ringlimit --max-keys (default 1000000)
#   KEYSPACE         distinct keys (default 100000)
#   CHECK_LIMIT, CHECK_PERIOD_MS   inline token bucket used everywhere (default 100 per 1000 ms)
#   BASE_PORT        ringlimit's ports and Redis's (bench/lib.sh's table)
#   BIN              the node binary (default: this checkout's release build, built first unless
#                    SKIP_BUILD=1; CARGO_TARGET_DIR, default <repo>/target)
#   OUT_DIR          where raw outputs go (default bench/out/http-<timestamp>)
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DURATION="${DURATION:-10}"
RUNS="${RUNS:-1}"
WARMUP="${WARMUP:-2}"
WAIT_IDLE="${WAIT_IDLE:-60}"
IDLE_BUSY_PCT="${IDLE_BUSY_PCT:-15}"
BENCH_NICE="${BENCH_NICE:-}"
NICE=()
if [[ -n "$BENCH_NICE" ]]; then NICE=(nice -n "$BENCH_NICE"); fi
FOREIGN_WARN_PCT="${FOREIGN_WARN_PCT:-10}"
RETRIES="${RETRIES:-2}"
RETRY_WAIT="${RETRY_WAIT:-30}"
WRK_THREADS="${WRK_THREADS:-2}"
HTTP_THREADS="${HTTP_THREADS:-}"
REDIS_THREADS="${REDIS_THREADS:-1}"
MAX_KEYS="${MAX_KEYS:-1000000}"
export KEYSPACE="${KEYSPACE:-100000}"
export CHECK_LIMIT="${CHECK_LIMIT:-100}"
export CHECK_PERIOD_MS="${CHECK_PERIOD_MS:-1000}"
HOST=127.0.0.1

# Targets
TARGET_RATIO=1.5
TARGET_P99_MS=1
TARGET_BATCH=1000000

[[ "$DURATION" =~ ^[0-9]+$ && "$DURATION" -gt 0 ]] || die "DURATION must be a positive integer (seconds)"
[[ "$RUNS" =~ ^[0-9]+$ && "$RUNS" -gt 0 ]] || die "RUNS must be a positive integer"

# CPU accounting, to tell how much of the machine something else used during a load:
# foreign % = (all busy CPU time - our servers - our load generator) / all CPU time.
sys_cpu() { awk 'NR == 1 { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat; }
ours_cpu() { # servers + reaped children of this shell (wrk / redis-benchmark via timeout)
  local sum=0 pid
  for pid in "${PIDS[@]}"; do sum=$((sum + $(pid_ticks "$pid"))); done
  local st; st=$(cat "/proc/$$/stat"); st=${st##*) }  # $$: the main shell, which reaps the loads
  # shellcheck disable=SC2086
  set -- $st
  echo $((sum + ${14} + ${15}))
}

# Run a command in the background (so a signal interrupts `wait` at once and the trap can
# stop it), bounded by `timeout`, output to a file. Returns the command's status.
# Sets LAST_FOREIGN: % of the machine's CPU used by other processes meanwhile.
LAST_FOREIGN=NA
run_bounded() { # run_bounded SECONDS OUTFILE cmd...
  local secs=$1 out=$2; shift 2
  local s0 o0 s1 o1
  s0=$(sys_cpu); o0=$(ours_cpu)
  local rc=0
  job timeout --kill-after=5 "$secs" "${NICE[@]}" "$@" >"$out" 2>&1 || rc=$?
  s1=$(sys_cpu); o1=$(ours_cpu)
  LAST_FOREIGN=$(awk -v a="$s0" -v b="$s1" -v o0="$o0" -v o1="$o1" 'BEGIN {
    split(a, x, " "); split(b, y, " "); busy = y[1] - x[1]; tot = y[2] - x[2]; f = busy - (o1 - o0)
    if (f < 0) f = 0; printf "%.0f", (tot > 0 ? 100 * f / tot : 0) }')
  echo "# foreign CPU during this load: ${LAST_FOREIGN}% of the machine" >>"$out"
  return "$rc"
}

# ---------------------------------------------------------------- tools, build, ports
need wrk redis-server redis-cli=redis-tools redis-benchmark=redis-tools curl
build_node
log "raw outputs in $OUT_DIR"
HTTP_PORT=$(http_port 0)
PEER_PORT=$(peer_port 0)
REDIS_PORT=$(aux_port 1)
URL="http://$HOST:$HTTP_PORT"
log "ports: http=$HTTP_PORT peer=$PEER_PORT redis=$REDIS_PORT"

# ---------------------------------------------------------------- machine quiet?
cpu_busy_pct() { # % of all CPUs busy over ~1 s, from /proc/stat
  local a b
  a=$(head -1 /proc/stat); sleep 1; b=$(head -1 /proc/stat)
  awk -v a="$a" -v b="$b" 'BEGIN {
    n = split(a, x, " "); split(b, y, " "); t = 0; idle = 0
    for (i = 2; i <= n; i++) t += y[i] - x[i]
    idle = (y[5] - x[5]) + (y[6] - x[6])
    printf "%.0f", (t > 0 ? 100 * (t - idle) / t : 0) }'
}
# Wait (bounded by WAIT_IDLE seconds) for the CPUs to be quiet; on a shared machine a concurrent
# build would otherwise skew every figure. Sets BUSY (the last sample, in %).
wait_idle() { # [max seconds, default WAIT_IDLE]
  local deadline=$((SECONDS + ${1:-$WAIT_IDLE}))
  BUSY=$(cpu_busy_pct)
  while ((BUSY > IDLE_BUSY_PCT && SECONDS < deadline)); do
    log "machine busy (${BUSY}% CPU); waiting up to $((deadline - SECONDS)) s more for it to calm down"
    sleep 4
    BUSY=$(cpu_busy_pct)
  done
  if ((BUSY > IDLE_BUSY_PCT)); then
    log "WARNING: the machine is not idle (${BUSY}% busy); other processes will skew the figures"
    ps -eo pid,pcpu,comm --sort=-pcpu | head -6 >&2 || true
  fi
}
wait_idle
BUSY_BEFORE=$BUSY
log "CPU busy before start: ${BUSY_BEFORE}% (load average: $(cut -d' ' -f1-3 /proc/loadavg))"

# ---------------------------------------------------------------- start servers
log "starting ringlimit, waiting for /readyz"
NODE_WRAP="${NICE[*]}" start_nodes 1 http --max-keys "$MAX_KEYS" ${HTTP_THREADS:+--http-threads "$HTTP_THREADS"}
RL_PID=${PIDS[0]}

ports_free "$REDIS_PORT"
start_server "$OUT_DIR/redis-server.log" "${NICE[@]}" redis-server --port "$REDIS_PORT" --bind "$HOST" \
  --save '' --appendonly no --daemonize no
REDIS_PID=${PIDS[1]}

log "waiting for redis"
ready=""
for _ in $(seq 1 100); do  # at most ~10 s
  kill -0 "$REDIS_PID" 2>/dev/null || { tail -20 "$OUT_DIR/redis-server.log" >&2; die "redis-server exited early"; }
  if [[ "$(redis-cli -h "$HOST" -p "$REDIS_PORT" ping 2>/dev/null)" == PONG ]]; then ready=1; break; fi
  sleep 0.1
done
[[ -n "$ready" ]] || die "redis not ready after 10 s"

# ---------------------------------------------------------------- sanity checks
check_body="{\"key\":\"bench:sanity\",\"limit\":$CHECK_LIMIT,\"period_ms\":$CHECK_PERIOD_MS,\"algorithm\":\"token_bucket\",\"cost\":1}"
code=$(curl -sS -m 5 -o "$OUT_DIR/sanity-check.json" -w '%{http_code}' -H 'Content-Type: application/json' \
  -d "$check_body" "$URL/v1/check")
[[ "$code" == 200 ]] || die "POST /v1/check returned $code: $(cat "$OUT_DIR/sanity-check.json")"
code=$(curl -sS -m 5 -o "$OUT_DIR/sanity-batch.json" -w '%{http_code}' -H 'Content-Type: application/json' \
  -d "{\"checks\":[$check_body,{\"key\":\"bench:sanity\",\"rule\":\"default\"}]}" "$URL/v1/check/batch")
[[ "$code" == 200 ]] || die "POST /v1/check/batch returned $code: $(cat "$OUT_DIR/sanity-batch.json")"
grep -q '"error"' "$OUT_DIR/sanity-batch.json" && die "batch item error: $(cat "$OUT_DIR/sanity-batch.json")"

SHA=$(redis-cli -h "$HOST" -p "$REDIS_PORT" SCRIPT LOAD "$(cat "$BENCH_DIR/redis/token_bucket.lua")")
[[ "$SHA" =~ ^[0-9a-f]{40}$ ]] || die "SCRIPT LOAD failed: $SHA"
# rate in tokens per millisecond
REDIS_RATE=$(awk -v l="$CHECK_LIMIT" -v p="$CHECK_PERIOD_MS" 'BEGIN { printf "%.10g", l / p }')
REDIS_ARGS=(EVALSHA "$SHA" 1 "key:__rand_int__" "$CHECK_LIMIT" "$REDIS_RATE" 1)
sanity=$(redis-cli -h "$HOST" -p "$REDIS_PORT" EVALSHA "$SHA" 1 bench:sanity "$CHECK_LIMIT" "$REDIS_RATE" 1 | tr '\n' ' ')
[[ "$sanity" == "1 $((CHECK_LIMIT - 1)) " ]] || die "redis token bucket sanity check: got '$sanity'"
log "sanity checks passed (redis script sha $SHA)"

# ---------------------------------------------------------------- parsing helpers
wrk_rps() { awk '/^Requests\/sec:/ { print $2 }' "$1"; }
wrk_pct() { local v; v=$(awk -v p="$2%" '$1 == p { print $2; exit }' "$1"); [[ -n "$v" ]] && to_ms "$v" || echo NA; }
wrk_errors() { grep -E 'Socket errors|Non-2xx' "$1" | tr -s ' ' | paste -sd ';' - || true; }
# redis-benchmark --csv: "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
redis_csv_field() { # file column-name
  awk -F'","' -v col="$2" '
    NR == 1 { for (i = 1; i <= NF; i++) { h = $i; gsub(/"/, "", h); idx[h] = i } ; next }
    /^"/ { if (col in idx) { v = $(idx[col]); gsub(/"/, "", v); print v } else print "NA"; exit }' "$1"
}
median_of() { # numbers as args (NA ignored)
  printf '%s\n' "$@" | grep -Ev '^(NA|)$' | sort -g | awk '{ a[NR] = $1 } END {
    if (NR == 0) { print "NA"; exit }
    if (NR % 2) printf "%.3f\n", a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
fmt_int() { [[ "$1" == NA ]] && echo NA || printf "%'.0f" "$1"; }

WRK_BOUND=$((DURATION + 30))

ROUND_FOREIGN=0
note_foreign() {
  log "  foreign CPU during $(basename "$1"): ${LAST_FOREIGN}%"
  [[ "$LAST_FOREIGN" =~ ^[0-9]+$ ]] && ((LAST_FOREIGN > ROUND_FOREIGN)) && ROUND_FOREIGN=$LAST_FOREIGN
  return 0
}

# measured SECONDS OUTFILE cmd...: run_bounded, and when other processes used more than
# FOREIGN_WARN_PCT of the machine meanwhile, wait for quiet (up to RETRY_WAIT s) and run it again,
# up to RETRIES more times; the cleanest attempt is copied to OUTFILE (all kept as OUTFILE.tryN).
measured() {
  local secs=$1 out=$2; shift 2
  local attempt best="" bestf=1000 f
  for ((attempt = 0; attempt <= RETRIES; attempt++)); do
    f="$out.try$attempt"
    run_bounded "$secs" "$f" "$@" || { cp "$f" "$out"; return 1; }
    log "  attempt $attempt: foreign CPU ${LAST_FOREIGN}%"
    if ((LAST_FOREIGN < bestf)); then best=$f; bestf=$LAST_FOREIGN; fi
    ((LAST_FOREIGN > FOREIGN_WARN_PCT)) || break
    if ((attempt < RETRIES)); then
      log "  other processes used ${LAST_FOREIGN}% of the machine; retrying"
      wait_idle "$RETRY_WAIT"
    fi
  done
  cp "$best" "$out"
  LAST_FOREIGN=$bestf
  return 0
}

run_wrk() { # run_wrk OUTFILE CONNS SCRIPT [extra wrk args]
  local out=$1 conns=$2 script=$3; shift 3
  local threads=$WRK_THREADS
  ((threads > conns)) && threads=$conns
  log "wrk -t$threads -c$conns -d${DURATION}s -s $script $* -> $(basename "$out")"
  measured "$WRK_BOUND" "$out" wrk -t"$threads" -c"$conns" -d"${DURATION}s" --timeout 5s \
    -s "$BENCH_DIR/wrk/$script" "$@" "$URL" || die "wrk failed (see $out)"
  note_foreign "$out"
  grep -q '^Requests/sec:' "$out" || die "wrk produced no result (see $out)"
}

run_redis() { # run_redis OUTFILE CONNS N [calibrate]
  local out=$1 conns=$2 n=$3 how=measured
  [[ "${4:-}" == calibrate ]] && how=run_bounded
  log "redis-benchmark -c $conns -n $n -r $KEYSPACE ${REDIS_ARGS[*]} -> $(basename "$out")"
  $how $((DURATION * 4 + 30)) "$out" redis-benchmark -h "$HOST" -p "$REDIS_PORT" \
    -c "$conns" -n "$n" -r "$KEYSPACE" --threads "$REDIS_THREADS" --csv "${REDIS_ARGS[@]}" ||
    die "redis-benchmark failed (see $out)"
  [[ "$how" == run_bounded ]] || note_foreign "$out"
}

# size N so that a redis-benchmark run lasts about DURATION seconds (sets REDIS_N)
redis_n_for() { # conns
  local cal="$OUT_DIR/redis-calibrate-c$1.csv"
  run_redis "$cal" "$1" 50000 calibrate
  local rps; rps=$(redis_csv_field "$cal" rps)
  [[ "$rps" =~ ^[0-9.]+$ ]] || die "cannot parse redis-benchmark output ($cal)"
  REDIS_N=$(awk -v r="$rps" -v d="$DURATION" 'BEGIN { n = int(r * d); if (n < 10000) n = 10000; print n }')
}

# ---------------------------------------------------------------- warm-up
if ((WARMUP > 0)); then
  log "warm-up ${WARMUP}s"
  run_bounded $((WARMUP + 30)) "$OUT_DIR/warmup.txt" wrk -t"$WRK_THREADS" -c32 -d"${WARMUP}s" \
    -s "$BENCH_DIR/wrk/check.lua" "$URL" || die "warm-up failed"
fi

# ---------------------------------------------------------------- rounds
R_BUSY=(); R_FOREIGN=(); R_CHECK32=(); R_CHECK32_P99=(); R_ALLOWED=(); R_P50_8=(); R_P99_8=(); R_CHECK8=()
R_BATCH8=(); R_BATCH32=(); R_REDIS32=(); R_REDIS32_P99=(); R_REDIS8=(); R_REDIS8_P50=(); R_REDIS8_P99=()

for run in $(seq 1 "$RUNS"); do
  log "=== round $run/$RUNS ==="
  d="$OUT_DIR/run$run"; mkdir -p "$d"
  if ((run > 1)); then wait_idle; R_BUSY+=("$BUSY"); else R_BUSY+=("$BUSY_BEFORE"); fi
  ROUND_FOREIGN=0

  # a. single-check throughput @32
  run_wrk "$d/check-c32.txt" 32 check.lua --latency
  R_CHECK32+=("$(wrk_rps "$d/check-c32.txt")")
  R_CHECK32_P99+=("$(wrk_pct "$d/check-c32.txt" 99)")
  R_ALLOWED+=("$(sed -n 's/.*allowed_pct=\([0-9.]*\).*/\1/p' "$d/check-c32.txt" | head -1)")
  other=$(sed -n 's/.*other=\([0-9]*\).*/\1/p' "$d/check-c32.txt" | head -1)
  [[ "${other:-0}" == 0 ]] || log "WARNING: $other responses were neither 200 nor 429 (see $d/check-c32.txt)"

  # b. latency @8
  run_wrk "$d/check-c8.txt" 8 check.lua --latency
  R_CHECK8+=("$(wrk_rps "$d/check-c8.txt")")
  R_P50_8+=("$(wrk_pct "$d/check-c8.txt" 50)")
  R_P99_8+=("$(wrk_pct "$d/check-c8.txt" 99)")

  # c. batch of 1000 @8 and @32
  run_wrk "$d/batch-c8.txt" 8 batch.lua --latency
  R_BATCH8+=("$(awk -v r="$(wrk_rps "$d/batch-c8.txt")" 'BEGIN { printf "%.0f", r * 1000 }')")
  run_wrk "$d/batch-c32.txt" 32 batch.lua --latency
  R_BATCH32+=("$(awk -v r="$(wrk_rps "$d/batch-c32.txt")" 'BEGIN { printf "%.0f", r * 1000 }')")
  for f in "$d/batch-c8.txt" "$d/batch-c32.txt"; do
    bad=$(sed -n 's/.*http_other=\([0-9]*\).*/\1/p' "$f" | head -1)
    [[ "${bad:-0}" == 0 ]] || log "WARNING: $bad batch responses were not 200 (see $f)"
  done

  # d. Redis + Lua baseline @32 and @8
  redis_n_for 32
  run_redis "$d/redis-c32.csv" 32 "$REDIS_N"
  R_REDIS32+=("$(redis_csv_field "$d/redis-c32.csv" rps)")
  R_REDIS32_P99+=("$(redis_csv_field "$d/redis-c32.csv" p99_latency_ms)")
  redis_n_for 8
  run_redis "$d/redis-c8.csv" 8 "$REDIS_N"
  R_REDIS8+=("$(redis_csv_field "$d/redis-c8.csv" rps)")
  R_REDIS8_P50+=("$(redis_csv_field "$d/redis-c8.csv" p50_latency_ms)")
  R_REDIS8_P99+=("$(redis_csv_field "$d/redis-c8.csv" p99_latency_ms)")

  R_FOREIGN+=("$ROUND_FOREIGN")
  ((ROUND_FOREIGN <= FOREIGN_WARN_PCT)) ||
    log "WARNING: other processes used up to ${ROUND_FOREIGN}% of the machine during round $run; its figures are suspect"
  for f in "$d"/check-*.txt "$d"/batch-*.txt; do
    e=$(wrk_errors "$f"); [[ -z "$e" ]] || log "$(basename "$f"): $e"
  done
done

redis-cli -h "$HOST" -p "$REDIS_PORT" INFO keyspace >"$OUT_DIR/redis-keyspace.txt" 2>&1 || true
curl -sS -m 5 "$URL/metrics" >"$OUT_DIR/ringlimit-metrics.txt" 2>&1 || true
kill -0 "$RL_PID" 2>/dev/null || die "ringlimit died during the benchmark (see $OUT_DIR/node-http-0.log)"
LOADAVG_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- summary
M_CHECK32=$(median_of "${R_CHECK32[@]}")
M_CHECK32_P99=$(median_of "${R_CHECK32_P99[@]}")
M_ALLOWED=$(median_of "${R_ALLOWED[@]}")
M_CHECK8=$(median_of "${R_CHECK8[@]}")
M_P50_8=$(median_of "${R_P50_8[@]}")
M_P99_8=$(median_of "${R_P99_8[@]}")
M_BATCH8=$(median_of "${R_BATCH8[@]}")
M_BATCH32=$(median_of "${R_BATCH32[@]}")
M_REDIS32=$(median_of "${R_REDIS32[@]}")
M_REDIS32_P99=$(median_of "${R_REDIS32_P99[@]}")
M_REDIS8=$(median_of "${R_REDIS8[@]}")
M_REDIS8_P50=$(median_of "${R_REDIS8_P50[@]}")
M_REDIS8_P99=$(median_of "${R_REDIS8_P99[@]}")
# the ratio is taken per round and its median reported (both sides share the same machine state)
R_RATIO=()
for i in "${!R_CHECK32[@]}"; do
  R_RATIO+=("$(awk -v a="${R_CHECK32[$i]}" -v b="${R_REDIS32[$i]}" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "NA" }')")
done
M_RATIO=$(median_of "${R_RATIO[@]}")
M_BATCH=$(awk -v a="$M_BATCH8" -v b="$M_BATCH32" 'BEGIN { print (a > b ? a : b) }')

pf() { # pf VALUE OP TARGET -> PASS|MISS
  awk -v v="$1" -v op="$2" -v t="$3" 'BEGIN {
    if (v == "NA") { print "MISS"; exit }
    ok = (op == ">=" ? v >= t : (op == ">" ? v > t : v < t)); print (ok ? "PASS" : "MISS") }'
}
perrun() { local IFS=' '; echo "$*"; }

{
  echo
  echo "ringlimit HTTP benchmark — $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, DURATION=${DURATION}s, RUNS=$RUNS"
  echo "rule: token_bucket $CHECK_LIMIT per $CHECK_PERIOD_MS ms, keys: random of $KEYSPACE, wrk -t$WRK_THREADS, redis-benchmark --threads $REDIS_THREADS, ringlimit --http-threads ${HTTP_THREADS:-default}"
  echo "load generator and servers share the same cores: compare medians and ratios, not absolutes"
  [[ -z "$BENCH_NICE" ]] || echo "servers and load generators ran under nice -n $BENCH_NICE"
  echo "CPU busy before each round (%): $(perrun "${R_BUSY[@]}"); load average at the end: $LOADAVG_AFTER"
  echo "max CPU used by other processes during a load, per round (% of machine): $(perrun "${R_FOREIGN[@]}")" \
    "(above $FOREIGN_WARN_PCT: that round is suspect)"
  echo
  printf '%-40s %16s   %s\n' "figure" "median" "per round"
  printf '%-40s %16s   %s\n' "----------------------------------------" "----------------" "---------"
  printf '%-40s %16s   %s\n' "ringlimit check/s @32"               "$(fmt_int "$M_CHECK32")"   "$(perrun "${R_CHECK32[@]}")"
  printf '%-40s %16s   %s\n' "  allowed (200) % @32"               "$M_ALLOWED"                "$(perrun "${R_ALLOWED[@]}")"
  printf '%-40s %16s   %s\n' "  p99 ms @32"                        "$M_CHECK32_P99"            "$(perrun "${R_CHECK32_P99[@]}")"
  printf '%-40s %16s   %s\n' "redis+lua ops/s @32"                 "$(fmt_int "$M_REDIS32")"   "$(perrun "${R_REDIS32[@]}")"
  printf '%-40s %16s   %s\n' "  redis p99 ms @32"                  "$M_REDIS32_P99"            "$(perrun "${R_REDIS32_P99[@]}")"
  printf '%-40s %16s   %s\n' "ratio ringlimit/redis @32"           "$M_RATIO"                  "$(perrun "${R_RATIO[@]}")"
  printf '%-40s %16s   %s\n' "ringlimit check/s @8"                "$(fmt_int "$M_CHECK8")"    "$(perrun "${R_CHECK8[@]}")"
  printf '%-40s %16s   %s\n' "ringlimit p50 ms @8"                 "$M_P50_8"                  "$(perrun "${R_P50_8[@]}")"
  printf '%-40s %16s   %s\n' "ringlimit p99 ms @8"                 "$M_P99_8"                  "$(perrun "${R_P99_8[@]}")"
  printf '%-40s %16s   %s\n' "redis+lua ops/s @8"                  "$(fmt_int "$M_REDIS8")"    "$(perrun "${R_REDIS8[@]}")"
  printf '%-40s %16s   %s\n' "redis p50 ms @8"                     "$M_REDIS8_P50"             "$(perrun "${R_REDIS8_P50[@]}")"
  printf '%-40s %16s   %s\n' "redis p99 ms @8"                     "$M_REDIS8_P99"             "$(perrun "${R_REDIS8_P99[@]}")"
  printf '%-40s %16s   %s\n' "ringlimit batch checks/s @8 (x1000)" "$(fmt_int "$M_BATCH8")"    "$(perrun "${R_BATCH8[@]}")"
  printf '%-40s %16s   %s\n' "ringlimit batch checks/s @32 (x1000)" "$(fmt_int "$M_BATCH32")"  "$(perrun "${R_BATCH32[@]}")"
  echo
  echo "targets: ratio >= $TARGET_RATIO | p99 < $TARGET_P99_MS ms @8 | batch > $(fmt_int $TARGET_BATCH) checks/s"
  printf '  %-36s %-12s %s\n' "ratio ringlimit/redis @32 >= $TARGET_RATIO" "$M_RATIO" "$(pf "$M_RATIO" '>=' "$TARGET_RATIO")"
  printf '  %-36s %-12s %s\n' "ringlimit p99 @8 < $TARGET_P99_MS ms" "$M_P99_8" "$(pf "$M_P99_8" '<' "$TARGET_P99_MS")"
  printf '  %-36s %-12s %s\n' "batch checks/s > $(fmt_int $TARGET_BATCH)" "$(fmt_int "$M_BATCH")" "$(pf "$M_BATCH" '>' "$TARGET_BATCH")"
  echo
  echo "raw outputs: $OUT_DIR"
} | tee "$OUT_DIR/summary.txt"

# machine-readable, one line per round
{
  printf 'run\tcheck32\tallowed_pct\tcheck32_p99_ms\tcheck8\tp50_8_ms\tp99_8_ms\tbatch8\tbatch32\tredis32\tredis32_p99_ms\tredis8\tredis8_p50_ms\tredis8_p99_ms\tratio\tcpu_busy_before_pct\tforeign_cpu_max_pct\n'
  for i in "${!R_CHECK32[@]}"; do
    printf '%s\t' "$((i + 1))" "${R_CHECK32[$i]}" "${R_ALLOWED[$i]}" "${R_CHECK32_P99[$i]}" "${R_CHECK8[$i]}" \
      "${R_P50_8[$i]}" "${R_P99_8[$i]}" "${R_BATCH8[$i]}" "${R_BATCH32[$i]}" "${R_REDIS32[$i]}" \
      "${R_REDIS32_P99[$i]}" "${R_REDIS8[$i]}" "${R_REDIS8_P50[$i]}" "${R_REDIS8_P99[$i]}"
    printf '%s\t%s\t%s\n' "${R_RATIO[$i]}" "${R_BUSY[$i]}" "${R_FOREIGN[$i]}"
  done
} >"$OUT_DIR/summary.tsv"
