# shellcheck shell=bash
# Shared by the single-node benchmarks (bench/bucket_bytes.sh, bench/memory.sh): one release
# node on 127.0.0.1 started, waited for, filled, measured and stopped. Source it after setting
# WORK (a temporary directory: the node's stderr goes to $WORK/node.log), PORT (HTTP; PORT+1 is
# the peer port) and optionally HTTP_THREADS (default 2, also its tokio workers) and EXTRA_ENV
# (e.g. "MIMALLOC_PURGE_DELAY=0"). The caller's EXIT trap should call node_stop.

NODE_PID=""

# node_start BIN [serve flags...]: returns once GET /readyz answers (exits after 20 s).
node_start() {
  local bin="$1"
  shift
  # shellcheck disable=SC2086  # EXTRA_ENV is a list of NAME=VALUE words
  env ${EXTRA_ENV:-} TOKIO_WORKER_THREADS="${HTTP_THREADS:-2}" RUST_LOG=warn "$bin" serve \
    --node-id mem --http "127.0.0.1:$PORT" --peer "127.0.0.1:$((PORT + 1))" \
    --http-threads "${HTTP_THREADS:-2}" "$@" 2>"$WORK/node.log" &
  NODE_PID=$!
  local deadline=$((SECONDS + 20))
  until curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null; do
    if [ $SECONDS -ge $deadline ]; then
      echo "node did not become ready" >&2
      cat "$WORK/node.log" >&2
      exit 1
    fi
    sleep 0.1
  done
}

node_stop() {
  if [ -n "$NODE_PID" ]; then
    kill "$NODE_PID" 2>/dev/null || true
    wait "$NODE_PID" 2>/dev/null || true
  fi
  NODE_PID=""
}

# node_kb FIELD: a /proc/PID/status figure of the node in kB (VmRSS, VmHWM).
node_kb() { awk -v f="$1" '$1 == f":" {print $2}' "/proc/$NODE_PID/status"; }

# node_fill COUNT PREFIX CHECK_JSON_TAIL: COUNT checks of distinct keys PREFIX0 ..
# PREFIX(COUNT-1) through POST /v1/check/batch, 1000 a request; exits on any error answer.
node_fill() {
  python3 - "$PORT" "$1" "$2" "$3" <<'PY'
import http.client, sys
port, count, prefix, tail = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
for start in range(0, count, 1000):
    n = min(1000, count - start)
    items = ",".join('{"key":"%s%d",%s}' % (prefix, start + i, tail) for i in range(n))
    conn.request("POST", "/v1/check/batch", '{"checks":[%s]}' % items,
                 {"content-type": "application/json"})
    r = conn.getresponse()
    body = r.read()
    if r.status != 200 or b'"error"' in body:
        sys.exit("batch at %d: %d %s" % (start, r.status, body[:200]))
PY
}
