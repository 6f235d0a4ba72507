#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and property tests, and the
# end-to-end scenarios through real Envoy. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
# llama.cpp's server for tests/tests/real_llamacpp.rs (built once, about 6
# minutes on 2 cores).
scripts/setup-llamacpp.sh
# vLLM on CPU for tests/tests/real_vllm.rs: a virtualenv outside the
# checkout, made once (about 3 minutes and 6 GB), seconds after.
FLEETROUTE_VLLM_VENV=$(scripts/setup-vllm.sh)
export FLEETROUTE_VLLM_VENV

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> clippy (native, all targets)"
cargo clippy --workspace --all-targets --features fleetroute-tests/e2e -- -D warnings
echo "==> clippy (the filter as Wasm)"
cargo clippy -p fleetroute-filter --target wasm32-wasip1 -- -D warnings
echo "==> build"
scripts/build.sh
echo "==> tests"
# End-to-end scenarios each start their own Envoy, ext-proc and engines on
# free loopback ports; two at a time keeps a 2-core machine responsive.
# Here a test that needs redis-server fails without it instead of skipping.
# `--features fleetroute-tests/e2e`: the end-to-end layer too (plain
# `cargo test` runs the unit, property and in-process layers only).
FLEETROUTE_REQUIRE_REDIS=1 cargo test --workspace --features fleetroute-tests/e2e \
  -- --test-threads "${TEST_THREADS:-2}"
