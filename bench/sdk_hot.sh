#!/usr/bin/env bash
# One hot key through the SDK: one client thread checking one key as fast as it can, with leases
# (decided in-process on a slice of the owner's bucket) and without (every check to its owner),
# against a 3-node release cluster, side by side in one run.
#
#   bench/sdk_hot.sh                        # 5 s per phase, one round
#   SECONDS_PER=3 RUNS=3 bench/sdk_hot.sh   # medians over 3 rounds
#
# The client is crates/client/examples/sdk_hot.rs (a current-thread runtime): after a warm-up
# (the key becomes hot and is leased) it measures checks per second, then each check's
# latency, and the three nodes' CPU time (/proc) over both phases per check. Targets: at least
# 2,000,000 checks/s from the one thread, p50 under 1 us, server CPU per check at most 0.1 us,
# and nothing admitted over the limit (`LIMIT`, a fixed window of an hour: `allowed` <= LIMIT).
#
# Env: SECONDS_PER (5), RUNS (1), LIMIT (1000000000), BIN (bench/lib.sh), SDK_HOT (the example's
# binary; built like the node unless set).
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SECONDS_PER="${SECONDS_PER:-5}"
RUNS="${RUNS:-1}"
LIMIT="${LIMIT:-1000000000}"
need curl python3
build_node
if [ -z "${SDK_HOT:-}" ]; then
  cargo_release -p ringlimit-client --example sdk_hot
  SDK_HOT="$CARGO_TARGET_DIR/release/examples/sdk_hot"
fi
[ -x "$SDK_HOT" ] || die "no sdk_hot binary at $SDK_HOT"

for ((run = 1; run <= RUNS; run++)); do
  start_nodes 3 "run$run"
  pids=$(IFS=,; echo "${PIDS[*]}")
  seeds="http://127.0.0.1:$(http_port 0)"
  for mode in leases no_leases; do
    flag=()
    [ "$mode" = leases ] || flag=(--no-leases)
    log "round $run: $mode"
    "$SDK_HOT" --seeds "$seeds" --seconds "$SECONDS_PER" --pids "$pids" --limit "$LIMIT" \
      "${flag[@]}" | tee -a "$OUT_DIR/$mode.jsonl"
  done
  stop_nodes
done

python3 - "$OUT_DIR" "$LIMIT" <<'PY' | tee "$OUT_DIR/summary.txt"
import json, statistics, sys
out, limit = sys.argv[1], int(sys.argv[2])
print("mode\tchecks_per_s\tp50_ns\tp99_ns\tserver_cpu_us_per_check\tleased_share\tover_limit")
for mode in ("leases", "no_leases"):
    rows = [json.loads(l) for l in open(f"{out}/{mode}.jsonl")]
    med = lambda k: statistics.median(r[k] for r in rows)
    share = statistics.median(r["leased_in_measure"] / r["measured"] for r in rows)
    over = sum(max(0, r["allowed"] - r["limit"]) for r in rows)
    print(f"{mode}\t{med('checks_per_s'):.0f}\t{med('p50_ns'):.0f}\t{med('p99_ns'):.0f}\t"
          f"{med('server_cpu_us_per_check'):.4f}\t{share:.4f}\t{over}")
PY
