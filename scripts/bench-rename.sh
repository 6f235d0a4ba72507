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
# Both Envoys (one worker each) run side by side and every round measures
# every setup and load in turn, so drift on a shared machine hits all alike. Wherever `model` stands in the body, the rename
# scans the whole body (to refuse a second `model`) and moves its tail.
#
#   PROFILE=release scripts/build.sh
#   ROUNDS=3 DURATION=4 scripts/bench-rename.sh     # BIN_DIR=target/release
#
# Logs and configs go to .run/bench-rename/. Fails on any non-200 answer, any
# socket error, any request that skipped fleetroute, and when setup 3 renamed
# nothing (wasmcustom.fleetroute_filter.model_renamed).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-4}
ROUNDS=${ROUNDS:-3}
SWEEP_SIZES=${SWEEP_SIZES:-"1024 65536 1048576"}
run=.run/bench-rename
mkdir -p "$run"
rm -f "$run"/*.log "$run"/*.yaml "$run"/*.txt
bin=${BIN_DIR:-target/release}
wasm=$PWD/target/wasm32-wasip1/release/fleetroute_filter.wasm
lua=scripts/bench-proxy.lua

. scripts/lib/bench.sh
need_tools
need_files "$bin/fleetroute" "$bin/fleetroute-engine" "$wasm"

read -r -a ports < <(free_ports 11)
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

RUST_LOG=warn "$bin/fleetroute" serve --config "$run/router.yaml" \
  --grpc "127.0.0.1:$grpc" --admin "127.0.0.1:$admin" > "$run/fleetroute.log" 2>&1 &
pids+=($!)
wait_http "fleetroute" "http://127.0.0.1:$admin/ready"
declare -A epid url eadmin
for c in off on; do
  envoy -c "$run/$c.yaml" --concurrency 1 --disable-hot-restart --log-level warn > "$run/envoy-$c.log" 2>&1 &
  epid[$c]=$!
  pids+=($!)
done
eadmin[off]=$admin_off eadmin[on]=$admin_on
url[off]="http://127.0.0.1:$listen_off/v1/chat/completions"
url[on]="http://127.0.0.1:$listen_on/v1/chat/completions"
for c in off on; do wait_http "envoy ($c)" "http://127.0.0.1:${eadmin[$c]}/ready"; done

# Setups: Envoy, model asked for. Loads: connections and wrk's environment.
setups=("no rename filter|off|demo-model" "not renamed|on|demo-model" "renamed|on|renamed-model")
loads=("8 conn|8|" "streamed 32 tokens, 8 conn|8|STREAM=1 MAX_TOKENS=32")
for size in $SWEEP_SIZES; do loads+=("prompt $((size / 1024)) KB, 1 conn|1|PROMPT_BYTES=$size"); done

# One measurement: wrk against one setup, Envoy's CPU ticks around it.
declare -A requests ticks micros p50s
measure() { # KEY ENVOY MODEL CONNS ENV...
  local key=$1 c=$2 model=$3 conns=$4
  shift 4
  env MODEL="$model" "$@" wrk -t1 -c"$conns" -d1s -s "$lua" "${url[$c]}" > "$run/wrk-warmup.log" 2>&1
  local before after line
  before=$(cpu_ticks "${epid[$c]}")
  env MODEL="$model" "$@" wrk -t1 -c"$conns" -d"${DURATION}s" -s "$lua" "${url[$c]}" > "$run/wrk.log" 2>&1 \
    || { echo "$key: wrk failed" >&2; cat "$run/wrk.log" >&2; exit 1; }
  after=$(cpu_ticks "${epid[$c]}")
  line=$(bench_line "$key" "$run/wrk.log")
  local n us p50
  n=$(sed -E 's/.*requests=([0-9]+).*/\1/' <<< "$line")
  us=$(sed -E 's/.*duration_us=([0-9]+).*/\1/' <<< "$line")
  p50=$(sed -E 's/.*p50_us=([0-9]+).*/\1/' <<< "$line")
  requests[$key]=$(( ${requests[$key]:-0} + n ))
  ticks[$key]=$(( ${ticks[$key]:-0} + after - before ))
  micros[$key]=$(( ${micros[$key]:-0} + us ))
  p50s[$key]="${p50s[$key]:-} $p50"
}

# Rounds alternate every setup and load, so drift on a shared machine hits all alike.
for round in $(seq 1 "$ROUNDS"); do
  echo "==> round $round of $ROUNDS"
  for l in "${loads[@]}"; do
    IFS='|' read -r lname conns lenv <<< "$l"
    for st in "${setups[@]}"; do
      IFS='|' read -r sname c model <<< "$st"
      # shellcheck disable=SC2086
      measure "$sname|$lname" "$c" "$model" "$conns" $lenv
    done
  done
done

for c in off on; do
  curl -fsS "http://127.0.0.1:${eadmin[$c]}/stats" > "$run/stats-$c.txt"
  open=$(awk -F': ' '$1 ~ /ext_proc\.failure_mode_allowed$/ { n += $2 } END { print n + 0 }' "$run/stats-$c.txt")
  [ "$open" = 0 ] || { echo "$c: $open requests skipped fleetroute" >&2; exit 1; }
done
renamed=$(awk -F': ' '$1 == "wasmcustom.fleetroute_filter.model_renamed" { print $2 }' "$run/stats-on.txt")
untouched=$(awk -F': ' '$1 == "wasmcustom.fleetroute_filter.model_rename_untouched" { print $2 }' "$run/stats-on.txt")
[ "${renamed:-0}" -gt 0 ] || { echo "nothing was renamed" >&2; exit 1; }
[ "${untouched:-0}" = 0 ] || { echo "$untouched bodies left untouched" >&2; exit 1; }

echo
echo "Envoy CPU µs per request (user + system over all rounds / requests), requests/s over all rounds, median p50 of the rounds; ratio: CPU vs the same load without the rename filter."
echo "| load | setup | Envoy CPU µs/request | vs no rename filter | requests/s | p50 ms |"
echo "|---|---|---:|---:|---:|---:|"
hz=$(getconf CLK_TCK)
for l in "${loads[@]}"; do
  IFS='|' read -r lname _ _ <<< "$l"
  base=""
  for st in "${setups[@]}"; do
    IFS='|' read -r sname _ _ <<< "$st"
    key="$sname|$lname"
    python3 - "$lname" "$sname" "${requests[$key]}" "${ticks[$key]}" "${micros[$key]}" "${p50s[$key]}" "$hz" "$base" << 'PY'
import statistics, sys
load, setup, n, t, us, p50s, hz, base = sys.argv[1:]
n, t, us, hz = int(n), int(t), int(us), int(hz)
cpu = t / hz / n * 1e6
ratio = f"{cpu / float(base):.2f}" if base else "1.00"
p50 = statistics.median(int(x) for x in p50s.split()) / 1000
print(f"| {load} | {setup} | {cpu:.0f} | {ratio} | {n / (us / 1e6):.0f} | {p50:.2f} |")
PY
    if [ -z "$base" ]; then
      base=$(python3 -c "print(${ticks[$key]} / $hz / ${requests[$key]} * 1e6)")
    fi
  done
done
echo
echo "Rounds: $ROUNDS x ${DURATION}s per load and setup (1 s warm-up each); renamed bodies: $renamed."
echo "Machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); Envoy $(envoy --version | sed -nE 's|.*version: [0-9a-f]+/([0-9.]+)/.*|\1|p'); $(date -u '+%Y-%m-%d %H:%M UTC')"
