#!/usr/bin/env bash
# Durable buckets: how long a node takes to restore N buckets from --data-dir (default 1M).
#
#   bench/persist.sh                       # release build, 1,000,000 buckets
#   N=200000 BIN=target/debug/ringlimit bench/persist.sh
#
# Starts a node with --data-dir and --max-keys N, spends one token of N distinct keys of a daily
# inline rule through /v1/check/batch (1,000 a request), waits until
# ringlimit_persist_buckets_written_total reaches N, stops it (SIGTERM), starts it again on the same directory and prints what it
# reports: ringlimit_persist_restore_seconds, ringlimit_persist_restored_buckets, the files' size
# (ringlimit_persist_disk_bytes) and bytes per bucket. Needs curl and python3.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
N=${N:-1000000}
BIN=${BIN:-$top/target/release/ringlimit}
if [ ! -x "$BIN" ]; then
  (cd "$top" && cargo build --release -p ringlimit-node --bin ringlimit)
fi
dir=$(mktemp -d)
log=$(mktemp)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir" "$log"' EXIT

start() {
  : >"$log"
  "$BIN" serve --node-id persist-bench --http 127.0.0.1:0 --peer 127.0.0.1:0 \
    --data-dir "$dir" --max-keys "$N" 2>"$log" &
  pid=$!
  for _ in $(seq 1 600); do
    addr=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -o 'http=127\.0\.0\.1:[0-9]*' | head -1 | cut -d= -f2) || true
    if [ -n "${addr:-}" ] && curl -sf "http://$addr/readyz" >/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  echo "the node did not become ready; its log:" >&2
  cat "$log" >&2
  exit 1
}

metric() {
  curl -s "http://$addr/metrics" | awk -v m="$1" '$1 == m { print $2 }'
}

start
echo "filling $N buckets through $addr"
python3 - "$addr" "$N" <<'PY'
import json, sys, urllib.request
addr, n = sys.argv[1], int(sys.argv[2])
for start in range(0, n, 1000):
    checks = [{"key": f"k{i}", "limit": 1, "period_ms": 86_400_000} for i in range(start, min(n, start + 1000))]
    req = urllib.request.Request(f"http://{addr}/v1/check/batch", data=json.dumps({"checks": checks}).encode(),
                                 headers={"content-type": "application/json"})
    urllib.request.urlopen(req).read()
PY
for _ in $(seq 1 600); do
  written=$(metric ringlimit_persist_buckets_written_total)
  [ "${written%.*}" -ge "$N" ] && break
  sleep 0.1
done
echo "on disk: $(metric ringlimit_persist_buckets) buckets, $(metric ringlimit_persist_disk_bytes) bytes"
kill -TERM "$pid"
wait "$pid" || true
pid=""
start
secs=$(metric ringlimit_persist_restore_seconds)
restored=$(metric ringlimit_persist_restored_buckets)
bytes=$(metric ringlimit_persist_disk_bytes)
echo "restored $restored buckets in $secs s; files $bytes bytes ($(python3 -c "print(round($bytes / max(1, $restored)))") bytes per bucket)"
