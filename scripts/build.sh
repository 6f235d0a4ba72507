#!/usr/bin/env bash
# Builds the Wasm filter and the binaries. PROFILE=release for benchmarks and
# the demo; the default (dev) is what the tests use.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${PROFILE:-dev}
cargo build --release -p fleetroute-filter --target wasm32-wasip1
cargo build --profile "$profile" -p fleetroute -p fleetroute-tests --bins
