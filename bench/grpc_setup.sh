# shellcheck shell=bash
# gRPC load shared by bench/grpc.sh and bench/slowconns.sh (PROTO=grpc): source it after
# bench/lib.sh with GRPC_PORT set. Writes $OUT_DIR/rules.yaml and $OUT_DIR/envoy/ (limits high
# enough that every call is admitted) and the request bodies rls1.bin, rls3.bin, v1.bin; defines
# grpc_flags, path_of, grpc_probe and h2_load.
need h2load=nghttp2-client

cat >"$OUT_DIR/rules.yaml" <<'YAML'
rules:
  - { name: bench, limit: 1000000000, period: 1h }
YAML
mkdir -p "$OUT_DIR/envoy"
cat >"$OUT_DIR/envoy/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: remote_address
    rate_limit: { unit: hour, requests_per_unit: 1000000000 }
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 1000000000 }
  - key: path
    rate_limit: { unit: hour, requests_per_unit: 1000000000 }
YAML

# The request bodies: gRPC frames (flag 0, big-endian length, protobuf). Protobuf written by
# hand here (a few length-delimited fields) so that the script needs nothing but python3.
python3 - "$OUT_DIR" <<'PY'
import sys
out = sys.argv[1]
def varint(n):
    b = bytearray()
    while True:
        if n < 0x80:
            b.append(n); return bytes(b)
        b.append(n & 0x7F | 0x80); n >>= 7
def field(num, payload):
    payload = payload.encode() if isinstance(payload, str) else payload
    return varint(num << 3 | 2) + varint(len(payload)) + payload
def frame(msg):
    return b"\x00" + len(msg).to_bytes(4, "big") + msg
def descriptor(k, v):  # RateLimitDescriptor{entries: [Entry{key, value}]}
    return field(1, field(1, k) + field(2, v))
def rls(descriptors):  # RateLimitRequest{domain, descriptors}
    return field(1, "bench") + b"".join(field(2, descriptor(k, v)) for k, v in descriptors)
d3 = [("remote_address", "10.0.0.1"), ("user", "u1"), ("path", "/api")]
open(f"{out}/rls1.bin", "wb").write(frame(rls(d3[:1])))
open(f"{out}/rls3.bin", "wb").write(frame(rls(d3)))
# ringlimit.v1 CheckRequest{key = 1, rule = 2}
open(f"{out}/v1.bin", "wb").write(frame(field(1, "u1") + field(2, "bench")))
PY

# The node flags that serve these.
grpc_flags() { echo --config "$OUT_DIR/rules.yaml" --grpc "127.0.0.1:$GRPC_PORT" --envoy-config "$OUT_DIR/envoy"; }

RLS=/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
V1=/ringlimit.v1.RateLimiter/Check
path_of() { case $1 in rls1 | rls3) echo "$RLS" ;; v1) echo "$V1" ;; esac; }

# Each body must be answered with grpc-status 0 (h2load counts HTTP statuses only).
grpc_probe() {
  local b
  for b in rls1 rls3 v1; do
    curl -sS --http2-prior-knowledge -o /dev/null -D - -H 'content-type: application/grpc' \
      -H 'te: trailers' --data-binary "@$OUT_DIR/$b.bin" "http://127.0.0.1:$GRPC_PORT$(path_of $b)" \
      >"$OUT_DIR/probe-$b.txt" 2>&1 || true
    grep -qi '^grpc-status: 0' "$OUT_DIR/probe-$b.txt" || {
      log "$b: no grpc-status 0 (see $OUT_DIR/probe-$b.txt)"
      exit 1
    }
  done
}

# h2load over H2_CONNS connections of STREAMS/H2_CONNS streams each for DURATION s; with RPS,
# each connection sends RPS calls a second (h2load --rps) instead of as fast as answered.
# h2_load MODE LABEL -> "calls_per_s p50_ms p99_ms" (from h2load's per-request log).
h2_load() {
  local mode=$1 label=$2 rate=()
  [ -n "${RPS:-}" ] && rate=(--rps "$RPS")
  # shellcheck disable=SC2086 # a command prefix, split on purpose
  timeout --kill-after=5 $((DURATION + 30)) ${GEN_WRAP:-} h2load -t2 -c"$H2_CONNS" -m$((STREAMS / H2_CONNS)) \
    "${rate[@]}" -D "$DURATION" -H 'content-type: application/grpc' -H 'te: trailers' \
    -d "$OUT_DIR/$mode.bin" --log-file="$OUT_DIR/$label.log" \
    "http://127.0.0.1:$GRPC_PORT$(path_of "$mode")" >"$OUT_DIR/$label.txt" 2>&1
  python3 - "$OUT_DIR/$label.log" "$DURATION" <<'PY'
import sys
rows = [l.split("\t") for l in open(sys.argv[1]) if l.strip()]
ok = sorted(int(r[2]) for r in rows if r[1] == "200")
bad = len(rows) - len(ok)
if bad:
    print(f"{bad} non-200 answers", file=sys.stderr)
pct = lambda p: ok[min(len(ok) - 1, int(p * len(ok)))] / 1000
print(f"{len(ok) / float(sys.argv[2]):.0f} {pct(0.5):.3f} {pct(0.99):.3f}")
PY
}
