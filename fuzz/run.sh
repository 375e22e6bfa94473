#!/usr/bin/env bash
# Longer runs of the fuzz targets in tests/tests/fuzz.rs (proptest-driven: cargo-fuzz needs a
# nightly toolchain). `cargo test` runs each target 256 cases; this runs CASES each, release.
#
#   fuzz/run.sh                         # 100,000 cases a target
#   CASES=1000000 fuzz/run.sh fuzz_peer_frame_decoder
#
# Targets: fuzz_peer_frame_decoder, fuzz_peer_stream, fuzz_handshake, fuzz_gossip_datagram,
# fuzz_rules_file, fuzz_envoy_files, fuzz_http_check_bodies, fuzz_http_wire (and the alias-bomb
# regression).
# A failure prints the minimal input proptest shrank it to.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PROPTEST_CASES="${CASES:-100000}"
cd "$REPO"
start=$SECONDS
cargo test --release -p ringlimit-tests --test it -- --test-threads 2 fuzz:: "$@"
echo "fuzz/run.sh: $PROPTEST_CASES cases a target in $((SECONDS - start)) s (build included)"
