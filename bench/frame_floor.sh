#!/usr/bin/env bash
# The floor under what `--replicas 1` costs: the CPU of the replica frames alone, as a bare tokio
# writer and reader pay it on this machine (crates/node/examples/frame_floor.rs: BYTES every
# EVERY_US over loopback TCP, none of ringlimit's code), set beside the measured difference between
# a --replicas 1 and a --replicas 0 cluster under the same SDK load.
#
#   bench/frame_floor.sh                      # RUNS=3 rounds; 8 s per load
#   RUNS=5 RATE=30000 bench/frame_floor.sh
#
# Each round, 3 nodes each time, the SDK at RATE checks/s over KEYSPACE keys (filled first), as
# bench/replica_cost.sh's sdk path:
#   r0       --replicas 0
#   r0+pair  --replicas 0, and the bare pair writing the frames the replicas would (default: 760
#            bytes every 1,333 us, i.e. 750 frames/s, what 3 nodes send at the default 8 ms
#            flush, each to 2 members; replica_cost.sh's runs measured about 760 bytes a frame)
#   r1       --replicas 1 (its frames and bytes read from the nodes' metrics)
# It prints, per configuration, the medians of the nodes' CPU (ms per second of load; /proc
# ticks) and of the pair's own CPU (schedstat, exact), and the pair's CPU per frame.
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
RUNS="${RUNS:-3}"
SECS="${SECS:-8}"
RATE="${RATE:-30000}"
EVERY_US="${EVERY_US:-1333}"
BYTES="${BYTES:-760}"
export KEYSPACE="${KEYSPACE:-100000}"
need python3
build_node
cargo_release -p ringlimit-client --example sdk_load
cargo_release -p ringlimit-node --example frame_floor
LOAD="$CARGO_TARGET_DIR/release/examples/sdk_load"
FLOOR="$CARGO_TARGET_DIR/release/examples/frame_floor"
for b in "$LOAD" "$FLOOR"; do [ -x "$b" ] || die "no $b"; done
SEEDS="http://127.0.0.1:$(http_port 0),http://127.0.0.1:$(http_port 1),http://127.0.0.1:$(http_port 2)"

# The nodes' replication frames and bytes so far, summed.
replicated() {
  local i
  for ((i = 0; i < 3; i++)); do
    curl -sf "http://127.0.0.1:$(http_port "$i")/metrics"
  done | awk '/^ringlimit_replication_frames_total/ {f += $NF} /^ringlimit_replication_bytes_total/ {b += $NF}
    END {printf "%d %d\n", f, b}'
}

run_one() { # CONFIG RUN
  local config=$1 run=$2 replicas=0 c0 c1 f0 b0 f1 b1 pair="" ticks checks
  [ "$config" != r1 ] || replicas=1
  start_nodes 3 "$config-$run" --replicas "$replicas"
  node_fill "$KEYSPACE" "load:" '"limit":1000000,"period_ms":60000'
  "$LOAD" --seeds "$SEEDS" --mode sdk --seconds 2 --concurrency 8 --keys "$KEYSPACE" >/dev/null
  read -r f0 b0 < <(replicated)
  if [ "$config" = r0+pair ]; then
    # The pair warms up for 1 s and measures SECS - 2 s inside the load's SECS.
    "$FLOOR" "$EVERY_US" "$BYTES" "$((SECS - 2))" >"$OUT_DIR/pair-$run.json" &
    HELPERS+=($!)
    pair=$!
  fi
  c0=$(nodes_cpu)
  "$LOAD" --seeds "$SEEDS" --mode sdk --seconds "$SECS" --concurrency 8 --rate "$RATE" \
    --keys "$KEYSPACE" >"$OUT_DIR/sdk-$config-$run.json"
  c1=$(nodes_cpu)
  read -r f1 b1 < <(replicated)
  [ -z "$pair" ] || wait "$pair"
  ticks=$((c1 - c0))
  checks=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["checks"])' "$OUT_DIR/sdk-$config-$run.json")
  python3 -c 'import json,sys
config, run, ticks, hz, secs, checks, frames, nbytes, pair = sys.argv[1:]
row = {"config": config, "run": int(run), "checks": int(checks),
       "nodes_ms_per_s": int(ticks) * 1e3 / int(hz) / float(secs),
       "replica_frames_per_s": int(frames) / float(secs),
       "replica_bytes_per_frame": int(nbytes) / max(int(frames), 1)}
if pair:
    p = json.load(open(pair))
    row["pair_us_per_frame"] = p["us_per_frame"]
    row["pair_ms_per_s"] = p["us_per_frame"] * p["frames"] / p["seconds"] / 1e3
print(json.dumps(row))' "$config" "$run" "$ticks" "$(getconf CLK_TCK)" "$SECS" "$checks" \
    "$((f1 - f0))" "$((b1 - b0))" "$([ "$config" != r0+pair ] || echo "$OUT_DIR/pair-$run.json")" \
    >>"$OUT_DIR/results.jsonl"
  log "  $(tail -1 "$OUT_DIR/results.jsonl")"
  stop_nodes
}

log "alone: the pair on an idle machine"
"$FLOOR" "$EVERY_US" "$BYTES" 6 | tee "$OUT_DIR/pair-alone.json"
for ((run = 1; run <= RUNS; run++)); do
  for config in r0 r0+pair r1; do
    log "round $run: $config"
    run_one "$config" "$run"
  done
done

python3 - "$OUT_DIR/results.jsonl" "$OUT_DIR/pair-alone.json" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
alone = json.load(open(sys.argv[2]))
med = lambda xs: statistics.median(xs) if xs else float("nan")
col = lambda c, k: [r[k] for r in rows if r["config"] == c and k in r]
print(f"bare pair alone: {alone['us_per_frame']:.1f} us per frame "
      f"(reader {alone['reader_us_per_frame']:.1f}, writer {alone['writer_us_per_frame']:.1f}), "
      f"{alone['bytes']} bytes every {alone['every_us']} us")
print(f"{'config':10}{'nodes CPU ms/s':>38}{'median':>9}")
for c in ("r0", "r0+pair", "r1"):
    v = col(c, "nodes_ms_per_s")
    print(f"{c:10}{', '.join(f'{x:.0f}' for x in v):>38}{med(v):9.0f}")
base = med(col("r0", "nodes_ms_per_s"))
pair = med(col("r0+pair", "pair_ms_per_s"))
print(f"bare pair beside the r0 load: {med(col('r0+pair', 'pair_us_per_frame')):.1f} us per frame, "
      f"{pair:.0f} ms/s")
print(f"r1's frames: {med(col('r1', 'replica_frames_per_s')):.0f}/s, "
      f"{med(col('r1', 'replica_bytes_per_frame')):.0f} bytes each")
print(f"r1 - r0: {med(col('r1', 'nodes_ms_per_s')) - base:.0f} ms/s ({med(col('r1', 'nodes_ms_per_s')) / base:.2f}x); "
      f"the pair's frames alone: {pair:.0f} ms/s ({(base + pair) / base:.2f}x of r0)")
PY
log "raw results in $OUT_DIR"
