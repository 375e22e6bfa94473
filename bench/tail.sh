#!/usr/bin/env bash
# p99 of POST /v1/check at half of capacity, open loop, when the node's HTTP threads lose the CPU:
#
#   bench/tail.sh                                   # this checkout's release build, 10 s per condition
#   BINS="/tmp/rl-a /tmp/rl-b" RUNS=3 bench/tail.sh # A/B, medians of 3 rounds
#   RATE=20000 DURATION=3 bench/tail.sh             # a fixed rate instead of capacity/2
#
# Starts one node on 127.0.0.1 per binary, measures its capacity closed loop (wrk -t2 -c8 -d5s,
# bench/wrk/check.lua; requests/s), then sends RATE = capacity/2 checks/s with openloop
# (bench/openloop: every request has a fixed send time, latency counts from that time, so a
# stalled HTTP thread shows in the tail instead of slowing the load down) in three conditions:
#   alone       nothing else running
#   neighbour   two CPU-bound busy loops at normal priority on the same (all) cores during the run
#               (stress-ng --cpu 2, or two `sh` loops without it)
#   podneighbour  the same busy loops in a cgroup of their own and the node in another of equal
#               weight, as two pods sharing the cores (the case above is a neighbour inside the
#               node's own container)
#   quota       the node (every thread) in a cgroup with 1 CPU of quota per 100 ms period
#               (cgroup v1 cpu.cfs_quota_us, or v2 cpu.max); openloop stays outside. Skipped, with
#               a message, when cgroups are not writable.
# openloop runs WARMUP s unrecorded, then DURATION s; its JSON per run is saved in OUT_DIR (and
# the quota cgroup's cpu.stat, throttling counts, beside it).
# The table gives medians over RUNS rounds (each round runs the three conditions in turn).
#
# Env: BIN (default this checkout's release build, built first unless SKIP_BUILD=1), BINS
# (space-separated, default $BIN), OPENLOOP (default $CARGO_TARGET_DIR/release/openloop, built
# the same way), THREADS_LIST: --http-threads values to compare, each a node of its own (default
# HTTP_THREADS; "2 0" compares per-core runtimes with the work-stealing runtime).
# DURATION (default 10), WARMUP (default 2), CONNS (default 8), HTTP_THREADS (default 2),
# RUNS (default 1), RATE (default capacity/2 of each binary), BASE_PORT, OUT_DIR (default
# bench/out/tail-<timestamp>), CARGO_TARGET_DIR (bench/lib.sh).
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION="${DURATION:-10}"
WARMUP="${WARMUP:-2}"
CONNS="${CONNS:-8}"
HTTP_THREADS="${HTTP_THREADS:-2}"
THREADS_LIST="${THREADS_LIST:-$HTTP_THREADS}"
RUNS="${RUNS:-1}"
CG_NAME=ringlimit-tail
PORT=$(http_port 0)
need wrk
build_node
build_openloop

NODE=""   # the node's PID
BUSY=()   # the neighbour's PIDs
CG=""     # the quota cgroup's directory, once created
CG_HOME="" # the node's cgroup before the move (cgroup.procs of it)

stop_busy() {
  local p c
  for p in "${BUSY[@]:-}"; do
    [ -n "$p" ] || continue
    c=$(pgrep -P "$p" || true) # stress-ng's workers
    stop_pids "$p"
    # shellcheck disable=SC2086
    [ -z "$c" ] || kill -9 $c 2>/dev/null || true
  done
  BUSY=()
}

# Moves the node back to its own cgroup and removes the quota cgroup.
cgroup_remove() {
  [ -n "$CG" ] || return 0
  if [ -d "$CG" ]; then
    local p
    while read -r p; do
      echo "$p" >"$CG_HOME/cgroup.procs" 2>/dev/null || true
    done <"$CG/cgroup.procs"
    rmdir "$CG" 2>/dev/null || log "could not remove $CG"
  fi
  CG=""
}

stop_node() {
  cgroup_remove
  stop_nodes
  NODE=""
}

# The node is stopped by bench/lib.sh's exit trap (after any job), then these.
at_exit stop_busy
at_exit cgroup_remove
at_exit 'rmdir /sys/fs/cgroup/ringlimit-tail-neighbour /sys/fs/cgroup/cpu/ringlimit-tail-neighbour 2>/dev/null'

start_node() { # BIN LABEL
  NODE_BIN=$1 start_nodes 1 "$2" --http-threads "$HTTP_THREADS" --max-keys 1000000
  NODE=${PIDS[0]}
}

# Runs a command in the background (bench/lib.sh's job: a signal reaches the trap at once).
run_job() { # OUT_FILE ERR_FILE CMD...
  local out=$1 err=$2
  shift 2
  job "$@" >"$out" 2>"$err"
}

capacity() { # LABEL; sets CAP (requests/s)
  local out="$OUT_DIR/capacity-$1.txt"
  run_job "$out" "${out%.txt}.err" timeout --kill-after=5 35 wrk -t2 -c8 -d5s -s "$BENCH_DIR/wrk/check.lua" \
    "http://127.0.0.1:$PORT" || { log "wrk failed"; cat "$out" "${out%.txt}.err" >&2; exit 1; }
  CAP=$(awk '/^Requests\/sec/ {printf "%d", $2}' "$out")
  [ -n "$CAP" ] || { log "no Requests/sec in $out"; exit 1; }
}

node_ticks() { pid_ticks "$NODE"; }

openloop() { # RATE OUT_JSON
  local t0 s0=$SECONDS
  t0=$(node_ticks)
  run_job "$2" "${2%.json}.err" timeout --kill-after=5 $((WARMUP + DURATION + 30)) "$OPENLOOP" \
    --url "http://127.0.0.1:$PORT/v1/check" --rate "$1" --duration "$DURATION" --warmup "$WARMUP" \
    --connections "$CONNS" --keyspace 100000 --json \
    --body-template '{"key":"user:{n}","limit":100,"period_ms":1000,"algorithm":"token_bucket","cost":1}' \
    || { log "openloop failed"; cat "$2" "${2%.json}.err" >&2; exit 1; }
  [ ! -s "${2%.json}.err" ] || log "  openloop: $(sort -u "${2%.json}.err" | sed 's/^openloop: connection [0-9]*: //' | sort -u | tr '\n' ' ')"
  log "  node CPU: $(awk -v t=$(($(node_ticks) - t0)) -v s=$((SECONDS - s0)) 'BEGIN {printf "%.2f", t / 100 / s}') cores (warmup included)"
}

start_busy() { # [CGROUP_DIR: run the busy loops in it]
  local secs=$((WARMUP + DURATION + 10)) into="${1:-}"
  if command -v stress-ng >/dev/null; then
    # shellcheck disable=SC2016 # $$ is the inner shell's
    sh -c '[ -z "$1" ] || echo $$ >"$1/cgroup.procs"; exec stress-ng --cpu 2 --timeout "$2" --quiet' \
      sh "$into" "${secs}s" >/dev/null 2>&1 &
    BUSY+=($!)
  else
    timeout "$secs" sh -c 'while :; do :; done' &
    BUSY+=($!)
    timeout "$secs" sh -c 'while :; do :; done' &
    BUSY+=($!)
  fi
  sleep 0.5 # let them reach the CPUs
}

# A cgroup of its own for the busy loops, beside the node's (another pod on the same cores);
# empty output when not possible.
neighbour_cgroup() {
  local d
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then d=/sys/fs/cgroup/ringlimit-tail-neighbour
  elif [ -d /sys/fs/cgroup/cpu ]; then d=/sys/fs/cgroup/cpu/ringlimit-tail-neighbour
  else return 0; fi
  mkdir -p "$d" 2>/dev/null && echo "$d"
}

# Puts the node (every thread) into a new cgroup: of 1 CPU of quota (`cgroup_enter quota`), or
# of default weight and no quota (`cgroup_enter pod`: a pod of its own). Fails (status 1) when
# not possible.
cgroup_enter() {
  local pid=$NODE tid kind="${1:-quota}"
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then # v2
    CG_HOME="/sys/fs/cgroup$(awk -F: '$1 == "0" {print $3}' "/proc/$pid/cgroup")"
    grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null ||
      echo +cpu >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || return 1
    mkdir -p "/sys/fs/cgroup/$CG_NAME" 2>/dev/null || return 1
    CG="/sys/fs/cgroup/$CG_NAME"
    [ "$kind" != quota ] || echo "100000 100000" >"$CG/cpu.max" 2>/dev/null || return 1
    echo "$pid" >"$CG/cgroup.procs" 2>/dev/null || return 1
  elif [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then # v1
    CG_HOME="/sys/fs/cgroup/cpu$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3}' "/proc/$pid/cgroup")"
    mkdir -p "/sys/fs/cgroup/cpu/$CG_NAME" 2>/dev/null || return 1
    CG="/sys/fs/cgroup/cpu/$CG_NAME"
    if [ "$kind" = quota ]; then
      echo 100000 >"$CG/cpu.cfs_period_us" 2>/dev/null || return 1
      echo 100000 >"$CG/cpu.cfs_quota_us" 2>/dev/null || return 1
    fi
    echo "$pid" >"$CG/cgroup.procs" 2>/dev/null || {
      for tid in /proc/"$pid"/task/*; do echo "${tid##*/}" >"$CG/tasks" 2>/dev/null || return 1; done
    }
  else
    return 1
  fi
  # Every thread must be in: compare the node's threads with the cgroup's.
  for tid in /proc/"$pid"/task/*; do
    grep -qx "${tid##*/}" "$CG/$([ -f "$CG/tasks" ] && echo tasks || echo cgroup.threads)" || return 1
  done
}

: >"$OUT_DIR/results.tsv"
bi=0
for bin in $BINS; do
 for HTTP_THREADS in $THREADS_LIST; do
  bi=$((bi + 1))
  label="$bi-$(basename "$bin")-t$HTTP_THREADS"
  log "$bin: starting the node ($HTTP_THREADS HTTP threads)"
  start_node "$bin" "$label"
  capacity "$label"
  rate="${RATE:-$((CAP / 2))}"
  log "$bin: capacity $CAP checks/s closed loop (wrk -c8); open loop at $rate/s, $CONNS connections"
  for ((run = 1; run <= RUNS; run++)); do
    log "round $run: alone"
    openloop "$rate" "$OUT_DIR/$label-alone-$run.json"
    echo "$label alone $run $OUT_DIR/$label-alone-$run.json" >>"$OUT_DIR/results.tsv"

    log "round $run: neighbour (2 busy loops)"
    start_busy
    openloop "$rate" "$OUT_DIR/$label-neighbour-$run.json"
    stop_busy
    echo "$label neighbour $run $OUT_DIR/$label-neighbour-$run.json" >>"$OUT_DIR/results.tsv"

    NB="$(neighbour_cgroup)"
    if [ -n "$NB" ] && cgroup_enter pod; then
      log "round $run: pod neighbour (node and busy loops in sibling cgroups of equal weight)"
      start_busy "$NB"
      openloop "$rate" "$OUT_DIR/$label-podneighbour-$run.json"
      stop_busy
      echo "$label podneighbour $run $OUT_DIR/$label-podneighbour-$run.json" >>"$OUT_DIR/results.tsv"
    else
      log "round $run: pod neighbour case skipped: cgroups not writable"
    fi
    cgroup_remove
    [ -z "$NB" ] || rmdir "$NB" 2>/dev/null || true

    if cgroup_enter quota; then
      log "round $run: quota (node in $CG, 1 CPU)"
      openloop "$rate" "$OUT_DIR/$label-quota-$run.json"
      cp "$CG/cpu.stat" "$OUT_DIR/$label-quota-$run.cpu.stat" 2>/dev/null || true
      log "round $run: quota: $(grep -h throttled "$CG/cpu.stat" 2>/dev/null | tr '\n' ' ')"
      echo "$label quota $run $OUT_DIR/$label-quota-$run.json" >>"$OUT_DIR/results.tsv"
    else
      log "round $run: quota case skipped: cgroups not writable (or a thread did not move)"
    fi
    cgroup_remove
  done
  stop_node
  sleep 0.5 # the port is free again
 done
done

python3 - "$OUT_DIR/results.tsv" <<'PY' | tee "$OUT_DIR/table.txt"
import json, statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
groups = {}
for label, cond, _run, path in rows:
    groups.setdefault((label, cond), []).append(json.load(open(path)))
cols = [("rate", "rate", "{:.0f}"), ("achieved", "achieved", "{:.0f}"), ("p50", "p50_ms", "{:.3f}"),
        ("p90", "p90_ms", "{:.3f}"), ("p99", "p99_ms", "{:.3f}"), ("p99.9", "p999_ms", "{:.3f}"),
        ("max", "max_ms", "{:.3f}"), ("errors", "errors", "{:.0f}")]
print(f"{'binary':24}{'condition':11}" + "".join(f"{h:>10}" for h, _, _ in cols) + "   (ms; medians)")
for (label, cond), runs in groups.items():
    vals = [fmt.format(statistics.median(r[k] for r in runs)) for _, k, fmt in cols]
    print(f"{label:24}{cond:11}" + "".join(f"{v:>10}" for v in vals))
for (label, cond), runs in groups.items():
    if len(runs) > 1:
        print(f"{label} {cond} p99 per round:", " ".join(f"{r['p99_ms']:.3f}" for r in runs))
PY
log "raw results in $OUT_DIR"
