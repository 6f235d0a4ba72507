#!/usr/bin/env bash
# Soak benchmark: N requests (default 1,000,000) through the full chain —
# real Envoy with the Wasm filter, fleetroute, simulated engines answering at
# once — on loopback ports, each request with its own sampling key, tenant,
# model and prompt. Reports Envoy's, fleetroute's and the engine's resident
# memory (/proc/<pid>/status) at 0, 10, 25, 50, 75 and 100% of the run and
# the prefix index's size against its bound. Fails if any request did not
# get a 200, if any skipped fleetroute (ext_proc failing open) or if the
# index passed its bound.
#
#   PROFILE=release scripts/build.sh
#   scripts/soak.sh                     # 1,000,000 requests, 16 connections
#   scripts/soak.sh 100000 --concurrency 8 --prompt-bytes 8192
#
# The chain is whatever `fleetroute bootstrap` renders, started by the test
# harness. Output also goes to .run/soak/.
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-1000000}
shift || true
bin=target/release
for f in "$bin/fleetroute-soak" "$bin/fleetroute" "$bin/fleetroute-engine" \
  target/wasm32-wasip1/release/fleetroute_filter.wasm; do
  [ -e "$f" ] || { echo "$f is missing: run PROFILE=release scripts/build.sh first" >&2; exit 1; }
done
command -v envoy > /dev/null || { echo "envoy is not on PATH (scripts/setup.sh installs it)" >&2; exit 1; }
mkdir -p .run/soak
out=.run/soak/soak-$requests.txt
cpu_model=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
echo "Machine: $(nproc) CPUs, $(uname -m), ${cpu_model:-unknown CPU}; Envoy $(envoy --version | sed -nE 's|.*version: [0-9a-f]+/([0-9.]+)/.*|\1|p'); $(date -u '+%Y-%m-%d %H:%M UTC')" | tee "$out"
"$bin/fleetroute-soak" --requests "$requests" "$@" | tee -a "$out"
