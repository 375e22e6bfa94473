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
# shellcheck source=bench/node.sh
source "$BENCH_DIR/node.sh"
cleanup() {
  node_stop
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

buckets() { curl -sf "http://127.0.0.1:$PORT/metrics" | awk '$1 == "ringlimit_buckets" {print $2}'; }

printf '%-28s %4s %10s %10s %12s %12s %12s\n' binary run buckets empty_MB "B/bkt_filled" "B/bkt_settled" "peak/settled"
for run in $(seq 1 "$RUNS"); do
  for bin in $BINS; do
    node_start "$bin" --max-keys "$KEYS"
    empty=$(node_kb VmRSS)
    node_fill "$KEYS" k "\"limit\":100,\"period_ms\":60000,\"algorithm\":\"$ALGO\""
    filled=$(node_kb VmRSS)
    sleep "$SETTLE"
    settled=$(node_kb VmRSS)
    hwm=$(node_kb VmHWM)
    n=$(buckets)
    node_stop
    awk -v b="$bin" -v r="$run" -v n="$n" -v e="$empty" -v f="$filled" -v s="$settled" -v h="$hwm" 'BEGIN {
      printf "%-28s %4d %10d %10.1f %12.1f %12.1f %12.2f\n", substr(b, length(b) - 27), r, n, e / 1000,
        (f - e) * 1024 / n, (s - e) * 1024 / n, (h - e) / (s - e) }'
  done
done
