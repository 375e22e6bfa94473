#!/usr/bin/env bash
# Envoy's Rate Limit Quota Service (RLQS): 3 release nodes on loopback, each serving
# StreamRateLimitQuotas on a gRPC port of its own, one rule of LIMIT per second shared by 10
# simulated Envoys (tests/python/rlqs_envoys.py: Envoy's rate_limit_quota filter, a stream each,
# Envoy i on node i mod 3) whose demand is twice the limit, Envoy 0 with 80% of it. Two runs of
# DURATION s, each on a fresh cluster:
#   skewed   Envoys 0 and 1 swap demands at CHANGE_AT s (30): how long until Envoy 1 is assigned
#            at least half way to its new fair share.
#   owner    the node that owns the rule's bucket is SIGKILLed at KILL_AT s (20): the aggregate
#            after it, and how long the killed node's Envoys went without a new assignment.
# Prints a Markdown table (bench/rlqs.py): admitted ÷ (limit × time) (target: within ±5%), the
# quiet Envoys' worst ratio of admitted to demand (whole run and worst second), the change's
# latency, and the kill's figures. Raw lines in OUT_DIR/*.jsonl, node logs beside them.
#
#   bench/rlqs.sh
#   DURATION=30 CHANGE_AT=15 KILL_AT=10 LIMIT=200 BIN=target/debug/ringlimit bench/rlqs.sh
#   ARRIVALS=poisson QUIRKS=1 CHECK=1 bench/rlqs.sh
#   MODE=probe bench/rlqs.sh
#
# MODE=probe instead: what one client can make a node hold, each probe on a fresh single node
# (bench/rlqs_probe.py, a real grpcio client): junk (one stream, REPORTS (200) reports each adding
# a bucket {name: api, tenant: t1, junk: <JUNK_BYTES (1 MiB)>}, then an ordinary bucket) and fill
# (FILL_STREAMS (10) streams of FILL_BUCKETS (10,000) buckets). A table: the node's RSS before,
# after and at its peak, its CPU, ringlimit_rlqs_bytes and _buckets, what was refused, and what
# came back (answers, bytes, the largest message). BIN=<an older build> for the same on it.
#
# LIMIT (requests/s, default 1000), DURATION (60), CHANGE_AT (30), KILL_AT (20), ARRIVALS
# (even | poisson: the simulator's arrivals, seeded), QUIRKS=1 (the simulator does what Envoy's
# client does beyond the protocol: whole-second TTLs and fill intervals, ...), CHECK=1 (exit 1
# when admitted is off by more than 5% or a quiet Envoy got under 90%), PYTHON (default the
# venv .ci/run makes, made here when missing), BIN, SKIP_BUILD=1, BASE_PORT (default 28600;
# node i: HTTP BASE_PORT+i, peer BASE_PORT+50+i, gRPC BASE_PORT+90+i), OUT_DIR.
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
LIMIT="${LIMIT:-1000}"
DURATION="${DURATION:-60}"
CHANGE_AT="${CHANGE_AT:-30}"
KILL_AT="${KILL_AT:-20}"
ARRIVALS="${ARRIVALS:-even}"
PYTHON="${PYTHON:-/tmp/ringlimit-grpc-venv/bin/python}"
SIM="$REPO/tests/python/rlqs_envoys.py"
export RINGLIMIT_ADMIN_TOKEN="bench-admin-token"
need curl python3
if ! "$PYTHON" -c "import grpc, envoy_data_plane" 2>/dev/null; then
  [ "$PYTHON" = /tmp/ringlimit-grpc-venv/bin/python ] ||
    die "$PYTHON cannot import grpc and envoy_data_plane"
  log "making the Python venv at /tmp/ringlimit-grpc-venv (grpcio, envoy-data-plane)"
  python3 -m venv /tmp/ringlimit-grpc-venv
  /tmp/ringlimit-grpc-venv/bin/pip install -q "envoy-data-plane==2.2.0" "grpcio>=1.51"
fi
build_node

cat >"$OUT_DIR/rules.yaml" <<EOF
rules:
  - { name: api_per_tenant, limit: $LIMIT, period: 1s, algorithm: token_bucket }
EOF
cat >"$OUT_DIR/rlqs.yaml" <<'EOF'
domains:
  - domain: edge
    buckets:
      - bucket: { name: api, tenant: "*" }
        rule: api_per_tenant
        key: "{tenant}"
EOF

GRPC_ADDRS="127.0.0.1:$(aux_port 0),127.0.0.1:$(aux_port 1),127.0.0.1:$(aux_port 2)"

if [ "${MODE:-runs}" = probe ]; then
  probe_addr="127.0.0.1:$(aux_port 0)"
  # A metric of node 0 (the sum of its series), "-" when it has none.
  node_metric() {
    curl -sf "http://127.0.0.1:$(http_port 0)/metrics" |
      awk -v m="$1" '$1 == m || index($1, m "{") == 1 {s += $2; n++} END {print n ? s : "-"}'
  }
  mb() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
  table="$OUT_DIR/probe.md"
  {
    echo "| probe | RSS before (MB) | RSS after (MB) | peak RSS (MB) | node CPU (s) | ringlimit_rlqs_bytes | ringlimit_rlqs_buckets | refused buckets | answers (messages, MB, largest MB) | the client saw |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"
  } >"$table"
  for probe in ${PROBES:-junk fill}; do
    ports_free "$(aux_port 0)"
    start_nodes 1 "$probe" --config "$OUT_DIR/rules.yaml" --rlqs-config "$OUT_DIR/rlqs.yaml" \
      --grpc "$probe_addr"
    rss0=$(proc_kb VmRSS)
    cpu0=$(nodes_cpu)
    if [ "$probe" = junk ]; then
      args=(junk --reports "${REPORTS:-200}" --junk-bytes "${JUNK_BYTES:-1048576}")
    else
      args=(fill --streams "${FILL_STREAMS:-10}" --buckets "${FILL_BUCKETS:-10000}")
    fi
    # The node sampled while the probe's streams are open (they hold what they made it keep).
    rm -f "$OUT_DIR/$probe.ready"
    ${GEN_WRAP:-} "$PYTHON" "$BENCH_DIR/rlqs_probe.py" "$probe_addr" --hold 3 \
      --ready "$OUT_DIR/$probe.ready" "${args[@]}" >"$OUT_DIR/$probe.json" &
    HELPERS+=($!)
    deadline=$((SECONDS + 600))
    until [ -e "$OUT_DIR/$probe.ready" ]; do
      kill -0 "${HELPERS[-1]}" 2>/dev/null || die "the $probe probe exited early"
      [ $SECONDS -lt $deadline ] || die "the $probe probe did not finish in 600 s"
      sleep 0.2
    done
    held=$(node_metric ringlimit_rlqs_bytes) buckets=$(node_metric ringlimit_rlqs_buckets)
    wait "${HELPERS[-1]}" || die "the $probe probe failed"
    HELPERS=()
    rss1=$(proc_kb VmRSS)
    hwm=$(proc_kb VmHWM)
    cpu=$(awk -v a="$cpu0" -v b="$(nodes_cpu)" 'BEGIN { printf "%.2f", (b - a) / 100 }')
    refused=$(node_metric ringlimit_rlqs_refused_buckets_total)
    python3 - "$OUT_DIR/$probe.json" "$probe" "$(mb "$rss0")" "$(mb "$rss1")" "$(mb "$hwm")" \
      "$cpu" "$held" "$buckets" "$refused" <<'PY'
import json, sys
path, probe, rss0, rss1, hwm, cpu, held, buckets, refused = sys.argv[1:]
r = json.load(open(path))
answers = (f"{r['answers']}, {r['answer_bytes'] / 2**20:.2f}, "
           f"{r['largest_answer_bytes'] / 2**20:.2f}")
if probe == "junk":
    label = f"junk: {r['reports']} reports, {r['sent_bytes'] / 2**20:.0f} MiB of ids"
    saw = (f"{r['abandons']} abandons, {r['assignments']} assignments; ordinary bucket "
           f"{'assigned' if r['ordinary_bucket_assigned'] else 'NOT assigned'}; end {r['end']}")
else:
    label = f"fill: {r['streams']} streams x {r['buckets']} buckets"
    saw = f"{r['abandons']} abandons, {r['assignments']} assignments; ends {r['ends']}"
print(f"| {label} | {rss0} | {rss1} | {hwm} | {cpu} | {held} | {buckets} | {refused} "
      f"| {answers} | {saw} |")
PY
    stop_nodes
  done >>"$table"
  cat "$table"
  exit 0
fi


# cluster LABEL: three nodes bench-0..2 with the rules, RLQS and a gRPC port each; returns once
# each is ready and sees all three in its ring.
cluster() {
  local seeds="127.0.0.1:$(peer_port 0),127.0.0.1:$(peer_port 1),127.0.0.1:$(peer_port 2)" i
  for i in 0 1 2; do
    ports_free "$(http_port $i)" "$(peer_port $i)" "$(aux_port $i)"
    # shellcheck disable=SC2086 # a command prefix, split on purpose
    ${NODE_WRAP:-} env RUST_LOG=warn "$BIN" serve --node-id "bench-$i" \
      --config "$OUT_DIR/rules.yaml" --rlqs-config "$OUT_DIR/rlqs.yaml" --grpc "127.0.0.1:$(aux_port $i)" \
      --http "127.0.0.1:$(http_port $i)" --peer "127.0.0.1:$(peer_port $i)" --seeds "$seeds" \
      2>"$OUT_DIR/node-$1-$i.log" &
    PIDS+=($!)
  done
  for i in 0 1 2; do
    wait_ready "http://127.0.0.1:$(http_port $i)/readyz" "${PIDS[$i]}" "$OUT_DIR/node-$1-$i.log" \
      "node $i ($1)"
  done
  local deadline=$((SECONDS + 20))
  for i in 0 1 2; do
    until curl -sf "http://127.0.0.1:$(http_port $i)/v1/cluster" | grep -q '"ring_members":3'; do
      [ $SECONDS -lt $deadline ] || die "cluster ($1) did not form"
      sleep 0.1
    done
  done
}

# envoys OUT [ARGS...]: the simulator in the background (in HELPERS); SIM_PID is its pid.
envoys() {
  local out=$1
  shift
  # shellcheck disable=SC2086 # a command prefix, split on purpose
  ${GEN_WRAP:-} "$PYTHON" "$SIM" "$GRPC_ADDRS" --envoys 10 \
    --bucket '{"name":"api","tenant":"acme"}' --demand $((2 * LIMIT)) --skew 0.8 --duration "$DURATION" --limit-rate "$LIMIT" \
    --arrivals "$ARRIVALS" ${QUIRKS:+--envoy-quirks} "$@" >"$out" 2>"${out%.jsonl}.err" &
  SIM_PID=$!
  HELPERS+=("$SIM_PID")
}

# finish: waits for the simulator; its status (0, or 2/3 on a protocol error) is in the table.
finish() {
  local rc=0
  wait "$SIM_PID" || rc=$?
  HELPERS=()
  [ "$rc" -le 3 ] || die "the simulator failed ($rc): $(tail -5 "${1%.jsonl}.err")"
}

log "run 1: skewed demand, swapped at ${CHANGE_AT} s of ${DURATION} s (limit $LIMIT/s)"
cluster skewed
envoys "$OUT_DIR/skewed.jsonl" --change-at "$CHANGE_AT"
finish "$OUT_DIR/skewed.jsonl"
stop_nodes

log "run 2: the owner of the bucket SIGKILLed at ${KILL_AT} s of ${DURATION} s"
cluster owner
owner=$(curl -sf -H "authorization: Bearer $RINGLIMIT_ADMIN_TOKEN" \
  "http://127.0.0.1:$(http_port 0)/v1/admin/keys/acme?rule=api_per_tenant" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["owner"])')
victim=${owner#bench-}
[[ "$victim" =~ ^[0-2]$ ]] || die "owner $owner is not one of bench-0..2"
envoys "$OUT_DIR/owner.jsonl"
# t=0 is the simulator's "start" line (its wall clock); the kill is timed from it.
for _ in $(seq 100); do
  grep -q '"event":"start"' "$OUT_DIR/owner.jsonl" 2>/dev/null && break
  sleep 0.1
done
start=$(head -1 "$OUT_DIR/owner.jsonl" | python3 -c 'import json, sys; print(json.load(sys.stdin)["wall"])')
sleep "$(awk -v s="$start" -v at="$KILL_AT" -v now="$EPOCHREALTIME" \
  'BEGIN { d = s + at - now; print (d > 0 ? d : 0) }')"
kill -KILL "${PIDS[$victim]}"
killed=$EPOCHREALTIME
{ wait "${PIDS[$victim]}"; } 2>/dev/null || true # reaped here: no "Killed" notice
log "killed $owner (pid ${PIDS[$victim]}) at $(awk -v k="$killed" -v s="$start" \
  'BEGIN { printf "%.2f", k - s }') s of the run"
finish "$OUT_DIR/owner.jsonl"
stop_nodes

python3 "$BENCH_DIR/rlqs.py" ${CHECK:+--check} \
  --run "skewed, demands swapped at ${CHANGE_AT} s=$OUT_DIR/skewed.jsonl" \
  --kill-run "owner ($owner) SIGKILLed at ${KILL_AT} s=$OUT_DIR/owner.jsonl" \
  --killed "$killed" --victim "$victim" | tee "$OUT_DIR/table.md"
