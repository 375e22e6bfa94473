#!/usr/bin/env bash
# What gossip and global counts cost as the cluster grows: SIZES clusters of node processes on
# 127.0.0.1, each node seeded with n0, one tokio worker and one HTTP thread per node:
#
#   bench/scale.sh
#   SIZES="3 9" WINDOW=5 HOT_KEYS=1000 SKIP_BUILD=1 bench/scale.sh
#   BIN=/tmp/ringlimit SIZES=25 bench/scale.sh
#
# Per size, three phases, each measured over WINDOW s after SETTLE s:
#   idle       the cluster formed, no checks
#   hot-K      K keys of a `mode: global` rule (limit 1000000/min, never denied), each checked
#              about once a second in total: POST /v1/check/batch of up to 1000 checks, the keys
#              in one chunk per node, the chunks rotated over the nodes every second, so every
#              node checks (and publishes) every key within N seconds. The load
#              loop is a Python process of its own; its CPU is not counted. The counters of an
#              earlier phase are still published (a 1 min sliding window).
# and for each, over the nodes, median and max of:
#   peer_sent_B/s, peer_recv_B/s       rate of ringlimit_gossip_bytes_total{direction=...} in
#                                      GET /metrics (UDP payload on the peer port, MAC included)
#                                      plus ringlimit_global_{sent,received}_bytes_total (global
#                                      counts pushed over the peer link, TCP payload); gossip
#                                      alone is in results.jsonl (gossip_sent_Bps, gossip_recv_Bps)
#   cpu_%                              utime+stime of the node process (/proc/PID/stat) over the
#                                      window, in % of one core (2 cores shared by every node:
#                                      25 nodes can starve each other under load)
#   checks/s                           global-rule checks the nodes counted, summed (achieved)
#   udp_drops/s                        datagrams the kernel dropped at the nodes' peer ports (a
#                                      full receive buffer: /proc/net/udp), summed over the nodes
# Then membership changes, timed by polling every node's GET /v1/cluster every 50 ms (each wait
# at most WAIT_TIMEOUT s; "-" when it ran out); `when` is idle (after the idle phase, node nN)
# and after-hot (once the last hot phase's load has stopped, its counters still published;
# node nN+1):
#   join_s             one more node started (seeded with n0) until every node, itself included,
#                      lists it `alive`
#   kill_detected_s    that node SIGKILLed until no other node lists it `alive` (dead or absent)
#   leave_s            after-hot only: the last original node SIGTERMed (graceful leave) until no
#                      other node lists it `alive` (`leaving` or gone; the raw JSON also has the
#                      time until it is dead or absent everywhere, and each node's own times)
# and per size false_deaths: how often a node logged "member declared dead" for a member that
# was never stopped (n0 .. n(N-2)), summed over every node's log.
# Raw figures, per node, as JSON lines in OUT_DIR/results.jsonl; the tables in
# OUT_DIR/summary.txt, node logs in OUT_DIR/logs.
#
# Env: SIZES (default "3 9 25"), WINDOW (s, default 10), SETTLE (s, default 5), HOT_KEYS
# (default "1000 10000"), BASE_PORT (default 30000, bench/lib.sh: node i has HTTP BASE_PORT+2i
# and peer BASE_PORT+2i+1, or the next free pair above when another program holds one of them),
# WAIT_TIMEOUT (s, default 60), LEAVE=0 (skip the graceful leave), CONVERGE_IDLE=0 (skip the
# idle join and kill), OUT_DIR (default bench/out/scale-<timestamp>), BIN (default
# $CARGO_TARGET_DIR/release/ringlimit, built first unless BIN is given or SKIP_BUILD=1),
# CARGO_TARGET_DIR. The load on the machine (other benchmarks) shows in every figure.
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
export SIZES="${SIZES:-3 9 25}" WINDOW="${WINDOW:-10}" SETTLE="${SETTLE:-5}"
export HOT_KEYS="${HOT_KEYS:-1000 10000}" BASE="$BASE_PORT" WAIT_TIMEOUT="${WAIT_TIMEOUT:-60}"
build_node
BIN="$(realpath "$BIN")"
OUT_DIR="$(realpath "$OUT_DIR")"
export BIN OUT_DIR

# The helper stops its nodes and load loop however it ends, given the time (STOP_WAIT: up to
# 15 s after the TERM of the exit trap); this is for when it cannot (killed): every process it
# started is listed in OUT_DIR/pids, and each of them has OUT_DIR on its command line (the
# nodes' --config, the load loop's argument), which guards against reused ids.
STOP_WAIT=15
# shellcheck disable=SC2317 # run by the exit trap
kill_listed() {
  [ -f "$OUT_DIR/pids" ] || return 0
  local pid
  while read -r pid; do
    if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$OUT_DIR"; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done <"$OUT_DIR/pids"
}
at_exit kill_listed

rc=0
job python3 "$BENCH_DIR/scale.py" run || rc=$?
if [ "$rc" = 0 ]; then log "done: $OUT_DIR"; else log "failed ($rc): $OUT_DIR"; fi
exit "$rc"
