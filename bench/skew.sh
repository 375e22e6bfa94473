#!/usr/bin/env bash
# Clock skew: 3 nodes, node 2's wall clock moved with libfaketime (Debian's faketime; its monotonic
# clock left alone, as when NTP fails on one host), a `mode: global` rule of 300 per 10 s fixed
# window, 180 checks/s spread over the nodes (bench/skew.py) for 40 s. Prints, per offset, the
# offset node 0 measured for node 2 and what each 10 s window admitted.
#
#   bench/skew.sh                              # OFFSETS="0 +3 +10 -7 +60" (seconds)
#   OFFSETS="+10" SECONDS_PER=30 BIN=target/debug/ringlimit bench/skew.sh
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
OFFSETS="${OFFSETS:-0 +3 +10 -7 +60}"
SECONDS_PER="${SECONDS_PER:-40}"
LIBFAKETIME=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1
[ -e "$LIBFAKETIME" ] || die "needs $LIBFAKETIME (apt-get install faketime)"
need curl python3
build_node

cat >"$OUT_DIR/rules.yaml" <<'YAML'
rules:
  - { name: g, limit: 300, period: 10s, algorithm: fixed_window, mode: global }
YAML

echo "| node 2's clock | offset node 0 measured (ms) | admitted per 10 s window (limit 300) | most ÷ limit | failed |"
echo "|---|---:|---|---:|---:|"
for off in $OFFSETS; do
  seeds="127.0.0.1:$(peer_port 0),127.0.0.1:$(peer_port 1),127.0.0.1:$(peer_port 2)"
  for i in 0 1 2; do
    ports_free "$(http_port $i)" "$(peer_port $i)"
    fake=()
    if [ "$i" = 2 ] && [ "$off" != 0 ]; then
      fake=(LD_PRELOAD="$LIBFAKETIME" FAKETIME="${off}s" FAKETIME_DONT_FAKE_MONOTONIC=1)
    fi
    env "${fake[@]}" RUST_LOG=warn "$BIN" serve --node-id "bench-$i" --config "$OUT_DIR/rules.yaml" \
      --http "127.0.0.1:$(http_port $i)" --peer "127.0.0.1:$(peer_port $i)" --seeds "$seeds" \
      2>"$OUT_DIR/node-$off-$i.log" &
    PIDS+=($!)
  done
  for i in 0 1 2; do
    wait_ready "http://127.0.0.1:$(http_port $i)/readyz" "${PIDS[$i]}" "$OUT_DIR/node-$off-$i.log" "node $i"
  done
  sleep 4 # a few clock samples
  measured=$(curl -s "http://127.0.0.1:$(http_port 0)/v1/cluster" | python3 -c '
import json, sys
v = json.load(sys.stdin)
print(next((round(p["offset_ms"], 1) for p in v["clock"]["peers"] if p["node_id"] == "bench-2"), "-"))')
  result=$(python3 "$BENCH_DIR/skew.py" --seconds "$SECONDS_PER" "$(http_port 0)" "$(http_port 1)" "$(http_port 2)")
  echo "$result" >"$OUT_DIR/result-$off.json"
  python3 -c '
import json, sys
off, measured = sys.argv[1], sys.argv[2]
r = json.loads(sys.argv[3])
w = r["windows"]
most = max(w) / 300 if w else 0
windows = ", ".join(map(str, w))
failed = r["failed"]
print(f"| {off} s | {measured} | {windows} | {most:.2f} | {failed} |")' "$off" "$measured" "$result"
  stop_nodes
done
