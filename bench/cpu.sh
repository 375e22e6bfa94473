#!/usr/bin/env bash
# Server CPU time per answered check, by path, against an nginx floor:
#
#   bench/cpu.sh                                   # one round, 10 s per load, this checkout
#   DURATION=5 RUNS=3 BATCH_SIZES="10 100 1000" BINS="/tmp/a /tmp/b" bench/cpu.sh
#
# CPU time is steadier than throughput on a noisy 2-core machine: a load that is slowed down by
# other work still costs the server about the same CPU per check. Each load is a wrk run
# (after an unmeasured warm-up); the server's utime+stime (fields 14 and 15 of /proc/PID/stat,
# in CLK_TCK ticks, 10 ms here) is read right before and right after it. Paths:
#   nginx     Debian's nginx (installed if missing), 2 workers, answering POST /v1/check from
#             bench/wrk/check.lua with a fixed 200 JSON body of ringlimit's answer size
#             (`return 200`, no access log, keep-alive without a request cap): the cost of the
#             HTTP exchange alone on this machine. CPU = master + workers. Checks = wrk's requests.
#   check     ringlimit POST /v1/check, bench/wrk/check.lua (one random-key inline token-bucket
#             check a request)
#   batchN    ringlimit POST /v1/check/batch, bench/wrk/batch.lua with N checks a request
# For ringlimit the checks are counted by the node (every ringlimit_checks_total series of
# /metrics, read before and after the load), and compared with wrk's count (requests x N).
# Each binary of BINS is started fresh per round (a single node, no seeds), then stopped.
#
# Figures (stdout table, medians over RUNS rounds):
#   checks_per_s             checks answered / wrk's load time (nginx: requests/s)
#   server_cpu_us_per_check  server CPU time (user + system, all threads) / checks answered
#   ratio_to_nginx           server_cpu_us_per_check / nginx's CPU us per request: how many
#                            bare HTTP exchanges one check costs (the batch paths go below 1)
# OUT_DIR gets runs.tsv (one line per round and load, with the per-round ratio, wrk's own count,
# errors and the CPU share other processes took meanwhile), summary.txt, the raw wrk outputs,
# node and nginx logs and nginx.conf.
#
# Env:
#   BINS          ringlimit binaries to compare, space-separated (default: BIN, this checkout's
#                 release build, built first unless SKIP_BUILD=1; bench/lib.sh)
#   DURATION      seconds per measured load (default 10); WARMUP: unmeasured seconds before each
#                 load (default 2, 0 to skip)
#   RUNS          rounds of all loads; the table gives the median per (path, binary) (default 1)
#   ALTERNATE     1: the binaries run in reverse order in even rounds, so that a binary's place
#                 in a round (first after nginx, or last) weighs on each alike (default 0)
#   BATCH_SIZE    checks per batch request (default 100); BATCH_SIZES="10 100 1000" for several
#   WRK_THREADS   wrk threads (default 2); CONNS: wrk connections (default 8)
#   HTTP_THREADS  ringlimit --http-threads (default 2); MAX_KEYS: --max-keys (default 1000000)
#   KEYSPACE, CHECK_LIMIT, CHECK_PERIOD_MS   passed to the wrk scripts (default 100000, 100, 1000)
#   BASE_PORT     ringlimit's ports and nginx's (bench/lib.sh's table)
#   OUT_DIR       where raw outputs go (default bench/out/cpu-<timestamp>)
# Everything runs on 127.0.0.1.
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION="${DURATION:-10}"
WARMUP="${WARMUP:-2}"
RUNS="${RUNS:-1}"
BATCH_SIZES="${BATCH_SIZES:-${BATCH_SIZE:-100}}"
WRK_THREADS="${WRK_THREADS:-2}"
CONNS="${CONNS:-8}"
HTTP_THREADS="${HTTP_THREADS:-2}"
MAX_KEYS="${MAX_KEYS:-1000000}"
export KEYSPACE="${KEYSPACE:-100000}"
export CHECK_LIMIT="${CHECK_LIMIT:-100}"
export CHECK_PERIOD_MS="${CHECK_PERIOD_MS:-1000}"
PORT=$(http_port 0)
NGINX_PORT=$(aux_port 2)
NGINX=/usr/sbin/nginx
HZ="$(getconf CLK_TCK)"
# ringlimit's answer to an allowed check, for nginx to send back (same size)
NGINX_BODY='{"allowed":true,"limit":100,"remaining":99,"reset_at_ms":1795439344144,"retry_after_ms":0,"degraded":false}'

for v in DURATION RUNS WRK_THREADS CONNS; do
  [[ "${!v}" =~ ^[0-9]+$ && "${!v}" -gt 0 ]] || die "$v must be a positive integer"
done
[[ "$WARMUP" =~ ^[0-9]+$ ]] || die "WARMUP must be a whole number of seconds"
for b in $BATCH_SIZES; do [[ "$b" =~ ^[0-9]+$ && "$b" -gt 0 ]] || die "bad batch size: $b"; done
need wrk curl "$NGINX=nginx"
build_node

# ---------------------------------------------------------------- processes and cleanup
WORK="$(mktemp -d)"
chmod 755 "$WORK" # nginx workers run as www-data
RL_PID=""         # the ringlimit node
NGINX_PID=""      # the nginx master
NGINX_KIDS=""     # its workers (kept for the case the master dies first)
# shellcheck disable=SC2317 # run by the exit trap, once bench/lib.sh has stopped the servers
cpu_cleanup() {
  # shellcheck disable=SC2086 # NGINX_KIDS is a list of pids
  [[ -z "$NGINX_KIDS" ]] || stop_pids $NGINX_KIDS
  cp "$WORK"/nginx-error.log "$WORK"/nginx.conf "$OUT_DIR"/ 2>/dev/null || true
  rm -rf "$WORK"
}
at_exit cpu_cleanup

log "raw outputs in $OUT_DIR; $RUNS round(s) of ${DURATION}s loads (+${WARMUP}s warm-up), wrk -t$WRK_THREADS -c$CONNS"

# ---------------------------------------------------------------- measurement helpers
server_pids() { # the processes whose CPU counts for the running server
  if [[ -n "$NGINX_PID" ]]; then
    echo "$NGINX_PID"
    pgrep -P "$NGINX_PID" || true
  else
    echo "$RL_PID"
  fi
}
server_ticks() {
  local sum=0 p
  for p in $(server_pids); do sum=$((sum + $(pid_ticks "$p"))); done
  echo "$sum"
}
self_child_ticks() { # cutime+cstime of this shell: the reaped wrk runs (through timeout)
  local st
  st=$(cat "/proc/$$/stat"); st=${st##*) }
  # shellcheck disable=SC2086
  set -- $st
  echo $((${14} + ${15}))
}
sys_ticks() { awk 'NR == 1 { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat; }
metric_checks() { # every ringlimit_checks_total series of the node, summed
  curl -sf --max-time 5 "http://127.0.0.1:$PORT/metrics" |
    awk '/^ringlimit_checks_total[{ ]/ { s += $NF } END { printf "%.0f\n", s }'
}
nginx_accepts() { # connections nginx accepted so far (stub_status)
  curl -sf --max-time 5 "http://127.0.0.1:$NGINX_PORT/nginx_status" | awk 'NR == 3 { print $1 }'
}

# wrk in the background (bench/lib.sh's job: a signal interrupts `wait`), bounded by timeout.
run_wrk() { # SECONDS OUTFILE LUA PATH
  local rc=0
  job timeout --kill-after=5 $(($1 + 30)) wrk -t"$WRK_THREADS" -c"$CONNS" -d"$1s" \
    -s "$BENCH_DIR/wrk/$3" "http://127.0.0.1:$URL_PORT$4" >"$2" 2>&1 || rc=$?
  [[ $rc -eq 0 ]] || { cat "$2" >&2; die "wrk failed ($rc), output in $2"; }
}
wrk_secs() { # "N requests in 10.00s, ..." -> seconds
  awk '/ requests in / { v = $4; sub(/,$/, "", v)
    if (v ~ /ms$/) { sub(/ms$/, "", v); v /= 1000 } else if (v ~ /us$/) { sub(/us$/, "", v); v /= 1e6 }
    else if (v ~ /m$/) { sub(/m$/, "", v); v *= 60 } else sub(/s$/, "", v)
    print v }' "$1"
}

printf 'round\tpath\tbinary\tchecks\twrk_checks\twrk_secs\tchecks_per_s\tserver_ticks\tserver_cpu_us_per_check\tratio_to_nginx\terrors\tforeign_pct\n' >"$OUT_DIR/runs.tsv"
NGINX_US=""

# One measured load against the running server. KIND: nginx or ringlimit; BATCH: checks a request.
measure() { # ROUND PATH BINARY LUA URL_PATH BATCH KIND
  local round=$1 path=$2 bin=$3 lua=$4 upath=$5 batch=$6 kind=$7
  local tag="r$round-$path-$bin" out
  out="$OUT_DIR/wrk-$tag.txt"
  export BATCH_SIZE="$batch"
  if ((WARMUP > 0)); then
    log "  $path on $bin: warm-up ${WARMUP}s"
    run_wrk "$WARMUP" "$OUT_DIR/wrk-$tag-warmup.txt" "$lua" "$upath"
  fi
  log "  $path on $bin: measuring ${DURATION}s"
  local c0=0 c1=0 a0=0 a1=0 t0 t1 s0 s1 w0 w1
  if [[ $kind == ringlimit ]]; then c0=$(metric_checks); else a0=$(nginx_accepts); fi
  s0=$(sys_ticks); w0=$(self_child_ticks); t0=$(server_ticks)
  run_wrk "$DURATION" "$out" "$lua" "$upath"
  t1=$(server_ticks); w1=$(self_child_ticks); s1=$(sys_ticks)
  if [[ $kind == ringlimit ]]; then c1=$(metric_checks); else a1=$(nginx_accepts); fi

  local reqs secs checks wrk_checks non2xx sockerr other errors foreign
  reqs=$(awk '/ requests in / { print $1 }' "$out")
  secs=$(wrk_secs "$out")
  [[ -n "$reqs" && -n "$secs" ]] || { cat "$out" >&2; die "could not parse wrk output $out"; }
  wrk_checks=$((reqs * batch))
  non2xx=$(awk '/Non-2xx or 3xx responses:/ { print $NF }' "$out")
  sockerr=$(awk '/Socket errors:/ { s = 0; for (i = 3; i <= NF; i++) if ($i ~ /^[0-9]+,?$/) s += $i; print s }' "$out")
  # statuses other than 200/429 counted by the Lua scripts (a 429 is a denied check, an answer)
  # and batch items answered with an error (batch.lua: in the sampled responses)
  other=$(wrk_script_errors "$out")
  errors=$((${sockerr:-0} + other))
  if [[ $kind == nginx ]]; then
    checks=$reqs
    errors=$((errors + ${non2xx:-0}))
    # keep-alive check: wrk opens CONNS connections; more means nginx closed them
    echo "# nginx accepted $((a1 - a0)) connections during this load" >>"$out"
    if ((a1 - a0 > 2 * CONNS + 2)); then
      log "  WARNING: nginx accepted $((a1 - a0)) connections for $CONNS wrk connections: keep-alive broken?"
      errors=$((errors + a1 - a0))
    fi
  else
    checks=$((c1 - c0))
    # the node counts checks it decided, wrk the answers it read: they differ by what was in
    # flight when wrk stopped (at most CONNS requests) and by the /metrics reads themselves
    if ((checks > 0)) && awk -v a="$checks" -v b="$wrk_checks" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d > 0.02 * a) }'; then
      log "  WARNING: node counted $checks checks, wrk $wrk_checks (requests x $batch)"
    fi
  fi
  ((checks > 0)) || die "no checks answered in $path on $bin (see $out)"
  ((errors == 0)) || log "  WARNING: $errors errors / unexpected answers in $path on $bin (see $out)"
  foreign=$(awk -v a="$s0" -v b="$s1" -v t=$((t1 - t0)) -v w=$((w1 - w0)) 'BEGIN {
    split(a, x, " "); split(b, y, " "); busy = y[1] - x[1]; tot = y[2] - x[2]; f = busy - t - w
    if (f < 0) f = 0; printf "%.0f", (tot > 0 ? 100 * f / tot : 0) }')

  local line
  line=$(awk -v r="$round" -v p="$path" -v b="$bin" -v c="$checks" -v wc="$wrk_checks" -v s="$secs" \
    -v tk=$((t1 - t0)) -v hz="$HZ" -v ng="$NGINX_US" -v e="$errors" -v f="$foreign" 'BEGIN {
      us = tk * 1e6 / hz / c
      ratio = (ng != "" && ng > 0) ? sprintf("%.3f", us / ng) : "1.000"
      printf "%s\t%s\t%s\t%d\t%d\t%.2f\t%.0f\t%d\t%.3f\t%s\t%d\t%s\n", r, p, b, c, wc, s, c / s, tk, us, ratio, e, f }')
  printf '%s\n' "$line" >>"$OUT_DIR/runs.tsv"
  [[ $kind == nginx ]] && NGINX_US=$(cut -f9 <<<"$line")
  log "  $(awk -F'\t' '{ printf "%s on %s: %s checks, %s checks/s, %s server ticks, %s us/check, x%s nginx, %s%% foreign CPU", $2, $3, $4, $7, $8, $9, $10, $12 }' <<<"$line")"
  return 0
}

# ---------------------------------------------------------------- servers
cat >"$WORK/nginx.conf" <<EOF
worker_processes 2;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $WORK/body;
  proxy_temp_path $WORK/proxy;
  fastcgi_temp_path $WORK/fastcgi;
  uwsgi_temp_path $WORK/uwsgi;
  scgi_temp_path $WORK/scgi;
  client_body_buffer_size 16k;
  keepalive_timeout 65s;
  keepalive_requests 1000000000; # the default 1000 would reconnect every 1000 requests
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location = /v1/check { default_type application/json; return 200 '$NGINX_BODY'; }
    location = /nginx_status { stub_status; }
  }
}
EOF

start_nginx() {
  local i
  ports_free "$NGINX_PORT"
  "$NGINX" -p "$WORK" -c "$WORK/nginx.conf" -g 'daemon off;' 2>>"$WORK/nginx-error.log" &
  NGINX_PID=$!
  PIDS+=("$NGINX_PID")
  wait_ready "http://127.0.0.1:$NGINX_PORT/nginx_status" "$NGINX_PID" "$WORK/nginx-error.log" nginx
  for ((i = 0; i < 50; i++)); do
    NGINX_KIDS=$(pgrep -P "$NGINX_PID" | tr '\n' ' ' || true)
    [[ $(wc -w <<<"$NGINX_KIDS") -ge 2 ]] && break
    sleep 0.1
  done
  URL_PORT=$NGINX_PORT
}
stop_nginx() {
  local kids=$NGINX_KIDS
  stop_nodes
  # shellcheck disable=SC2086
  [[ -z "$kids" ]] || stop_pids $kids
  NGINX_PID="" NGINX_KIDS=""
}

start_node() { # BIN LABEL
  NODE_BIN=$1 start_nodes 1 "$2" --http-threads "$HTTP_THREADS" --max-keys "$MAX_KEYS"
  RL_PID=${PIDS[0]}
  URL_PORT=$PORT
}
stop_node() {
  stop_nodes
  RL_PID=""
}

# binary labels: base names, made unique
LABELS=()
declare -A SEEN=()
for b in $BINS; do
  l=$(basename "$b")
  [[ -z "${SEEN[$l]:-}" ]] || l="$l.${#LABELS[@]}"
  SEEN[$l]=1
  LABELS+=("$l")
done
read -r -a BIN_LIST <<<"$BINS"

# ---------------------------------------------------------------- rounds
for ((round = 1; round <= RUNS; round++)); do
  log "round $round/$RUNS: nginx floor"
  start_nginx
  measure "$round" nginx nginx check.lua /v1/check 1 nginx
  stop_nginx
  order=("${!BIN_LIST[@]}")
  if [ "${ALTERNATE:-0}" = 1 ] && ((round % 2 == 0)); then
    order=()
    for ((i = ${#BIN_LIST[@]} - 1; i >= 0; i--)); do order+=("$i"); done
  fi
  for i in "${order[@]}"; do
    bin=${BIN_LIST[$i]} label=${LABELS[$i]}
    log "round $round/$RUNS: ringlimit $bin"
    start_node "$bin" "$label"
    measure "$round" check "$label" check.lua /v1/check 1 ringlimit
    for b in $BATCH_SIZES; do
      measure "$round" "batch$b" "$label" batch.lua /v1/check/batch "$b" ringlimit
    done
    stop_node
  done
done

# ---------------------------------------------------------------- summary
# medians per (path, binary) over rounds; ratio = median us/check / median nginx us/request
awk -F'\t' '
  function median(s,   a, n, t, i, j) {
    n = split(s, a, " ")
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  NR > 1 {
    k = $2 SUBSEP $3
    if (!(k in rate)) order[++n] = k
    rate[k] = rate[k] " " $7; us[k] = us[k] " " $9
  }
  END {
    printf "%-12s %-16s %14s %24s %15s\n", "path", "binary", "checks_per_s", "server_cpu_us_per_check", "ratio_to_nginx"
    ng = median(us["nginx" SUBSEP "nginx"])
    for (i = 1; i <= n; i++) {
      split(order[i], kb, SUBSEP); u = median(us[order[i]])
      printf "%-12s %-16s %14.0f %24.3f %15.3f\n", kb[1], kb[2], median(rate[order[i]]), u, (ng > 0 ? u / ng : 0)
    }
  }' "$OUT_DIR/runs.tsv" | tee "$OUT_DIR/summary.txt"
log "done: $OUT_DIR"
