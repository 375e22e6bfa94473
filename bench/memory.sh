#!/usr/bin/env bash
# Resident memory of one release node as each of its caps fills, the figures behind the memory
# request and limit in deploy/k8s:
#
#   bench/memory.sh
#   MAX_KEYS=2000000 bench/memory.sh
#
# Starts a node per stage on 127.0.0.1 and fills it through POST /v1/check/batch (1000 checks a
# request, every key distinct), then reads VmRSS and VmHWM (the peak) from /proc/PID/status:
#   empty    --max-keys 1000, nothing checked: the process itself
#   store    --max-keys MAX_KEYS, MAX_KEYS distinct keys of an inline token bucket (more than
#            fit, as the store spreads keys over shards unevenly: every shard ends up full)
#   global   as store, plus GLOBAL_KEYS keys of a `mode: global` rule with
#            --global-max-counters GLOBAL_KEYS
# A node's store tables grow as buckets arrive, so the peak can exceed the end figure: the
# allocator frees an outgrown table only some time after it is replaced.
#
# Env: MAX_KEYS (default 1000000), GLOBAL_KEYS (default 100000), HTTP_THREADS (default 2, as
# TOKIO_WORKER_THREADS=2 in deploy/k8s), EXTRA_ENV (e.g. "MIMALLOC_PURGE_DELAY=0"), BIN, SKIP_BUILD=1, BASE_PORT, OUT_DIR (node logs),
# CARGO_TARGET_DIR (bench/lib.sh).
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
MAX_KEYS="${MAX_KEYS:-1000000}"
GLOBAL_KEYS="${GLOBAL_KEYS:-100000}"
HTTP_THREADS="${HTTP_THREADS:-2}"
NODE_ENV="${EXTRA_ENV:-} TOKIO_WORKER_THREADS=$HTTP_THREADS"
build_node

cat >"$OUT_DIR/rules.yaml" <<'EOF'
rules:
  - name: mem-global
    limit: 1000
    period: 1m
    algorithm: sliding_window
    mode: global
EOF

start() { # LABEL [serve flags...]
  local label=$1
  shift
  start_nodes 1 "$label" --http-threads "$HTTP_THREADS" --config "$OUT_DIR/rules.yaml" "$@"
}

mb() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1000 }'; }
report() { # LABEL
  local rss hwm
  rss=$(proc_kb VmRSS)
  hwm=$(proc_kb VmHWM)
  printf '%-58s RSS %8s MB   peak %8s MB\n' "$1" "$(mb "$rss")" "$(mb "$hwm")"
}

STORE_CHECK='"limit":100,"period_ms":60000'
GLOBAL_CHECK='"rule":"mem-global"'

log "stage empty"
start empty --max-keys 1000
report "empty: --max-keys 1000"
stop_nodes

log "stage store: $MAX_KEYS keys"
start store --max-keys "$MAX_KEYS"
report "store: --max-keys $MAX_KEYS, at start"
node_fill "$MAX_KEYS" s: "$STORE_CHECK"
report "store: $MAX_KEYS keys checked"
node_fill $((MAX_KEYS / 10)) t: "$STORE_CHECK"
report "store: $((MAX_KEYS / 10)) more (evicting)"
stop_nodes

log "stage global: + $GLOBAL_KEYS global keys"
start global --max-keys "$MAX_KEYS" --global-max-counters "$GLOBAL_KEYS"
node_fill "$MAX_KEYS" s: "$STORE_CHECK"
node_fill "$GLOBAL_KEYS" g: "$GLOBAL_CHECK"
report "every cap full: + $GLOBAL_KEYS global keys"
sleep 3
report "every cap full, 3 s later"
stop_nodes
