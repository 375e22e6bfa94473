#!/usr/bin/env bash
# Limits across regions on an emulated WAN: three regions of two nodes, each region a network
# namespace of its own, wanline's userspace delay line between them (round trips a-b 30 ms, a-c
# 80 ms, b-c 150 ms, 1% loss each way; this kernel has no netem), loads inside each region.
#
#   bench/regions.sh                                   # every scenario, release build
#   SCENARIOS="wan skewed" bench/regions.sh
#   LIMIT=200 WINDOW_S=10 CUT_S=25 bench/regions.sh    # a shorter form
#
# Scenarios:
#   wan      the line itself: each pair's round trip (UDP echo p50) and the loss it drops
#   skewed   a shared limit of LIMIT per WINDOW_S s (fixed window, scope: regions), asked 2x,
#            60/30/10% across a, b, c, for SKEW_WINDOWS windows: admitted per window (≤ 1.03x)
#            and each region's count against its max-min fair share
#   moving   the same limit as a token bucket; a asks 2x and b a tenth for MOVE_BEFORE_S s,
#            then they swap: how long until b admits 90% of its fair share (≤ 3 s)
#   cutoff   2x across a, b, c (50/25/25%); c cut off by the line for CUT_S s from a quarter into
#            a window: admitted per window (≤ the limit while cut off), when c's answers turn
#            degraded, when they stop after the restore
#   p99      P99_RATE checks/s for P99_S s in region a on a limit never reached, with regions
#            off and then on: p99 from each check's scheduled time (nothing waits on the WAN)
# Prints a Markdown table (scenario, measure, value, target, ok); exits 1 when a measure misses
# its target. Needs root (ip netns, /dev/net/tun). REGION_INTERVAL_MS sets --region-interval-ms.
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SCENARIOS="${SCENARIOS:-wan skewed moving cutoff p99}"

[ "$(id -u)" = 0 ] || die "needs root (network namespaces, TUN devices)"
[ -e /dev/net/tun ] || die "needs /dev/net/tun"
need ip=iproute2 python3
build_node
BIN="$(realpath "$BIN")"
if [ -z "${WANLINE:-}" ]; then
  cargo_release -p ringlimit-test-support --features wanline --bin wanline
  WANLINE="$CARGO_TARGET_DIR/release/wanline"
fi
[ -x "$WANLINE" ] || die "no wanline binary at $WANLINE (build it, or set WANLINE)"
WANLINE="$(realpath "$WANLINE")"

# In the foreground: Ctrl-C reaches regions.py, which stops what it started and removes its
# namespaces (the delay line's TUN devices go with the line).
start=$SECONDS
rc=0
python3 "$BENCH_DIR/regions.py" --bin "$BIN" --wanline "$WANLINE" --out "$OUT_DIR" \
  --scenarios "$SCENARIOS" | tee "$OUT_DIR/summary.md" || rc=$?
log "$((SECONDS - start)) s; raw results and node logs in $OUT_DIR"
exit "$rc"
