# Shared helpers of the cluster benchmarks (bench/cluster.sh, bench/global.sh): source it after
# setting BENCH_DIR, REPO, OUT_DIR, BASE_PORT and SCRIPT (the caller's name, for log lines).
# Everything runs on 127.0.0.1. The scripts' BASE_PORT defaults lie below Linux's ephemeral range
# (32768-60999): there, the client ports of a load (bench/slowconns.sh opens tens of thousands of
# connections) could hold a node's port when the next run binds it.

log() { printf '[%s %s] %s\n' "$SCRIPT" "$(date +%H:%M:%S)" "$*" >&2; }
command -v wrk >/dev/null || { log "installing wrk"; apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }

PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
# Nodes form clusters only with a secret (issue 29); the benchmarks run the secure path
# (RINGLIMIT_CLUSTER_SECRET= with RINGLIMIT_ALLOW_UNAUTHENTICATED_PEERS=true runs without it).
export RINGLIMIT_CLUSTER_SECRET="${RINGLIMIT_CLUSTER_SECRET-ringlimit-bench-$$-$RANDOM}"
# BIN=path runs that binary (e.g. an older build, for a before/after), without building.
if [ -z "${BIN:-}" ] && [ "${SKIP_BUILD:-0}" != 1 ]; then
  log "building ringlimit (release)"
  cargo build --release -q -p ringlimit-node --bin ringlimit --manifest-path "$REPO/Cargo.toml"
fi
BIN="${BIN:-$CARGO_TARGET_DIR/release/ringlimit}"

# Where the processes run. PIN=1: the node alone on CPU 0, every load generator on CPU 1, a
# flood on idle CPU only (FLOOD_IDLE=1, SCHED_IDLE) — the attacker's CPU is not the node's, as
# from another machine; on 2 shared cores the flood's generator otherwise takes the node's CPU.
# NODE_WRAP, GEN_WRAP, FLOOD_WRAP: command prefixes for the nodes, the load generators, a flood.
if [ "${PIN:-0}" = 1 ]; then
  NODE_WRAP="taskset -c 0" GEN_WRAP="taskset -c 1" FLOOD_IDLE=1
fi
FLOOD_WRAP="${GEN_WRAP:-}"
if [ "${FLOOD_IDLE:-0}" = 1 ]; then FLOOD_WRAP="$FLOOD_WRAP chrt --idle 0"; fi

http_port() { echo $((BASE_PORT + $1)); }
peer_port() { echo $((BASE_PORT + 50 + $1)); }

# Starts N nodes seeded with each other and waits (bounded) until each sees all N in its ring.
start_nodes() { # N LABEL [extra ringlimit serve flags...]
  local n=$1 label=$2 seeds="" i
  shift 2
  for ((i = 0; i < n; i++)); do seeds+="127.0.0.1:$(peer_port "$i"),"; done
  for ((i = 0; i < n; i++)); do
    # shellcheck disable=SC2086 # a command prefix, split on purpose
    RUST_LOG=warn ${NODE_WRAP:-} "$BIN" serve --node-id "bench-$i" --http "127.0.0.1:$(http_port "$i")" \
      --peer "127.0.0.1:$(peer_port "$i")" --seeds "${seeds%,}" "$@" \
      2>"$OUT_DIR/node-$label-$i.log" &
    PIDS+=($!)
  done
  local deadline=$((SECONDS + 20))
  for ((i = 0; i < n; i++)); do
    until curl -sf "http://127.0.0.1:$(http_port "$i")/v1/cluster" | grep -q "\"ring_members\":$n"; do
      [ $SECONDS -lt $deadline ] || { log "cluster of $n did not form"; exit 1; }
      sleep 0.1
    done
  done
}

stop_nodes() {
  cleanup
  PIDS=()
  sleep 0.5
}

to_ms() { # wrk prints 80.00us / 1.20ms / 1.01s
  awk -v v="$1" 'BEGIN {
    if (v ~ /us$/) { sub(/us$/, "", v); printf "%.3f", v / 1000 }
    else if (v ~ /ms$/) { sub(/ms$/, "", v); printf "%.3f", v }
    else if (v ~ /s$/) { sub(/s$/, "", v); printf "%.3f", v * 1000 }
    else printf "nan" }'
}

# wrk -t2 -c$CONNS for $DURATION s against node 0 with a script of bench/wrk; the raw output goes
# to $OUT_DIR/LABEL.txt; prints "rps p50_ms p99_ms". The script reads its settings from the
# environment (KEYSPACE, RULE, ...).
wrk_load() { # LABEL SCRIPT
  local out="$OUT_DIR/$1.txt"
  # shellcheck disable=SC2086 # a command prefix, split on purpose
  timeout --kill-after=5 $((DURATION + 30)) ${GEN_WRAP:-} wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency \
    -s "$BENCH_DIR/wrk/$2" "http://127.0.0.1:$(http_port 0)" >"$out" 2>&1
  local rps p50 p99
  rps=$(awk '/^Requests\/sec/ {print $2}' "$out")
  p50=$(awk '$1 == "50%" {print $2}' "$out")
  p99=$(awk '$1 == "99%" {print $2}' "$out")
  echo "$rps $(to_ms "$p50") $(to_ms "$p99")"
}

# utime+stime in jiffies (CLK_TCK, 100/s here) of the nodes this script started, summed.
nodes_cpu() {
  local sum=0 pid st
  for pid in "${PIDS[@]}"; do
    st=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    st=${st##*) }
    # shellcheck disable=SC2086
    set -- $st
    sum=$((sum + ${12} + ${13}))
  done
  echo "$sum"
}

median() { sort -g | awk '{a[NR] = $1} END {if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
