#!/usr/bin/env bash
# Compares two builds of the Wasm filter in one run: Envoy (one worker) with
# only the filter in front of two simulated replicas, the same load as
# scripts/bench-proxy.sh's "Envoy + Wasm filter" setup, alternating A and B for
# a few rounds so that drift on a shared machine hits both alike.
#
#   PROFILE=release scripts/build.sh
#   scripts/bench-filter-ab.sh OLD.wasm NEW.wasm     # ROUNDS=3 DURATION=10
#
# The plugin configuration is the template's minus fields the older build may
# not know, so both builds parse the same bodies under the same limits.
# Fails on any non-200 answer or socket error.
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -eq 2 ] || { echo "usage: $0 A.wasm B.wasm" >&2; exit 2; }
wasm_a=$(realpath "$1")
wasm_b=$(realpath "$2")
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
WARMUP=3
lua=scripts/bench-proxy.lua
engine=${BIN_DIR:-target/release}/fleetroute-engine
run=.run/bench-filter-ab
mkdir -p "$run"
. scripts/lib/bench.sh
need_tools
need_files "$engine"

read -r r1 r2 control listen admin < <(free_ports 5)

"$engine" --replica "a=127.0.0.1:$r1" --replica "b=127.0.0.1:$r2" \
  --control "127.0.0.1:$control" --models demo-model \
  --prefill-tokens-per-sec 1000000000 --decode-ms-per-token 0 --max-batch 256 \
  > "$run/engine.log" 2>&1 &
pids+=($!)
wait_http engine "http://127.0.0.1:$control/replicas"

# config WASM OUT: Envoy with the template's Wasm filter block and body limit.
config() {
  python3 - envoy-config/envoy.yaml "$1" "$2" "$listen" "$admin" "$r1" "$r2" << 'PY'
import json, sys, yaml
tpl, wasm, out, listen, admin, r1, r2 = sys.argv[1:]
doc = yaml.safe_load(open(tpl))
hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
f = [f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.wasm"][0]
cfg = f["typed_config"]["config"]
cfg["vm_config"]["code"]["local"]["filename"] = wasm
plugin = json.loads(cfg["configuration"]["value"])
plugin.pop("max_buffered_bytes_per_worker", None)
cfg["configuration"]["value"] = json.dumps(plugin)
limit = hcm["route_config"]["virtual_hosts"][0]["request_body_buffer_limit"]
eps = [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": int(p)}}}} for p in (r1, r2)]
out_doc = {
  "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": int(admin)}}},
  "static_resources": {
    "listeners": [{"name": "inference",
      "address": {"socket_address": {"address": "127.0.0.1", "port_value": int(listen)}},
      "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
          "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
          "stat_prefix": "inference",
          "route_config": {"name": "r", "virtual_hosts": [{"name": "v", "domains": ["*"],
            "request_body_buffer_limit": limit,
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "base", "timeout": "600s"}}]}]},
          "http_filters": [f, {"name": "envoy.filters.http.router", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}],
    "clusters": [{"name": "base", "type": "STATIC", "connect_timeout": "1s", "lb_policy": "ROUND_ROBIN",
      "load_assignment": {"cluster_name": "base", "endpoints": [{"lb_endpoints": eps}]}}]}}
yaml.safe_dump(out_doc, open(out, "w"), sort_keys=False)
PY
}
config "$wasm_a" "$run/a.yaml"
config "$wasm_b" "$run/b.yaml"

# measure NAME: one Envoy, warm-up, then DURATION seconds; prints requests/s.
measure() {
  envoy -c "$run/$1.yaml" --concurrency 1 --disable-hot-restart --log-level warn > "$run/envoy-$1.log" 2>&1 &
  local pid=$!
  pids+=($pid)
  wait_http envoy "http://127.0.0.1:$admin/ready"
  local url="http://127.0.0.1:$listen/v1/chat/completions"
  wrk -t2 -c8 -d"${WARMUP}s" -s "$lua" "$url" > /dev/null 2>&1
  wrk -t2 -c8 -d"${DURATION}s" -s "$lua" "$url" > "$run/wrk-$1.log" 2>&1
  local line
  line=$(bench_line "$1" "$run/wrk-$1.log")
  stop_pid "$pid"
  awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
         printf "%.0f\n", v["requests"] / (v["duration_us"] / 1e6) }' <<< "$line"
}

sum_a=0 sum_b=0
for round in $(seq 1 "$ROUNDS"); do
  a=$(measure a)
  b=$(measure b)
  echo "round $round: A $a req/s, B $b req/s"
  sum_a=$((sum_a + a))
  sum_b=$((sum_b + b))
done
echo "A: $wasm_a"
echo "B: $wasm_b"
awk -v a="$sum_a" -v b="$sum_b" -v n="$ROUNDS" \
  'BEGIN { printf "mean A %.0f req/s, B %.0f req/s, B/A %.3f\n", a / n, b / n, b / a }'
echo "Machine: $(nproc) CPUs, $(uname -m); Envoy --concurrency 1; wrk 2 threads, 8 connections, ${DURATION}s per run after ${WARMUP}s; $(date -u '+%Y-%m-%d %H:%M UTC')"
