#!/usr/bin/env bash
# Network faults on a real 3-node cluster: each node in a network namespace of its own, joined by
# a bridge in another, and the load client in a fourth. Traffic never leaves those namespaces.
#
#   bench/faults.sh                         # every scenario, release build
#   SCENARIOS="split stall" bench/faults.sh
#   BIN=target/debug/ringlimit CHECK=1 bench/faults.sh   # what .ci/run does: fails on a failed check
#
# Scenarios (n2 is the victim each time; n0 and n1 keep a majority):
#   isolate     n2's link drops everything, clients included (they retry on another node)
#   split       2 | 1: n2 and its peers cannot reach each other; clients reach all three
#   oneway-out  n2's packets to its peers are dropped: it hears them, they do not hear it
#   oneway-in   its peers' packets to n2 are dropped: they hear it, it does not hear them
#   loss        10% of n2's packets dropped each way (iptables statistic; no tc netem here)
#   stall       n2 stopped (SIGSTOP) and resumed (SIGCONT)
# Each: load for WARM s, the fault for FAULT s, healed, load until the ring agrees again (at most
# HEAL s). The load: RATE checks/s over 300 keys at 10 per hour, each check sent to the next node
# in turn, retried on the next one after 250 ms without an answer. Reported per scenario: checks,
# failed checks (no node answered), slowest answer from the majority side and over all tries,
# over-admission against the limits, time until every node's ring agrees after the heal, and how
# long two nodes that each own keys disagreed on the ring. Needs root (ip netns, iptables).
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SCENARIOS="${SCENARIOS:-isolate split oneway-out oneway-in loss stall}"
NS="${NS_PREFIX:-rlf}"

[ "$(id -u)" = 0 ] || die "needs root (network namespaces, iptables)"
need iptables ip=iproute2
build_node
BIN="$(realpath "$BIN")"

HOSTS=(n0 n1 n2 c)
teardown() { netns_down "$NS" "${HOSTS[@]}"; }
at_exit teardown
teardown

log "namespaces: $NS-n0 $NS-n1 $NS-n2 (nodes), $NS-c (client), $NS-sw (bridge)"
netns_up "$NS" 10.77.0 "${HOSTS[@]}"

# The orchestrator runs in the client's namespace; it starts each node in its own. In the
# foreground: Ctrl-C reaches faults.py, which stops its nodes (they are its processes).
ip netns exec "$NS-c" python3 "$BENCH_DIR/faults.py" \
  --bin "$BIN" --ns "$NS" --out "$OUT_DIR" --scenarios "$SCENARIOS" \
  ${CHECK:+--check} | tee "$OUT_DIR/summary.txt"
