#!/usr/bin/env bash
# The client SDKs side by side: Rust (crates/client), Python (clients/python) and TypeScript
# (clients/typescript), against one 3-node release cluster on 127.0.0.1 per round, in one run.
#
#   bench/sdk_langs.sh                          # 5 s per leased phase, one round
#   RUNS=3 SECONDS_PER=5 bench/sdk_langs.sh     # medians over 3 rounds
#
# Per SDK and round:
# - leased: one thread checking one hot key as fast as it can, decided in process on slices
#   leased from its owner (a fixed window of LIMIT an hour): checks/s, and admitted <= LIMIT;
#   Rust: crates/client/examples/sdk_hot.rs; Python: `check()` on a named rule (and inline);
#   Node.js: the synchronous `tryCheck` and `await client.check()`.
# - round trip: one thread, one check at a time, no leases: p50 and p99, and the three nodes'
#   CPU time (/proc) per check sent — steadier than throughput on this shared machine. Rust
#   runs it twice: as fast as it can on one key, and (after each other SDK's) paced to that
#   SDK's rate on as many keys (`sdk_hot --rate`): a node woken for every check pays more per
#   check than a busy one, so the like-for-like ratio is the paced one.
# - concurrent: CONC callers (threads in Python, async callers in Node.js and Rust's sdk_load)
#   on keys spread over 100,000, no leases: checks/s and the nodes' CPU per check, where the
#   per-owner batching counts. Rust's CONC callers run again after each other SDK's, paced to
#   that SDK's rate in all (`sdk_load --rate`): the like-for-like baseline of this phase too.
# Targets: Python >= 1M leased checks/s from one thread, Node.js >= 5M/s, exact; p50 round trip
# under 300 us; server CPU per check within 1.2x of the Rust SDK's.
#
# Env: SECONDS_PER (5), RUNS (1), LIMIT (1000000000), ROUND_TRIPS (10000), CONC (32),
# PACED_SECONDS (3), PYTHON (the venv .ci/run makes), BIN (bench/lib.sh), SKIP_BUILD=1, OUT_DIR.
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SECONDS_PER="${SECONDS_PER:-5}"
RUNS="${RUNS:-1}"
LIMIT="${LIMIT:-1000000000}"
ROUND_TRIPS="${ROUND_TRIPS:-10000}"
CONC="${CONC:-32}"
PACED_SECONDS="${PACED_SECONDS:-3}"
PYTHON="${PYTHON:-/tmp/ringlimit-sdk-venv/bin/python}"
need curl python3 node npm
[ -x "$PYTHON" ] || die "no Python with the SDK's packages at $PYTHON (.ci/run makes it)"
build_node
cargo_release -p ringlimit-client --example sdk_hot
cargo_release -p ringlimit-client --example sdk_load
SDK_HOT="$CARGO_TARGET_DIR/release/examples/sdk_hot"
SDK_LOAD="$CARGO_TARGET_DIR/release/examples/sdk_load"
TS="$REPO/clients/typescript"
[ -d "$TS/node_modules" ] || (cd "$TS" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
(cd "$TS" && npx tsc -p tsconfig.json)
cat >"$OUT_DIR/rules.yaml" <<YAML
rules:
  - name: bench-hot
    limit: $LIMIT
    period: 1h
    algorithm: fixed_window
YAML

# Leases and give-backs over ringlimit.v1 need a client credential when nodes have a secret.
export RINGLIMIT_CLIENT_TOKEN="${RINGLIMIT_CLIENT_TOKEN:-ringlimit-bench-client-$$-$RANDOM}"

# The nodes' CPU ticks a second while no client runs (gossip, timers), measured once a round:
# each phase's CPU per check is counted net of it (a client's start-up and discovery would
# otherwise charge idle time to its checks).
idle_rate() {
  local c0 c1
  c0=$(nodes_cpu)
  sleep 3
  c1=$(nodes_cpu)
  python3 -c 'import sys; print((int(sys.argv[2]) - int(sys.argv[1])) / 3)' "$c0" "$c1"
}

# phase LABEL CHECKS_FIELD COMMAND...: runs COMMAND (one JSON object on stdout), adds the nodes'
# CPU per check net of IDLE (CHECKS_FIELD: a dotted path to the checks the nodes answered),
# appends a row.
phase() {
  local label=$1 field=$2 c0 c1 t0 t1
  shift 2
  c0=$(nodes_cpu)
  t0=$(date +%s.%N)
  "$@" >"$OUT_DIR/$label.json"
  t1=$(date +%s.%N)
  c1=$(nodes_cpu)
  python3 - "$OUT_DIR/$label.json" "$label" "$field" "$((c1 - c0))" "$(getconf CLK_TCK)" "$IDLE" \
    "$t0" "$t1" <<'PY' >>"$OUT_DIR/results.jsonl"
import json, sys
path, label, field, ticks, hz = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
idle, wall = float(sys.argv[6]), float(sys.argv[8]) - float(sys.argv[7])
r = json.load(open(path))
n = r
for part in field.split("."):
    n = n[part]
net = max(ticks - idle * wall, 0)
r = {"label": label, "result": r, "wall_s": round(wall, 3), "server_ticks": ticks, "idle_ticks": round(idle * wall, 1),
     "server_cpu_us_per_check": net * 1e6 / hz / max(int(n), 1)}
print(json.dumps(r))
PY
}

# paced_conc LABEL JSON: the Rust SDK's CONC callers paced to the concurrent rate in all of
# another SDK's phase (its JSON), on the round's cluster ($seeds): that phase's like for like.
paced_conc() {
  local rate
  rate=$(python3 -c 'import json, sys; print(round(json.load(open(sys.argv[1]))["concurrent"]["checks_per_s"]))' "$2")
  phase "$1" checks "$SDK_LOAD" --seeds "$seeds" --mode sdk --concurrency "$CONC" \
    --seconds "$PACED_SECONDS" --rate "$rate"
}

for ((run = 1; run <= RUNS; run++)); do
  start_nodes 3 "run$run" --grpc 127.0.0.1:0 --config "$OUT_DIR/rules.yaml"
  pids=$(IFS=,; echo "${PIDS[*]}")
  IDLE=$(idle_rate)
  seeds="http://127.0.0.1:$(http_port 0),http://127.0.0.1:$(http_port 1),http://127.0.0.1:$(http_port 2)"
  log "round $run: Rust"
  phase "rust-leased-$run" checks "$SDK_HOT" --seeds "$seeds" --seconds "$SECONDS_PER" --pids "$pids" --limit "$LIMIT"
  phase "rust-rtt-$run" checks "$SDK_HOT" --seeds "$seeds" --seconds 2 --pids "$pids" --limit "$LIMIT" --no-leases
  phase "rust-conc-$run" checks "$SDK_LOAD" --seeds "$seeds" --mode sdk --concurrency "$CONC" --seconds "$SECONDS_PER"
  log "round $run: Python"
  phase "python-leased-$run" leased.checks_sent "$PYTHON" "$REPO/clients/python/bench/bench.py" --seeds "$seeds" \
    --only leased --rule bench-hot --seconds "$SECONDS_PER" --limit "$LIMIT"
  phase "python-inline-$run" leased.checks_sent "$PYTHON" "$REPO/clients/python/bench/bench.py" --seeds "$seeds" \
    --only leased --seconds "$SECONDS_PER" --limit "$LIMIT"
  phase "python-rtt-$run" round_trip.checks_sent "$PYTHON" "$REPO/clients/python/bench/bench.py" --seeds "$seeds" \
    --only round_trip --round-trips "$ROUND_TRIPS"
  # The Rust SDK at Python's one-at-a-time rate on as many keys: the like-for-like baseline.
  rate=$(python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["round_trip"]; print(r["checks"] / r["seconds"])' \
    "$OUT_DIR/python-rtt-$run.json")
  phase "rust-atpy-$run" checks "$SDK_HOT" --seeds "$seeds" --seconds "$PACED_SECONDS" --pids "$pids" --no-leases \
    --rate "$rate" --keys 1000
  phase "python-conc-$run" concurrent.checks "$PYTHON" "$REPO/clients/python/bench/bench.py" --seeds "$seeds" \
    --only concurrent --threads "$CONC" --seconds "$SECONDS_PER"
  paced_conc "rust-concatpy-$run" "$OUT_DIR/python-conc-$run.json"
  log "round $run: Node.js"
  phase "node-leased-$run" leased.sent_to_owner node "$TS/dist/bench/bench.js" --seeds "$seeds" --only leased \
    --seconds "$SECONDS_PER" --limit "$LIMIT"
  phase "node-rtt-$run" checks_sent node "$TS/dist/bench/bench.js" --seeds "$seeds" --only round_trip \
    --samples "$ROUND_TRIPS"
  rate=$(python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(r["round_trip_ms"]["samples"] / r["round_trip_seconds"])' \
    "$OUT_DIR/node-rtt-$run.json")
  phase "rust-atnode-$run" checks "$SDK_HOT" --seeds "$seeds" --seconds "$PACED_SECONDS" --pids "$pids" --no-leases \
    --rate "$rate" --keys 500
  phase "node-conc-$run" concurrent.checks node "$TS/dist/bench/bench.js" --seeds "$seeds" --only concurrent \
    --concurrency "$CONC" --seconds "$SECONDS_PER"
  paced_conc "rust-concatnode-$run" "$OUT_DIR/node-conc-$run.json"
  stop_nodes
done

python3 - "$OUT_DIR/results.jsonl" <<'PY' | tee "$OUT_DIR/summary.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(prefix, f):
    v = [f(r) for r in rows if r["label"].rsplit("-", 1)[0] == prefix]
    return statistics.median(v) if v else float("nan")
rust_cpu = med("rust-rtt", lambda r: r["server_cpu_us_per_check"])
print("sdk\tleased_checks_per_s\twithin_limit\tp50_us\tp99_us\tserver_cpu_us_per_check\tvs_rust\tconc_checks_per_s\tconc_server_cpu_us_per_check\tconc_vs_rust\trust_same_rate_cpu_us\tvs_rust_same_rate\trust_conc_same_rate_cpu_us\tconc_vs_rust_same_rate")
conc = {k: (med(f"{k}-conc", lambda r: r["result"]["checks_per_s"] if "checks_per_s" in r["result"] else r["result"]["concurrent"]["checks_per_s"]),
            med(f"{k}-conc", lambda r: r["server_cpu_us_per_check"])) for k in ("rust", "python", "node")}
within = lambda label, f: all(f(r) for r in rows if r["label"].startswith(label))
rows_out = [
    ("rust", med("rust-leased", lambda r: r["result"]["checks_per_s"]),
     within("rust-leased", lambda r: r["result"]["allowed"] <= r["result"]["limit"]),
     med("rust-rtt", lambda r: r["result"]["p50_ns"] / 1e3), med("rust-rtt", lambda r: r["result"]["p99_ns"] / 1e3),
     rust_cpu),
    ("python (named)", med("python-leased", lambda r: r["result"]["leased"]["checks_per_s"]),
     within("python-leased", lambda r: r["result"]["leased"]["admitted_within_limit"]),
     med("python-rtt", lambda r: r["result"]["round_trip"]["p50_ms"] * 1e3),
     med("python-rtt", lambda r: r["result"]["round_trip"]["p99_ms"] * 1e3),
     med("python-rtt", lambda r: r["server_cpu_us_per_check"])),
    ("python (inline)", med("python-inline", lambda r: r["result"]["leased"]["checks_per_s"]),
     within("python-inline", lambda r: r["result"]["leased"]["admitted_within_limit"]), float("nan"), float("nan"), float("nan")),
    ("node (tryCheck)", med("node-leased", lambda r: r["result"]["leased"]["try_check_per_s"]),
     within("node-leased", lambda r: r["result"]["leased"]["admitted_within_limit"]),
     med("node-rtt", lambda r: r["result"]["round_trip_ms"]["p50"] * 1e3),
     med("node-rtt", lambda r: r["result"]["round_trip_ms"]["p99"] * 1e3),
     med("node-rtt", lambda r: r["server_cpu_us_per_check"])),
    ("node (await check)", med("node-leased", lambda r: r["result"]["leased"]["await_check_per_s"]),
     within("node-leased", lambda r: r["result"]["leased"]["admitted_within_limit"]), float("nan"), float("nan"), float("nan")),
]
# The Rust SDK's CPU per check at each SDK's own one-at-a-time rate, on as many keys.
same_rate = {"python": med("rust-atpy", lambda r: r["server_cpu_us_per_check"]),
             "node": med("rust-atnode", lambda r: r["server_cpu_us_per_check"]), "rust": rust_cpu}
# The Rust SDK's CONC callers at each SDK's concurrent rate in all.
conc_same_rate = {"python": med("rust-concatpy", lambda r: r["server_cpu_us_per_check"]),
                  "node": med("rust-concatnode", lambda r: r["server_cpu_us_per_check"]), "rust": conc["rust"][1]}
for name, rate, ok, p50, p99, cpu in rows_out:
    c_rate, c_cpu = conc.get(name.split()[0], (float("nan"), float("nan"))) if "(" not in name or "named" in name or "tryCheck" in name else (float("nan"), float("nan"))
    base = same_rate[name.split()[0]]
    c_base = conc_same_rate[name.split()[0]]
    print(f"{name}\t{rate:.0f}\t{ok}\t{p50:.1f}\t{p99:.1f}\t{cpu:.2f}\t{cpu / rust_cpu:.2f}x\t{c_rate:.0f}\t{c_cpu:.2f}\t{c_cpu / conc['rust'][1]:.2f}x\t{base:.2f}\t{cpu / base:.2f}x\t{c_base:.2f}\t{c_cpu / c_base:.2f}x")
PY
