#!/usr/bin/env bash
# Resident bytes per live bucket, measured as a user would (issue 17): RSS of a release node
# after KEYS distinct keys through POST /v1/check/batch, minus its RSS when empty, divided by
# the buckets it holds (`ringlimit_buckets`). Reports the figure right after filling, after
# SETTLE seconds, and the peak (VmHWM) while filling, for each binary given, side by side:
#
#   bench/bucket_bytes.sh                       # this checkout's release build
#   BINS="/tmp/rl-before target/release/ringlimit" bench/bucket_bytes.sh
#
# Env: KEYS (default 1000000; --max-keys is the same), ALGO (token_bucket|fixed_window|
# sliding_window|leaky_bucket; default token_bucket), SETTLE (default 5), RUNS (default 1),
# PORT (default 38280), HTTP_THREADS (default 2), EXTRA_ENV (e.g. "MIMALLOC_PURGE_DELAY=0"),
# SKIP_BUILD=1.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$BENCH_DIR/.." && pwd)"
KEYS="${KEYS:-1000000}"
ALGO="${ALGO:-token_bucket}"
SETTLE="${SETTLE:-5}"
RUNS="${RUNS:-1}"
PORT="${PORT:-38280}"
HTTP_THREADS="${HTTP_THREADS:-2}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
if [ -z "${BINS:-}" ]; then
  if [ "${SKIP_BUILD:-0}" != 1 ]; then
    cargo build --release -q -p ringlimit-node --bin ringlimit --manifest-path "$REPO/Cargo.toml"
  fi
  BINS="$CARGO_TARGET_DIR/release/ringlimit"
fi
WORK="$(mktemp -d)"
PID=""
cleanup() {
  if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

start() { # BIN MAX_KEYS
  env ${EXTRA_ENV:-} TOKIO_WORKER_THREADS="$HTTP_THREADS" RUST_LOG=warn "$1" serve --node-id mem \
    --http "127.0.0.1:$PORT" --peer "127.0.0.1:$((PORT + 1))" --http-threads "$HTTP_THREADS" \
    --max-keys "$2" 2>"$WORK/node.log" &
  PID=$!
  local deadline=$((SECONDS + 20))
  until curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null; do
    [ $SECONDS -lt $deadline ] || { echo "node did not become ready" >&2; cat "$WORK/node.log" >&2; exit 1; }
    sleep 0.1
  done
}
stop() { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; PID=""; }
kb() { awk -v f="$1" '$1 == f":" {print $2}' "/proc/$PID/status"; }
buckets() { curl -sf "http://127.0.0.1:$PORT/metrics" | awk '$1 == "ringlimit_buckets" {print $2}'; }

fill() { # COUNT
  python3 - "$PORT" "$1" "$ALGO" <<'PY'
import http.client, sys
port, count, algo = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
tail = '"limit":100,"period_ms":60000,"algorithm":"%s"' % algo
for start in range(0, count, 1000):
    n = min(1000, count - start)
    items = ",".join('{"key":"k%d",%s}' % (start + i, tail) for i in range(n))
    conn.request("POST", "/v1/check/batch", '{"checks":[%s]}' % items,
                 {"content-type": "application/json"})
    r = conn.getresponse()
    body = r.read()
    if r.status != 200 or b'"error"' in body:
        sys.exit("batch at %d: %d %s" % (start, r.status, body[:200]))
PY
}

printf '%-28s %4s %10s %10s %12s %12s %12s\n' binary run buckets empty_MB "B/bkt_filled" "B/bkt_settled" "peak/settled"
for run in $(seq 1 "$RUNS"); do
  for bin in $BINS; do
    start "$bin" "$KEYS"
    empty=$(kb VmRSS)
    fill "$KEYS"
    filled=$(kb VmRSS)
    sleep "$SETTLE"
    settled=$(kb VmRSS)
    hwm=$(kb VmHWM)
    n=$(buckets)
    stop
    awk -v b="$bin" -v r="$run" -v n="$n" -v e="$empty" -v f="$filled" -v s="$settled" -v h="$hwm" 'BEGIN {
      printf "%-28s %4d %10d %10.1f %12.1f %12.1f %12.2f\n", substr(b, length(b) - 27), r, n, e / 1000,
        (f - e) * 1024 / n, (s - e) * 1024 / n, (h - e) / (s - e) }'
  done
done
