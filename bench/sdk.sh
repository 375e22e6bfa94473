#!/usr/bin/env bash
# SDK benchmark: checks from the client SDK straight to each key's owner (peer protocol) against
# the same checks through a random node's HTTP endpoint, side by side in one run, against the
# same 3-node cluster on 127.0.0.1.
#
#   bench/sdk.sh                          # 5 s per load, 1 round
#   RUNS=3 SECONDS_PER_LOAD=5 bench/sdk.sh  # medians over 3 rounds
#
# Loads: a fixed rate (RATE checks/s from 8 callers: latency at a steady load), then closed loops
# of CONC callers (throughput). Nodes, load generator and the machine's other work share its 2
# cores: read the ratios, and the medians.
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SECS="${SECONDS_PER_LOAD:-5}"
RUNS="${RUNS:-1}"
RATE="${RATE:-5000}"
CONC="${CONC:-32}"
build_node

cargo_release -p ringlimit-client --example sdk_load
LOAD="$CARGO_TARGET_DIR/release/examples/sdk_load"
[ -x "$LOAD" ] || die "no sdk_load at $LOAD (build it: cargo build --release -p ringlimit-client --example sdk_load)"

start_nodes 3 sdk
SEEDS="http://127.0.0.1:$(http_port 0),http://127.0.0.1:$(http_port 1),http://127.0.0.1:$(http_port 2)"

run_load() { # LABEL MODE [sdk_load flags...]
  local label=$1 mode=$2
  shift 2
  local c0 c1
  c0=$(nodes_cpu)
  "$LOAD" --seeds "$SEEDS" --mode "$mode" --seconds "$SECS" "$@" >"$OUT_DIR/$label.json"
  c1=$(nodes_cpu)
  # server CPU per answered check: steadier than throughput on a shared machine
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r["server_cpu_us_per_check"]=(int(sys.argv[2])*1e6/int(sys.argv[3]))/max(r["checks"],1); print(json.dumps(r))' \
    "$OUT_DIR/$label.json" "$((c1 - c0))" "$(getconf CLK_TCK)" | tee -a "$OUT_DIR/results.jsonl" >/dev/null
}

log "warm-up"
"$LOAD" --seeds "$SEEDS" --mode sdk --seconds 2 --concurrency 8 >/dev/null
"$LOAD" --seeds "$SEEDS" --mode http --seconds 2 --concurrency 8 >/dev/null
for ((run = 1; run <= RUNS; run++)); do
  for mode in sdk http; do
    log "round $run: $mode at $RATE checks/s"
    run_load "$mode-rate-$run" "$mode" --concurrency 8 --rate "$RATE"
    log "round $run: $mode, $CONC callers"
    run_load "$mode-c$CONC-$run" "$mode" --concurrency "$CONC"
  done
done

python3 - "$OUT_DIR/results.jsonl" "$RATE" "$CONC" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:  # answers not from the fallback
    r["direct_per_s"] = r["checks_per_s"] * (1 - (r["degraded"] + r["errors"]) / max(r["checks"], 1))
rate, conc = int(sys.argv[2]), int(sys.argv[3])
def med(mode, key, **f):
    v = [r[key] for r in rows if r["mode"] == mode and all(r[k] == x for k, x in f.items())]
    return statistics.median(v) if v else float("nan")
print(f"{'':34}{'sdk (direct)':>14}{'http (random node)':>20}{'ratio':>8}")
for label, key, f in [
    (f"p50 us at {rate}/s", "p50_us", {"rate": rate}),
    (f"p99 us at {rate}/s", "p99_us", {"rate": rate}),
    (f"p99.9 us at {rate}/s", "p999_us", {"rate": rate}),
    (f"checks/s, {conc} callers", "checks_per_s", {"concurrency": conc, "rate": 0}),
    (f"  of which by owners", "direct_per_s", {"concurrency": conc, "rate": 0}),
    (f"p50 us, {conc} callers", "p50_us", {"concurrency": conc, "rate": 0}),
    (f"p99 us, {conc} callers", "p99_us", {"concurrency": conc, "rate": 0}),
    (f"server CPU us/check, {conc} callers", "server_cpu_us_per_check", {"concurrency": conc, "rate": 0}),
    (f"server CPU us/check at {rate}/s", "server_cpu_us_per_check", {"rate": rate}),
]:
    s, h = med("sdk", key, **f), med("http", key, **f)
    print(f"{label:34}{s:14.1f}{h:20.1f}{(s / h if h else float('nan')):8.2f}")
deg = sum(r["degraded"] + r["errors"] for r in rows)
total = sum(r["checks"] for r in rows)
frames = [r["checks_per_frame"] for r in rows if r["mode"] == "sdk" and r["rate"] == 0]
print(f"degraded or failed answers in all loads: {deg} of {total}; sdk checks per frame at {conc} callers: {statistics.median(frames) if frames else 0:.2f}")
PY
log "raw results in $OUT_DIR"
