#!/usr/bin/env bash
# Routing quality against the routers operators deploy, over real HTTP.
#
# For each workload, load and key mode, and for each router in turn, starts a
# FRESH fleet of 8 simulated replicas (fleetroute-engine: prefix cache of
# CACHE_TOKENS, one prefill lane, batch of 32; the replay's latency model,
# 10,000 prompt tokens/s and 20 ms per output token, both sped up by COMPRESS,
# as the arrivals are), puts the router in front and replays the trace
# open-loop with streaming (tests/src/bin/fleetroute-bench-http.rs):
#   direct      round robin done by the client itself, no proxy
#   sglang-rr   sglang-router, policy round_robin
#   sglang-ca   sglang-router, policy cache_aware
#   vllm-ca     vllm-router, policy cache_aware
#   fleetroute  real Envoy + the Wasm filter + fleetroute (fleetroute bootstrap)
#   fleetroute-nofb  the same without the first-byte report (Envoy's
#               allow_mode_override removed): prefill shares end at their
#               estimate; not in the default list
#
#   scripts/bench-routers.sh            # full: 3 workloads x 1, 1.5, 2, 4x, both key modes
#   scripts/bench-routers.sh --quick    # short: 150 requests, 1x and 4x, content only
#
# Environment: REQUESTS (600), RATES ("1 1.5 2 4"), WORKLOADS ("mooncake chat
# agent"), ROUTERS (all five), KEYS ("content cachekey"), COMPRESS (4),
# CACHE_TOKENS (500000), SKIP_BUILD=1, BIN_DIR (target/release), BASE_PORT
# (18000; two runs at once need different ones), OUT (target/bench-routers),
# SHARE_FACTOR (1.1: fleetroute's new-conversation share bound; 0 = off),
# SHARE_FLOOR, SHARE_WAIT (share_wait_tokens) (fleetroute's defaults unless set).
# Results: one JSON line per run in $OUT/results.jsonl and a table on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

REQUESTS=${REQUESTS:-600}
RATES=${RATES:-"1 1.5 2 4"}
WORKLOADS=${WORKLOADS:-"mooncake chat agent"}
ROUTERS=${ROUTERS:-"direct sglang-rr sglang-ca vllm-ca fleetroute"}
KEYS=${KEYS:-"content cachekey"}
if [ "${1:-}" = "--quick" ]; then
  REQUESTS=${QUICK_REQUESTS:-150}
  RATES=${QUICK_RATES:-"1 4"}
  KEYS=content
fi
COMPRESS=${COMPRESS:-4}
CACHE_TOKENS=${CACHE_TOKENS:-500000}
BASE_PORT=${BASE_PORT:-18000}
SGLANG_ROUTER_VERSION=0.3.2
VLLM_ROUTER_VERSION=0.1.17
# Each run is bounded: the client gives up on a first token after 60 s of
# trace time, and the whole run after RUN_TIMEOUT seconds.
RUN_TIMEOUT=${RUN_TIMEOUT:-600}

out=${OUT:-target/bench-routers}
mkdir -p "$out"
results=$out/results.jsonl
: > "$results"

if [ -z "${SKIP_BUILD:-}" ]; then
  echo "==> building (release)" >&2
  PROFILE=release scripts/build.sh >&2
fi
bin=${BIN_DIR:-target/release}
wasm=$PWD/target/wasm32-wasip1/release/fleetroute_filter.wasm

# Peers, pinned, in a virtual environment under target/.
venv=target/bench-venv
have_sglang=1 have_vllm=1
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
"$venv/bin/pip" install -q "sglang-router==$SGLANG_ROUTER_VERSION" >&2 \
  || { echo "sglang-router $SGLANG_ROUTER_VERSION could not be installed; its rows are skipped" >&2; have_sglang=0; }
"$venv/bin/pip" install -q "vllm-router==$VLLM_ROUTER_VERSION" >&2 \
  || { echo "vllm-router $VLLM_ROUTER_VERSION could not be installed; its rows are skipped" >&2; have_vllm=0; }

ctl=$((BASE_PORT + 100))
router_port=$BASE_PORT
envoy_admin=$((BASE_PORT + 901))
grpc=$((BASE_PORT + 51))
fr_admin=$((BASE_PORT + 190))
prom=$((BASE_PORT + 290))
eps=() urls=()
for i in $(seq 1 8); do
  eps+=("127.0.0.1:$((BASE_PORT + 100 + i))")
  urls+=("http://127.0.0.1:$((BASE_PORT + 100 + i))")
done
for port in $ctl $router_port $envoy_admin $grpc $fr_admin $prom "${eps[@]##*:}"; do
  if (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    echo "port $port is already in use on 127.0.0.1 (set BASE_PORT)" >&2
    exit 1
  fi
done

pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap stop_all EXIT
trap 'exit 130' INT TERM

wait_for() { # what url
  for _ in $(seq 1 150); do
    if curl -fs -o /dev/null "$2"; then return 0; fi
    sleep 0.2
  done
  echo "$1 did not come up at $2; logs in $out/" >&2
  return 1
}
wait_closed() { # port: a stopped process releases its port before the next run
  for _ in $(seq 1 50); do
    (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null || return 0
    sleep 0.2
  done
}

start_engines() {
  local args=()
  for i in $(seq 1 8); do args+=(--replica "r$i=${eps[$((i - 1))]}"); done
  "$bin/fleetroute-engine" "${args[@]}" --control "127.0.0.1:$ctl" \
    --cache-tokens "$CACHE_TOKENS" --max-batch 32 \
    --prefill-tokens-per-sec "$(awk "BEGIN { print 10000 * $COMPRESS }")" \
    --decode-ms-per-token "$(awk "BEGIN { print 20 / $COMPRESS }")" \
    --default-max-tokens 16 > "$out/engine.log" 2>&1 &
  pids+=($!)
  wait_for engines "http://127.0.0.1:$ctl/replicas"
}

fleetroute_config() {
  local list
  list=$(printf '"%s", ' "${eps[@]}")
  cat <<YAML
fleets:
  - name: pool
    region: local
    endpoints: [${list%, }]
    capacity: { max_inflight: 32, kv_cache_tokens: $CACHE_TOKENS }
stages:
  - name: trace
    models: [trace]
    fleets: [pool]
    # Conversations here open with shared system prompts: balance where
    # new ones start (docs/concepts/routing.md).
    replica_choice: { share_factor: ${SHARE_FACTOR:-1.1}${SHARE_FLOOR:+, share_floor: $SHARE_FLOOR}${SHARE_WAIT:+, share_wait_tokens: $SHARE_WAIT} }
YAML
}

# Starts one router; sets `target` to the base URL(s) the client sends to.
start_router() {
  case $1 in
    direct)
      target=$(IFS=,; echo "${urls[*]}")
      ;;
    sglang-rr | sglang-ca)
      local policy=round_robin
      [ "$1" = sglang-ca ] && policy=cache_aware
      "$venv/bin/sglang-router" launch --host 127.0.0.1 --port "$router_port" \
        --worker-urls "${urls[@]}" --policy "$policy" \
        --prometheus-host 127.0.0.1 --prometheus-port "$prom" \
        --log-level warn > "$out/$1.log" 2>&1 &
      pids+=($!)
      wait_for "$1" "http://127.0.0.1:$router_port/health"
      target="http://127.0.0.1:$router_port"
      ;;
    vllm-ca)
      "$venv/bin/vllm-router" --host 127.0.0.1 --port "$router_port" \
        --worker-urls "${urls[@]}" --policy cache_aware \
        --prometheus-host 127.0.0.1 --prometheus-port "$prom" \
        --log-level warning > "$out/$1.log" 2>&1 &
      pids+=($!)
      wait_for "$1" "http://127.0.0.1:$router_port/health"
      target="http://127.0.0.1:$router_port"
      ;;
    fleetroute | fleetroute-nofb)
      fleetroute_config > "$out/router.yaml"
      "$bin/fleetroute" check-config "$out/router.yaml" >&2
      "$bin/fleetroute" bootstrap --config "$out/router.yaml" --wasm "$wasm" \
        --listen "127.0.0.1:$router_port" --envoy-admin "127.0.0.1:$envoy_admin" \
        --grpc "127.0.0.1:$grpc" > "$out/envoy.yaml"
      if [ "$1" = fleetroute-nofb ]; then
        # Drop the override and the list of modes it may ask for.
        python3 - "$out/envoy.yaml" "$out/envoy-nofb.yaml" <<'PY'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
found = 0
def strip(node):
    global found
    if isinstance(node, dict):
        if node.pop("allow_mode_override", None):
            node.pop("allowed_override_modes", None)
            found += 1
        for v in node.values():
            strip(v)
    elif isinstance(node, list):
        for v in node:
            strip(v)
strip(doc)
if found != 1:
    sys.exit(f"fleetroute-nofb: {found} allow_mode_override in the config, want 1")
yaml.safe_dump(doc, open(sys.argv[2], "w"), sort_keys=False)
PY
        mv "$out/envoy-nofb.yaml" "$out/envoy.yaml"
      fi
      "$bin/fleetroute" serve --config "$out/router.yaml" --grpc "127.0.0.1:$grpc" \
        --admin "127.0.0.1:$fr_admin" --envoy-admin "127.0.0.1:$envoy_admin" \
        > "$out/fleetroute.log" 2>&1 &
      pids+=($!)
      # Envoy asks fleetroute for the fleets' members (EDS): start it after.
      wait_for fleetroute "http://127.0.0.1:$fr_admin/ready"
      envoy -c "$out/envoy.yaml" --concurrency 1 --log-level warn \
        --base-id "$BASE_PORT" > "$out/envoy.log" 2>&1 &
      pids+=($!)
      wait_for envoy "http://127.0.0.1:$envoy_admin/ready"
      target="http://127.0.0.1:$router_port"
      ;;
  esac
}

trace_of() {
  case $1 in
    mooncake) echo tests/traces/mooncake_synthetic.jsonl ;;
    *)
      "$bin/fleetroute-workload" "$1" --seed 1 --requests 4000 > "$out/$1.jsonl"
      echo "$out/$1.jsonl"
      ;;
  esac
}

for w in $WORKLOADS; do
  trace=$(trace_of "$w")
  for rate in $RATES; do
    for k in $KEYS; do
      flag=()
      [ "$k" = cachekey ] && flag=(--prompt-cache-key)
      for r in $ROUTERS; do
        case $r in sglang-*) [ $have_sglang = 1 ] || continue ;; vllm-*) [ $have_vllm = 1 ] || continue ;; esac
        # A router that reads no key gets the content-only run once.
        if [ "$k" = cachekey ] && [ "${r%-nofb}" != fleetroute ]; then continue; fi
        echo "==> $w ${rate}x $k $r" >&2
        start_engines
        start_router "$r"
        timeout "$RUN_TIMEOUT" "$bin/fleetroute-bench-http" "$trace" --target "$target" \
          --control "http://127.0.0.1:$ctl" --requests "$REQUESTS" --rate "$rate" \
          --compress "$COMPRESS" --label "$w ${rate}x $k $r" "${flag[@]}" | tee -a "$results" >&2 \
          || echo "run $w ${rate}x $k $r failed or timed out" >&2
        # fleetroute's newest decisions (what picked each replica), for diagnosis.
        if [ "${r%-nofb}" = fleetroute ]; then
          curl -fs "http://127.0.0.1:$fr_admin/debug/decisions?limit=4096" \
            > "$out/decisions-$w-${rate}x-$k-$r.json" || true
          curl -fs "http://127.0.0.1:$fr_admin/metrics" \
            > "$out/metrics-$w-${rate}x-$k-$r.txt" || true
        fi
        stop_all
        for p in $router_port $ctl "${eps[@]##*:}"; do wait_closed "$p"; done
      done
    done
  done
done

# The table: hit rate as a share of the trace's infinite-cache bound, TTFT in
# trace time (wall clock x COMPRESS).
python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| workload | load | keys | router | hit/bound | TTFT p50 ms | p90 ms | p99 ms | max/mean req | failed | timed out |")
print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    w, load, keys, router = r["label"].split(" ")
    print(f"| {w} | {load} | {keys} | {router} | {r['hit_of_bound']:.3f} | {r['ttft_p50_ms']:.0f} | "
          f"{r['ttft_p90_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {r['max_mean_requests']:.2f} | {r['failed']} | {r['timed_out']} |")
PY
