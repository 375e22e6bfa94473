#!/usr/bin/env bash
# The soak: 3 release nodes on 127.0.0.1 for MINUTES (default 30) with owner and global rules and
# several limits per request, one node killed (SIGKILL) and restarted every KILL_EVERY seconds
# (default 180), under RATE requests/s (default 600). See bench/soak.py for what is measured.
#
#   bench/soak.sh
#   MINUTES=5 KILL_EVERY=60 bench/soak.sh
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
build_node
ports_free "$(http_port 0)" "$(http_port 1)" "$(http_port 2)" "$(peer_port 0)" "$(peer_port 1)" "$(peer_port 2)"
# In the foreground: Ctrl-C reaches soak.py, which stops its nodes (they are its processes).
BASE_PORT="$BASE_PORT" python3 "$BENCH_DIR/soak.py" --bin "$(realpath "$BIN")" --out "$OUT_DIR" \
  --minutes "${MINUTES:-30}" --kill-every "${KILL_EVERY:-180}" --rate "${RATE:-600}" \
  | tee "$OUT_DIR/summary.txt"
