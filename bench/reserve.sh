#!/usr/bin/env bash
# Reservations for LLM tokens on a 3-node release cluster: PAIRS reserve / settle pairs with random
# actual costs (some above, some below the estimate) against a tokens-per-minute rule, each reserved
# through one node and settled through the next; then EXPIRING reservations with a short ttl_ms
# never settled.
#
#   bench/reserve.sh                      # 10,000 pairs over 20 keys, 200 expiring
#   PAIRS=2000 bench/reserve.sh           # a shorter run
#
# Reported, from the client's side and the nodes' /metrics:
#   admitted   per key, the tokens its reservations came to (the actual cost of each settled
#              one) against the rule's limit: never over the limit by more than the debt a
#              key can run into, the largest single overshoot times the settles in flight at
#              once (THREADS: a bucket in debt denies every later reserve)
#   debt       ringlimit_reservation_debt_tokens summed over the nodes when the load ends
#   count      each key's window as the nodes count it (limit - remaining) against the client's
#              sum: equal while nothing is owed (owed tokens are counted once repaid)
#   expiry     EXPIRING reservations (ttl_ms TTL_MS) left unsettled: once their ttl has passed,
#              ringlimit_reservations is back to 0 on every node, the expired count rose by as
#              many, and settling one of them is 404 unknown_reservation
# The load stays inside one minute of the sliding window (it waits for the next minute when
# fewer than 40 s are left), on keys of its own, so the limit is each key's whole allowance.
#
# Env: PAIRS (10000), KEYS (20), LIMIT (tokens per minute per key, 400000), THREADS (8),
# EXPIRING (200), TTL_MS (1000), BIN (bench/lib.sh).
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PAIRS="${PAIRS:-10000}"
KEYS="${KEYS:-20}"
LIMIT="${LIMIT:-400000}"
THREADS="${THREADS:-8}"
EXPIRING="${EXPIRING:-200}"
TTL_MS="${TTL_MS:-1000}"
need curl python3
build_node

RULES="$OUT_DIR/rules.yaml"
cat >"$RULES" <<RULES_EOF
rules:
  - name: llm-tokens
    limit: $LIMIT
    period: 1m
    algorithm: sliding_window
RULES_EOF

start_nodes 3 reserve --config "$RULES"
PORTS="$(http_port 0),$(http_port 1),$(http_port 2)"
log "load: $PAIRS pairs over $KEYS keys, $THREADS threads"
job python3 "$BENCH_DIR/reserve_load.py" "$PORTS" "$PAIRS" "$KEYS" "$LIMIT" "$THREADS" \
  "$EXPIRING" "$TTL_MS" "$$" | tee "$OUT_DIR/report.txt"
