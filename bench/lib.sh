# shellcheck shell=bash
# What every bench script stands on: the node binary (one build, one default path), the tools it
# installs, its ports, its nodes started and waited for, and every process it started stopped
# when it exits, Ctrl-C included. Source it right after `set -euo pipefail`:
#
#   # shellcheck source=bench/lib.sh
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# It sets BENCH_DIR, REPO, SCRIPT (the caller's file name, for log lines), CARGO_TARGET_DIR
# (default <repo>/target), OUT_DIR (default bench/out/<script>-<timestamp>, created), BASE_PORT
# (below) and RINGLIMIT_CLUSTER_SECRET, and installs the exit trap. Nothing is built or started
# until the script asks.

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$BENCH_DIR/.." && pwd)"
SCRIPT="$(basename "$0")"

log() { printf '[%s %s] %s\n' "$SCRIPT" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
# Nodes form clusters only with a secret; the benchmarks run the secure path
# (RINGLIMIT_CLUSTER_SECRET= with RINGLIMIT_ALLOW_UNAUTHENTICATED_PEERS=true runs without it).
export RINGLIMIT_CLUSTER_SECRET="${RINGLIMIT_CLUSTER_SECRET-ringlimit-bench-$$-$RANDOM}"
OUT_DIR="${OUT_DIR:-$BENCH_DIR/out/${SCRIPT%.sh}-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT_DIR"

# ---------------------------------------------------------------- ports
# A script's ports: node i listens on BASE_PORT+i (HTTP) and BASE_PORT+50+i (peer), its other
# servers on BASE_PORT+90+k (aux_port k: gRPC 0, Redis 1, nginx 2). Each script has a block of
# 100 of its own, so that any two can run at once, and every block lies below Linux's ephemeral
# range (32768-60999, /proc/sys/net/ipv4/ip_local_port_range): there, the client side of a
# connection (a load's, or another program's; TIME-WAIT included) can hold a node's port when
# the next run binds it (bench/slowconns.sh opens tens of thousands). BASE_PORT=N overrides it,
# e.g. for two runs of one script at once.
#
#   script             BASE_PORT
#   http.sh            28000
#   memory.sh          28100
#   bucket_bytes.sh    28200
#   cpu.sh             28300
#   tail.sh            28400
#   rls_bound.sh       28500
#   rlqs.sh            28600
#   soak.sh            28700      (bench/soak.py: the same layout)
#   cluster.sh         29100
#   sdk.sh             29200
#   global.sh          29300
#   all.sh             29500
#   contention.sh      29600
#   grpc.sh            29700
#   slowconns.sh       29800
#   keyflood.sh        29900
#   scale.sh           30000      (bench/scale.py: a pair a node, up to 31999 when some are held)
#   hot_key.sh         29400
#   sdk_hot.sh         29450
#   reserve.sh         28800
#   tls.sh             28900
#   skew.sh            29000
#   replica_cost.sh    27900
#   frame_floor.sh     27800
#   blocks.sh          27700
#   sdk_langs.sh       27600
#   persist_cost.sh    27500
#   faults.sh          -          (every node in a network namespace of its own)
#   accuracy.sh        -          (the same)
#   regions.sh         -          (every region in a network namespace of its own)
default_base_port() {
  case $SCRIPT in
    http.sh) echo 28000 ;;
    memory.sh) echo 28100 ;;
    bucket_bytes.sh) echo 28200 ;;
    cpu.sh) echo 28300 ;;
    tail.sh) echo 28400 ;;
    rls_bound.sh) echo 28500 ;;
    rlqs.sh) echo 28600 ;;
    soak.sh) echo 28700 ;;
    cluster.sh) echo 29100 ;;
    sdk.sh) echo 29200 ;;
    sdk_langs.sh) echo 27600 ;;
    global.sh) echo 29300 ;;
    all.sh) echo 29500 ;;
    contention.sh) echo 29600 ;;
    grpc.sh) echo 29700 ;;
    slowconns.sh) echo 29800 ;;
    keyflood.sh) echo 29900 ;;
    scale.sh) echo 30000 ;;
    hot_key.sh) echo 29400 ;;
    sdk_hot.sh) echo 29450 ;;
    reserve.sh) echo 28800 ;;
    tls.sh) echo 28900 ;;
    skew.sh) echo 29000 ;;
    replica_cost.sh) echo 27900 ;;
    frame_floor.sh) echo 27800 ;;
    blocks.sh) echo 27700 ;;
    persist_cost.sh) echo 27500 ;;
    faults.sh | accuracy.sh | regions.sh) ;;
    *) die "$SCRIPT has no BASE_PORT in bench/lib.sh's table" ;;
  esac
}
BASE_PORT="${BASE_PORT:-$(default_base_port)}"

http_port() { echo $((BASE_PORT + $1)); }
peer_port() { echo $((BASE_PORT + 50 + $1)); }
aux_port() { echo $((BASE_PORT + 90 + $1)); }

# No listener and no UDP socket on the port. A TIME-WAIT left by our own earlier run does not
# stop a node's bind (SO_REUSEADDR), and below the ephemeral range no client takes the port.
port_free() {
  if command -v ss >/dev/null; then
    [ -z "$(ss -Hltn "( sport = :$1 )" 2>/dev/null)" ] && [ -z "$(ss -Huan "( sport = :$1 )" 2>/dev/null)" ]
  else
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
  fi
}
ports_free() { # PORT...: dies naming the first one in use
  local p
  for p in "$@"; do
    port_free "$p" || die "port $p is in use (another run of $SCRIPT? set BASE_PORT)"
  done
}

# ---------------------------------------------------------------- tools and builds
# need CMD[=PACKAGE]...: installs the Debian package of each command missing (apt-get, as root
# or through sudo; `apt-get update` only then).
need() {
  local c pkgs=() sudo=()
  for c in "$@"; do command -v "${c%%=*}" >/dev/null 2>&1 || pkgs+=("${c#*=}"); done
  ((${#pkgs[@]})) || return 0
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "missing ${pkgs[*]} and not root (no sudo)"
    sudo=(sudo)
  fi
  log "installing ${pkgs[*]}"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
}

# cargo_release ARGS...: `cargo build --release ARGS` in this checkout, unless SKIP_BUILD=1.
cargo_release() {
  [ "${SKIP_BUILD:-0}" != 1 ] || return 0
  log "building $* (release)"
  cargo build --release -q --manifest-path "$REPO/Cargo.toml" "$@"
}

# Sets BIN, the node binary the script runs, and BINS, the binaries a comparing script runs in
# turn (default: BIN). BIN=path or BINS="a b" runs those (e.g. an older build, for a
# before/after) and builds nothing; otherwise this checkout's release build,
# $CARGO_TARGET_DIR/release/ringlimit, built first unless SKIP_BUILD=1.
build_node() {
  if [ -z "${BIN:-}" ] && [ -z "${BINS:-}" ]; then
    cargo_release -p ringlimit-node --bin ringlimit
  fi
  BINS="${BINS:-${BIN:-$CARGO_TARGET_DIR/release/ringlimit}}"
  BIN="${BIN:-${BINS%% *}}"
  local b
  for b in $BIN $BINS; do [ -x "$b" ] || die "no node binary at $b (build it, or set BIN)"; done
}

# Sets OPENLOOP, bench/openloop's binary (an open-loop HTTP load: latency from each request's
# scheduled time); OPENLOOP=path runs that, otherwise it is built as build_node builds.
build_openloop() {
  if [ -z "${OPENLOOP:-}" ]; then
    cargo_release -p ringlimit-openloop
    OPENLOOP="$CARGO_TARGET_DIR/release/openloop"
  fi
  [ -x "$OPENLOOP" ] || die "no openloop binary at $OPENLOOP (build it, or set OPENLOOP)"
}

# ---------------------------------------------------------------- processes and cleanup
PIDS=()    # the servers started (start_nodes, start_server): stopped by stop_nodes and on exit
HELPERS=() # other background processes of the script (samplers, floods): stopped on exit
JOB=""     # the process `job` waits for
AT_EXIT=() # the script's own cleanup commands (at_exit), run after the processes are stopped

# TERM, then KILL after STOP_WAIT s (default 5); returns once each is reaped.
stop_pids() { # PID...
  local p i
  for p in "$@"; do [ -z "$p" ] || kill -TERM "$p" 2>/dev/null || true; done
  for p in "$@"; do
    [ -n "$p" ] || continue
    for ((i = 0; i < ${STOP_WAIT:-5} * 10; i++)); do
      # gone, or a zombie: exited, not yet reaped
      [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null || echo Z)" != Z ] || break
      sleep 0.1
    done
    if kill -0 "$p" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ]; then
      log "pid $p did not stop on SIGTERM: killing it"
      kill -KILL "$p" 2>/dev/null || true
    fi
    wait "$p" 2>/dev/null || true
  done
}

at_exit() { AT_EXIT+=("$1"); } # CMD: eval'ed on exit

cleanup() {
  local rc=$? c
  trap - EXIT INT TERM
  stop_pids "$JOB" "${HELPERS[@]}" "${PIDS[@]}"
  for c in "${AT_EXIT[@]}"; do eval "$c" || true; done
  exit "$rc"
}
trap cleanup EXIT
# A trap that returned would let the script go on: exit, and the EXIT trap cleans up.
trap 'exit 130' INT
trap 'exit 143' TERM

# job CMD...: runs CMD in the background and waits for it, so that a signal reaches the trap at
# once (background processes of a script ignore Ctrl-C: the trap stops this one); CMD's status.
job() {
  local rc=0
  "$@" &
  JOB=$!
  wait "$JOB" || rc=$?
  JOB=""
  return "$rc"
}

# utime+stime of a process so far, in clock ticks (CLK_TCK, 100/s here); 0 once it is gone.
pid_ticks() { # PID
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
  st=${st##*) } # fields from 3 on: utime (14) is the 12th, stime (15) the 13th
  # shellcheck disable=SC2086
  set -- $st
  echo $((${12} + ${13}))
}

# utime+stime in ticks of the servers this script started (PIDS), summed.
nodes_cpu() {
  local sum=0 pid
  for pid in "${PIDS[@]}"; do sum=$((sum + $(pid_ticks "$pid"))); done
  echo "$sum"
}

# proc_kb FIELD [PID]: a /proc/PID/status figure in kB (VmRSS, VmHWM); PID defaults to node 0.
proc_kb() { awk -v f="$1" '$1 == f":" {print $2}' "/proc/${2:-${PIDS[0]}}/status"; }

# ---------------------------------------------------------------- nodes
# Where the processes run. PIN=1: the node alone on CPU 0, every load generator on CPU 1, a
# flood on idle CPU only (FLOOD_IDLE=1, SCHED_IDLE) — the attacker's CPU is not the node's, as
# from another machine; on 2 shared cores the flood's generator otherwise takes the node's CPU.
# NODE_WRAP, GEN_WRAP, FLOOD_WRAP: command prefixes for the nodes, the load generators, a flood.
if [ "${PIN:-0}" = 1 ]; then
  NODE_WRAP="taskset -c 0" GEN_WRAP="taskset -c 1" FLOOD_IDLE=1
fi
FLOOD_WRAP="${GEN_WRAP:-}"
if [ "${FLOOD_IDLE:-0}" = 1 ]; then FLOOD_WRAP="$FLOOD_WRAP chrt --idle 0"; fi

# wait_ready URL PID LOG WHAT: until URL answers 2xx, at most 20 s; dies with the end of LOG when
# the process exits first (its port taken, a bad flag) or the time runs out.
wait_ready() {
  local deadline=$((SECONDS + 20))
  until curl -sf --max-time 1 "$1" >/dev/null; do
    if ! kill -0 "$2" 2>/dev/null; then
      tail -20 "$3" >&2
      die "$4 exited at start (log: $3)"
    fi
    [ $SECONDS -lt $deadline ] || { tail -20 "$3" >&2; die "$4 not ready within 20 s (log: $3)"; }
    sleep 0.1
  done
}

# start_server LOG CMD...: a server of the script's own (Redis, nginx) in the background, in PIDS.
start_server() {
  local out=$1
  shift
  "$@" >"$out" 2>&1 &
  PIDS+=($!)
}

# start_nodes N LABEL [ringlimit serve flags...]: N nodes of $NODE_BIN (default $BIN), node i
# "bench-i" on http_port i and peer_port i, seeded with each other (a node alone: no seeds),
# stderr to $OUT_DIR/node-LABEL-i.log; returns once each answers /readyz and sees all N in its
# ring (bounded). NODE_ENV: NAME=VALUE words for their environment; NODE_WRAP: a command prefix.
start_nodes() {
  local n=$1 label=$2 seeds=() i
  shift 2
  need curl
  for ((i = 0; i < n; i++)); do
    ports_free "$(http_port "$i")" "$(peer_port "$i")"
    seeds+=("127.0.0.1:$(peer_port "$i")")
  done
  if ((n > 1)); then
    seeds=(--seeds "$(IFS=,; echo "${seeds[*]}")")
  else
    seeds=()
  fi
  for ((i = 0; i < n; i++)); do
    # shellcheck disable=SC2086 # a command prefix and a list of words, split on purpose
    ${NODE_WRAP:-} env ${NODE_ENV:-} RUST_LOG=warn "${NODE_BIN:-$BIN}" serve --node-id "bench-$i" \
      --http "127.0.0.1:$(http_port "$i")" --peer "127.0.0.1:$(peer_port "$i")" "${seeds[@]}" "$@" \
      2>"$OUT_DIR/node-$label-$i.log" &
    PIDS+=($!)
  done
  for ((i = 0; i < n; i++)); do
    wait_ready "http://127.0.0.1:$(http_port "$i")/readyz" "${PIDS[${#PIDS[@]} - n + i]}" \
      "$OUT_DIR/node-$label-$i.log" "node $i of $n ($label)"
  done
  local deadline=$((SECONDS + 20))
  for ((i = 0; i < n; i++)); do
    until curl -sf "http://127.0.0.1:$(http_port "$i")/v1/cluster" | grep -q "\"ring_members\":$n"; do
      [ $SECONDS -lt $deadline ] || die "cluster of $n did not form"
      sleep 0.1
    done
  done
}

# Stops every server the script started (PIDS).
stop_nodes() {
  stop_pids "${PIDS[@]}"
  PIDS=()
  sleep 0.5
}

# node_fill COUNT PREFIX CHECK_JSON_TAIL: COUNT checks of distinct keys PREFIX0 ..
# PREFIX(COUNT-1) through node 0's POST /v1/check/batch, 1000 a request; exits on any error.
node_fill() {
  python3 - "$(http_port 0)" "$1" "$2" "$3" <<'PY'
import http.client, sys
port, count, prefix, tail = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
for start in range(0, count, 1000):
    n = min(1000, count - start)
    items = ",".join('{"key":"%s%d",%s}' % (prefix, start + i, tail) for i in range(n))
    conn.request("POST", "/v1/check/batch", '{"checks":[%s]}' % items,
                 {"content-type": "application/json"})
    r = conn.getresponse()
    body = r.read()
    if r.status != 200 or b'"error"' in body:
        sys.exit("batch at %d: %d %s" % (start, r.status, body[:200]))
PY
}

# ---------------------------------------------------------------- network namespaces
# netns_up NS NET HOST...: a namespace NS-HOST for each HOST, each with eth0 on a veth pair into
# a bridge in NS-sw; host nI gets NET.1I, c (the client) NET.100. Loopback up in each. Nothing
# is routed out of them. Needs root; netns_down NS HOST... removes them (and their veths).
netns_addr() { case $2 in c) echo "$1.100" ;; *) echo "$1.1${2#n}" ;; esac; }
netns_up() {
  local ns=$1 net=$2 h
  shift 2
  ip netns add "$ns-sw"
  ip -n "$ns-sw" link add br0 type bridge
  ip -n "$ns-sw" link set br0 up
  for h in "$@"; do
    ip netns add "$ns-$h"
    ip link add eth0 netns "$ns-$h" type veth peer name "$h" netns "$ns-sw"
    ip -n "$ns-$h" addr add "$(netns_addr "$net" "$h")/24" dev eth0
    ip -n "$ns-$h" link set eth0 up
    ip -n "$ns-$h" link set lo up
    ip -n "$ns-sw" link set "$h" master br0
    ip -n "$ns-sw" link set "$h" up
  done
}
netns_down() {
  local ns=$1 h
  shift
  for h in "$@" sw; do ip netns del "$ns-$h" 2>/dev/null || true; done
}

# ---------------------------------------------------------------- loads and figures
to_ms() { # wrk prints 80.00us / 1.20ms / 1.01s / 2.00m
  awk -v v="$1" 'BEGIN {
    if (v ~ /us$/) { sub(/us$/, "", v); printf "%.3f", v / 1000 }
    else if (v ~ /ms$/) { sub(/ms$/, "", v); printf "%.3f", v }
    else if (v ~ /m$/) { sub(/m$/, "", v); printf "%.3f", v * 60000 }
    else if (v ~ /s$/) { sub(/s$/, "", v); printf "%.3f", v * 1000 }
    else printf "nan" }'
}

# wrk -t2 -c$CONNS for $DURATION s against node 0 with a script of bench/wrk; the raw output goes
# to $OUT_DIR/LABEL.txt; prints "rps p50_ms p99_ms". The script reads its settings from the
# environment (KEYSPACE, RULE, ...). Callers run it in $(...): --foreground keeps wrk in the
# terminal's process group, so that Ctrl-C reaches it.
wrk_load() { # LABEL SCRIPT
  local out="$OUT_DIR/$1.txt"
  # shellcheck disable=SC2086 # a command prefix, split on purpose
  timeout --foreground --kill-after=5 $((DURATION + 30)) ${GEN_WRAP:-} wrk -t2 -c"$CONNS" -d"${DURATION}s" \
    --latency -s "$BENCH_DIR/wrk/$2" "http://127.0.0.1:$(http_port 0)" >"$out" 2>&1
  local rps p50 p99
  rps=$(awk '/^Requests\/sec/ {print $2}' "$out")
  p50=$(awk '$1 == "50%" {print $2}' "$out")
  p99=$(awk '$1 == "99%" {print $2}' "$out")
  echo "$rps $(to_ms "$p50") $(to_ms "$p99")"
}

# wrk_script_errors FILE: answers other than 200/429 and batch items answered with an error, as
# bench/wrk's scripts count them (`other=`, `http_other=`, `error=` in their summary line).
wrk_script_errors() {
  grep -oE '(^| )(other|http_other|error)=[0-9]+' "$1" | awk -F= '{ s += $2 } END { print s + 0 }'
}

median() { sort -g | awk '{a[NR] = $1} END {if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
