#!/usr/bin/env bash
# What TLS costs the server: CPU per check with and without `--tls-cert`, on keep-alive connections
# and with a new connection (so a new handshake) per check, and the handshake alone:
#
#   bench/tls.sh                          # one round, 10 s per load, this checkout's release build
#   DURATION=5 RUNS=3 KEY_TYPE=rsa bench/tls.sh
#
# One node (no seeds), started fresh for each mode (plain, then --tls-cert with a certificate of
# a CA this script makes with openssl: the commands are the README's). Loads, each after an
# unmeasured warm-up:
#   keepalive   wrk -t$WRK_THREADS -c$CONNS, bench/wrk/check.lua (one random-key inline check a
#               request) on kept-alive HTTP/1.1 connections (wrk offers no ALPN): the check loop's
#               path, plus TLS's record encryption and decryption
#   newconn     the same with `Connection: close` on every request (CONNECTION_CLOSE=1): a new
#               TCP connection per check, and over https a full TLS handshake (wrk's OpenSSL
#               resumes no session); the request goes to hyper's path (the check loop takes no
#               `Connection: close`), the same in both modes
#   handshake   (TLS only) `openssl s_time -new` for $DURATION s: back-to-back full handshakes,
#               each with one `GET /healthz` (HTTP/1.0): the node's CPU per connection
# The server's utime+stime (/proc/PID/stat, CLK_TCK ticks: 10 ms here) is read right before and
# after each load; checks are counted by the node (every ringlimit_checks_total series of
# /metrics, before and after). Figures (stdout table, medians over RUNS rounds):
#   per_s            checks (connections for `handshake`) answered per second
#   server_us        server CPU time (user + system, all threads) per check (per connection)
#   vs_plain         server_us / the plain mode's on the same load: what TLS multiplies it by
# and, under the table, `tls_cost_us`: TLS's own share per check on keep-alive connections
# (keepalive tls - keepalive plain) and per handshake (newconn tls - newconn plain, s_time's
# figure beside it).
#
# Env:
#   BIN            the node binary (default: this checkout's release build, built first unless
#                  SKIP_BUILD=1; bench/lib.sh)
#   DURATION       seconds per measured load (default 10); WARMUP: unmeasured seconds before each
#                  (default 2, 0 to skip)
#   RUNS           rounds of every load (default 1)
#   WRK_THREADS    wrk threads (default 1); CONNS: wrk connections (default 8; newconn uses them
#                  too, each reconnecting after every check)
#   HTTP_THREADS   the node's --http-threads (default 1)
#   KEY_TYPE       ec (P-256, default) or rsa (2048): the server certificate's key, which sets
#                  the handshake's signature cost
#   KEYSPACE, CHECK_LIMIT, CHECK_PERIOD_MS   passed to check.lua (default 100000, 1000000, 1000:
#                  every check admitted)
#   BASE_PORT      the node's ports (bench/lib.sh's table); OUT_DIR: raw outputs (default
#                  bench/out/tls-<timestamp>)
# Everything runs on 127.0.0.1.
set -euo pipefail

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
DURATION="${DURATION:-10}"
WARMUP="${WARMUP:-2}"
RUNS="${RUNS:-1}"
WRK_THREADS="${WRK_THREADS:-1}"
CONNS="${CONNS:-8}"
HTTP_THREADS="${HTTP_THREADS:-1}"
KEY_TYPE="${KEY_TYPE:-ec}"
export KEYSPACE="${KEYSPACE:-100000}"
export CHECK_LIMIT="${CHECK_LIMIT:-1000000}"
export CHECK_PERIOD_MS="${CHECK_PERIOD_MS:-1000}"
PORT=$(http_port 0)
HZ="$(getconf CLK_TCK)"

for v in DURATION RUNS WRK_THREADS CONNS HTTP_THREADS; do
  [[ "${!v}" =~ ^[0-9]+$ && "${!v}" -gt 0 ]] || die "$v must be a positive integer"
done
[[ "$WARMUP" =~ ^[0-9]+$ ]] || die "WARMUP must be a whole number of seconds"
[[ "$KEY_TYPE" == ec || "$KEY_TYPE" == rsa ]] || die "KEY_TYPE must be ec or rsa"
need wrk curl openssl
build_node

# ---------------------------------------------------------------- certificates
# A CA and a server certificate for localhost and 127.0.0.1, as README.md shows.
CERTS="$OUT_DIR/certs"
mkdir -p "$CERTS"
new_key() { # the -newkey arguments for KEY_TYPE
  if [[ $KEY_TYPE == ec ]]; then echo "ec -pkeyopt ec_paramgen_curve:P-256"; else echo "rsa:2048"; fi
}
# shellcheck disable=SC2046 # new_key's words, split on purpose
(
  cd "$CERTS"
  openssl req -x509 -newkey $(new_key) -nodes -days 30 -subj "/CN=ringlimit bench CA" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -keyout ca.key -out ca.crt
  openssl req -newkey $(new_key) -nodes -subj "/CN=bench-0" -keyout node.key -out node.csr
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' >node.ext
  openssl x509 -req -in node.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
    -extfile node.ext -out node.crt
) >"$OUT_DIR/openssl.log" 2>&1 || { cat "$OUT_DIR/openssl.log" >&2; die "openssl could not make the certificates"; }
log "raw outputs in $OUT_DIR; $RUNS round(s) of ${DURATION}s loads (+${WARMUP}s warm-up), $KEY_TYPE key, wrk -t$WRK_THREADS -c$CONNS, --http-threads $HTTP_THREADS"

# ---------------------------------------------------------------- the node
SCHEME=http
CURL_TLS=()
start_node() { # MODE: plain or tls
  local mode=$1 flags=(--http-threads "$HTTP_THREADS")
  SCHEME=http CURL_TLS=()
  if [[ $mode == tls ]]; then
    flags+=(--tls-cert "$CERTS/node.crt" --tls-key "$CERTS/node.key")
    SCHEME=https CURL_TLS=(--cacert "$CERTS/ca.crt")
  fi
  ports_free "$PORT" "$(peer_port 0)"
  env RUST_LOG=warn "$BIN" serve --node-id bench-0 --http "127.0.0.1:$PORT" \
    --peer "127.0.0.1:$(peer_port 0)" "${flags[@]}" 2>"$OUT_DIR/node-$mode.log" &
  PIDS+=($!)
  local deadline=$((SECONDS + 20))
  until curl -sf --max-time 1 "${CURL_TLS[@]}" "$SCHEME://127.0.0.1:$PORT/readyz" >/dev/null; do
    kill -0 "${PIDS[0]}" 2>/dev/null || { tail -20 "$OUT_DIR/node-$mode.log" >&2; die "the node exited at start"; }
    [[ $SECONDS -lt $deadline ]] || die "the node was not ready within 20 s"
    sleep 0.1
  done
}
metric_checks() { # every ringlimit_checks_total series, summed
  curl -sf --max-time 5 "${CURL_TLS[@]}" "$SCHEME://127.0.0.1:$PORT/metrics" |
    awk '/^ringlimit_checks_total[{ ]/ { s += $NF } END { printf "%.0f\n", s }'
}
node_ticks() { pid_ticks "${PIDS[0]}"; }

# ---------------------------------------------------------------- loads
printf 'round\tload\tmode\tcount\tsecs\tper_s\tserver_ticks\tserver_us\terrors\n' >"$OUT_DIR/runs.tsv"

record() { # ROUND LOAD MODE COUNT SECS TICKS ERRORS
  local line
  line=$(awk -v r="$1" -v l="$2" -v m="$3" -v c="$4" -v s="$5" -v t="$6" -v hz="$HZ" -v e="$7" 'BEGIN {
    printf "%s\t%s\t%s\t%d\t%.2f\t%.0f\t%d\t%.2f\t%d\n", r, l, m, c, s, (s > 0 ? c / s : 0), t, (c > 0 ? t * 1e6 / hz / c : 0), e }')
  printf '%s\n' "$line" >>"$OUT_DIR/runs.tsv"
  log "  $(awk -F'\t' '{ printf "%s %s: %s in %ss, %s/s, %s ticks, %s us each, %s errors", $2, $3, $4, $5, $6, $7, $8, $9 }' <<<"$line")"
}

run_wrk() { # SECONDS OUTFILE
  local rc=0
  job timeout --kill-after=5 $(($1 + 30)) wrk -t"$WRK_THREADS" -c"$CONNS" -d"$1s" \
    -s "$BENCH_DIR/wrk/check.lua" "$SCHEME://127.0.0.1:$PORT" >"$2" 2>&1 || rc=$?
  [[ $rc -eq 0 ]] || { cat "$2" >&2; die "wrk failed ($rc), output in $2"; }
}

wrk_load() { # ROUND LOAD MODE (CONNECTION_CLOSE exported by the caller)
  local tag="r$1-$2-$3" c0 c1 t0 t1 secs errors
  ((WARMUP == 0)) || run_wrk "$WARMUP" "$OUT_DIR/wrk-$tag-warmup.txt"
  c0=$(metric_checks) t0=$(node_ticks)
  run_wrk "$DURATION" "$OUT_DIR/wrk-$tag.txt"
  t1=$(node_ticks) c1=$(metric_checks)
  secs=$(awk '/ requests in / { v = $4; sub(/,$/, "", v); sub(/s$/, "", v); print v }' "$OUT_DIR/wrk-$tag.txt")
  errors=$(grep -oE '(other=[0-9]+|Socket errors:.*)' "$OUT_DIR/wrk-$tag.txt" |
    grep -oE '[0-9]+' | awk '{ s += $1 } END { print s + 0 }')
  record "$1" "$2" "$3" $((c1 - c0)) "${secs:-$DURATION}" $((t1 - t0)) "$errors"
}

s_time_load() { # ROUND: full handshakes, each with GET /healthz
  local out="$OUT_DIR/s_time-r$1.txt" t0 t1 w0 w1 conns rc=0
  t0=$(node_ticks) w0=$(date +%s.%N)
  job timeout --kill-after=5 $((DURATION + 30)) openssl s_time -connect "127.0.0.1:$PORT" -new \
    -time "$DURATION" -www /healthz -CAfile "$CERTS/ca.crt" >"$out" 2>&1 || rc=$?
  t1=$(node_ticks) w1=$(date +%s.%N)
  [[ $rc -eq 0 ]] || { cat "$out" >&2; die "openssl s_time failed ($rc)"; }
  # "1234 connections in 5 real seconds, ..." (its other line's seconds are its own CPU's)
  conns=$(awk '/connections in .* real seconds/ { print $1; exit }' "$out")
  record "$1" handshake tls "${conns:-0}" "$(awk -v a="$w0" -v b="$w1" 'BEGIN { print b - a }')" \
    $((t1 - t0)) 0
}

for ((round = 1; round <= RUNS; round++)); do
  for mode in plain tls; do
    log "round $round/$RUNS: $mode"
    start_node "$mode"
    export CONNECTION_CLOSE=0
    wrk_load "$round" keepalive "$mode"
    export CONNECTION_CLOSE=1
    wrk_load "$round" newconn "$mode"
    [[ $mode == plain ]] || s_time_load "$round"
    stop_nodes
  done
done

# ---------------------------------------------------------------- summary
awk -F'\t' '
  function median(s,   a, n, t, i, j) {
    n = split(s, a, " ")
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  NR > 1 { k = $2 " " $3; if (!(k in us)) order[++n] = k; rate[k] = rate[k] " " $6; us[k] = us[k] " " $8 }
  END {
    printf "%-10s %-6s %10s %11s %9s\n", "load", "mode", "per_s", "server_us", "vs_plain"
    for (i = 1; i <= n; i++) {
      split(order[i], kb, " "); u = median(us[order[i]]); p = us[kb[1] " plain"]
      printf "%-10s %-6s %10.0f %11.2f %9s\n", kb[1], kb[2], median(rate[order[i]]), u, (p != "" && median(p) > 0 ? sprintf("%.2f", u / median(p)) : "-")
    }
    ka = median(us["keepalive tls"]) - median(us["keepalive plain"])
    nc = median(us["newconn tls"]) - median(us["newconn plain"])
    printf "tls_cost_us: %.2f per check on a kept-alive connection; %.1f per new connection (handshake, newconn tls - plain); s_time: %.1f per handshake with its GET\n", ka, nc, median(us["handshake tls"])
  }' "$OUT_DIR/runs.tsv" | tee "$OUT_DIR/summary.txt"
log "done: $OUT_DIR"
