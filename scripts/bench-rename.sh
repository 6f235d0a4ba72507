#!/usr/bin/env bash
# What renaming the model per fleet costs Envoy, on loopback: Envoy's CPU per
# request, requests/s and p50/p99 of the full chain (`fleetroute bootstrap`,
# `fleetroute serve` deciding) in three setups, over the same engine replicas:
#   1. no rename filter  the chain without the rename root (fleetroute.rename)
#   2. not renamed       the shipped chain; the request's fleet serves the
#                        client's name, so the rename root only looks for its
#                        header (what every ordinary request pays)
#   3. renamed           the shipped chain; the fleet serves the model under
#                        its own name: the body is renamed on the way up and
#                        the answer's name on the way back
# Each setup is measured non-streamed (max_tokens 1) and streamed (32 token
# events, each carrying the model), then with prompts of 1 KB, 64 KB and 1 MB
# on one connection (the body rename scans and rewrites the whole body).
# Envoy runs with one worker. Wherever `model` stands in the body, the rename
# scans the whole body (to refuse a second `model`) and moves its tail.
#
#   PROFILE=release scripts/build.sh
#   DURATION=10 scripts/bench-rename.sh
#
# Logs and configs go to .run/bench-rename/. Fails on any non-200 answer, any
# socket error, any request that skipped fleetroute, and when setup 3 renamed
# nothing (wasmcustom.fleetroute_filter.model_renamed).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
SWEEP_SECONDS=${SWEEP_SECONDS:-6}
SWEEP_SIZES=${SWEEP_SIZES:-"1024 65536 1048576"}
WARMUP=3
run=.run/bench-rename
mkdir -p "$run"
rm -f "$run"/*.log "$run"/*.yaml "$run"/*.txt
bin=${BIN_DIR:-target/release}
wasm=$PWD/target/wasm32-wasip1/release/fleetroute_filter.wasm
lua=scripts/bench-proxy.lua

command -v envoy > /dev/null || scripts/setup.sh
command -v wrk > /dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
python3 -c 'import yaml' 2> /dev/null || { echo "python3 with PyYAML is required" >&2; exit 1; }
for f in "$bin/fleetroute" "$bin/fleetroute-engine" "$wasm"; do
  [ -e "$f" ] || { echo "$f is missing: run PROFILE=release scripts/build.sh first" >&2; exit 1; }
done

pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2> /dev/null || true; done
}
trap stop_all EXIT
trap 'exit 130' INT TERM
stop_pid() {
  kill "$1" 2> /dev/null || true
  wait "$1" 2> /dev/null || true
  local keep=() p
  for p in "${pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  pids=("${keep[@]}")
}
wait_http() {
  for _ in $(seq 1 150); do
    if curl -fs -o /dev/null "$2"; then return 0; fi
    sleep 0.2
  done
  echo "$1 did not come up at $2; see $run/*.log" >&2
  exit 1
}

read -r -a ports < <(python3 - << 'PY'
import socket
socks = [socket.socket() for _ in range(11)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
)
base1=${ports[0]} base2=${ports[1]} burst1=${ports[2]} burst2=${ports[3]}
control=${ports[4]} grpc=${ports[5]} admin=${ports[6]}
listen_off=${ports[7]} admin_off=${ports[8]} listen_on=${ports[9]} admin_on=${ports[10]}

cat > "$run/router.yaml" << YAML
fleets:
  - { name: base, region: us, endpoints: ["127.0.0.1:$base1", "127.0.0.1:$base2"] }
  - { name: burst, region: us, endpoints: ["127.0.0.1:$burst1", "127.0.0.1:$burst2"] }
stages:
  - { name: plain, models: [demo-model], fleets: [base] }
  - name: renamed
    models: [renamed-model]
    fleets: [{ name: burst, model: served/burst-model }]
YAML
"$bin/fleetroute" check-config "$run/router.yaml"

"$bin/fleetroute-engine" \
  --replica "base-1=127.0.0.1:$base1" --replica "base-2=127.0.0.1:$base2" \
  --replica "burst-1=127.0.0.1:$burst1" --replica "burst-2=127.0.0.1:$burst2" \
  --control "127.0.0.1:$control" --models demo-model \
  --served-model burst-1=served/burst-model --served-model burst-2=served/burst-model \
  --prefill-tokens-per-sec 1000000000 --decode-ms-per-token 0 --max-batch 256 \
  > "$run/engine.log" 2>&1 &
engine_pid=$!
pids+=($engine_pid)
wait_http "engine" "http://127.0.0.1:$control/replicas"

"$bin/fleetroute" bootstrap --config "$run/router.yaml" --wasm "$wasm" \
  --listen "127.0.0.1:$listen_on" --envoy-admin "127.0.0.1:$admin_on" \
  --grpc "127.0.0.1:$grpc" > "$run/on.yaml"
python3 - "$run/on.yaml" "$run/off.yaml" "$listen_off" "$admin_off" << 'PY'
import sys, yaml
src, dst, listen, admin = sys.argv[1:]
doc = yaml.safe_load(open(src))
doc["admin"]["address"]["socket_address"]["port_value"] = int(admin)
l = doc["static_resources"]["listeners"][0]
l["address"]["socket_address"]["port_value"] = int(listen)
hcm = l["filter_chains"][0]["filters"][0]["typed_config"]
before = len(hcm["http_filters"])
hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != "fleetroute.rename"]
assert len(hcm["http_filters"]) == before - 1, "no rename filter in the rendered chain"
yaml.safe_dump(doc, open(dst, "w"), sort_keys=False)
PY
for c in on off; do
  envoy --mode validate -c "$run/$c.yaml" --disable-hot-restart --log-level warn > "$run/validate-$c.log" 2>&1 \
    || { echo "envoy rejected $run/$c.yaml" >&2; cat "$run/validate-$c.log" >&2; exit 1; }
done

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# measure LABEL URL SECONDS CONNECTIONS ENVOY_PID [env...]: one line of figures.
measure() {
  local label=$1 url=$2 secs=$3 conns=$4 epid=$5
  shift 5
  env "$@" wrk -t1 -c"$conns" -d"${WARMUP}s" -s "$lua" "$url" > "$run/wrk-warmup.log" 2>&1
  local before after line
  before=$(cpu_ticks "$epid")
  env "$@" wrk -t1 -c"$conns" -d"${secs}s" -s "$lua" "$url" > "$run/wrk-$label.log" 2>&1 \
    || { echo "$label: wrk failed" >&2; cat "$run/wrk-$label.log" >&2; exit 1; }
  after=$(cpu_ticks "$epid")
  line=$(grep '^BENCH requests=' "$run/wrk-$label.log")
  for key in non200 connect read write timeout; do
    n=$(sed -E "s/.* $key=([0-9]+).*/\1/" <<< "$line")
    [ "$n" = 0 ] || { echo "$label: $n requests failed ($key)" >&2; grep '^BENCH first' "$run/wrk-$label.log" >&2 || true; exit 1; }
  done
  python3 - "$label" "$line" "$before" "$after" "$(getconf CLK_TCK)" << 'PY'
import sys
label, line, b, a, hz = sys.argv[1:]
v = dict(kv.split("=") for kv in line.split()[1:] if "=" in kv)
n, us = int(v["requests"]), int(v["duration_us"])
cpu = (int(a) - int(b)) / int(hz) / n * 1e6
print(f"| {label} | {n / (us / 1e6):.0f} | {int(v['p50_us']) / 1000:.2f} | {int(v['p99_us']) / 1000:.2f} | {cpu:.0f} |")
PY
}

rows=()
renamed_total=0
for setup in off on; do
  RUST_LOG=warn "$bin/fleetroute" serve --config "$run/router.yaml" \
    --grpc "127.0.0.1:$grpc" --admin "127.0.0.1:$admin" > "$run/fleetroute-$setup.log" 2>&1 &
  fr=$!
  pids+=($fr)
  wait_http "fleetroute" "http://127.0.0.1:$admin/ready"
  listen=$([ $setup = on ] && echo "$listen_on" || echo "$listen_off")
  eadmin=$([ $setup = on ] && echo "$admin_on" || echo "$admin_off")
  envoy -c "$run/$setup.yaml" --concurrency 1 --disable-hot-restart --log-level warn > "$run/envoy-$setup.log" 2>&1 &
  ep=$!
  pids+=($ep)
  wait_http "envoy ($setup)" "http://127.0.0.1:$eadmin/ready"
  url="http://127.0.0.1:$listen/v1/chat/completions"
  if [ $setup = off ]; then
    kinds=("no rename filter:demo-model")
  else
    kinds=("not renamed:demo-model" "renamed:renamed-model")
  fi
  for k in "${kinds[@]}"; do
    name=${k%%:*} model=${k#*:}
    rows+=("$(measure "$name, 8 conn" "$url" "$DURATION" 8 "$ep" MODEL="$model")")
    rows+=("$(measure "$name, streamed 32 tokens, 8 conn" "$url" "$DURATION" 8 "$ep" MODEL="$model" STREAM=1 MAX_TOKENS=32)")
    for size in $SWEEP_SIZES; do
      rows+=("$(measure "$name, prompt $((size / 1024)) KB, 1 conn" "$url" "$SWEEP_SECONDS" 1 "$ep" MODEL="$model" PROMPT_BYTES="$size")")
    done
    printf '%s\n' "${rows[@]: -5}"
  done
  curl -fsS "http://127.0.0.1:$eadmin/stats" > "$run/stats-$setup.txt"
  open=$(awk -F': ' '$1 ~ /ext_proc\.failure_mode_allowed$/ { n += $2 } END { print n + 0 }' "$run/stats-$setup.txt")
  [ "$open" = 0 ] || { echo "$setup: $open requests skipped fleetroute" >&2; exit 1; }
  r=$(awk -F': ' '$1 == "wasmcustom.fleetroute_filter.model_renamed" { print $2 }' "$run/stats-$setup.txt")
  u=$(awk -F': ' '$1 == "wasmcustom.fleetroute_filter.model_rename_untouched" { print $2 }' "$run/stats-$setup.txt")
  renamed_total=$((renamed_total + ${r:-0}))
  [ "${u:-0}" = 0 ] || { echo "$setup: $u bodies left untouched" >&2; exit 1; }
  stop_pid "$ep"
  stop_pid "$fr"
done
[ "$renamed_total" -gt 0 ] || { echo "nothing was renamed" >&2; exit 1; }

echo
echo "| setup | requests/s | p50 ms | p99 ms | Envoy CPU µs/request |"
echo "|---|---:|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
echo
echo "Renamed bodies: $renamed_total. Machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); Envoy $(envoy --version | sed -nE 's|.*version: [0-9a-f]+/([0-9.]+)/.*|\1|p'); $(date -u '+%Y-%m-%d %H:%M UTC')"
