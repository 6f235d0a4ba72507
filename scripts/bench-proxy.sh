#!/usr/bin/env bash
# Proxy overhead benchmark, on loopback. Measures requests/s, p50/p99 latency
# and Envoy's CPU per request of six setups in front of the same simulated
# engine replicas (4 replicas in 2 fleets, like the demo):
#   1. plain Envoy      listener -> one fleet cluster, round robin
#   2. Envoy + filter   the same plus the Wasm filter (no ext_proc)
#   3. routing only     the full chain without the access log: what observing
#                       every response costs (without it the router never
#                       learns outcomes, so this is a cost measurement, not a
#                       setup to run)
#   4. full chain       the bootstrap `fleetroute bootstrap` renders, with
#                       `fleetroute serve` making real (weighted) decisions and
#                       outcomes reported through the batched gRPC access log
#   5. old observer     routing only plus the former observing ext_proc filter
#                       (a second gRPC stream per request), for reference
#   6. full chain, 1 s  the full chain with Envoy's default access log flush
#                       interval (1 s) instead of the template's 50 ms: what
#                       fresh figures cost
#   7. no first byte    the full chain without the response-header report
#                       (no allow_mode_override): what ending prefill shares
#                       at the first byte costs
#   8. with token       the full chain with grpc.token_file: every call Envoy
#                       makes to fleetroute carries the token, which fleetroute
#                       checks before any service runs
# Then a prompt-size sweep at one connection (plain, filter, full chain):
# p50/p99 per prompt size, to see what the chain adds as prompts grow.
# The engine is told to answer at once (max_tokens 1, next to no prefill or
# decode time) so that the proxy is the bottleneck; one replica is measured
# alone first, and a warning says when plain Envoy gets close to that ceiling.
# Envoy runs with one worker in every setup.
#
#   PROFILE=release scripts/build.sh
#   DURATION=15 scripts/bench-proxy.sh      # seconds measured per setup
#
# Logs and generated configs go to .run/bench-proxy/. Fails if any request
# gets a non-200 answer or a socket error, or if the full chain skipped
# fleetroute for any request (ext_proc failing open).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-15}
SWEEP_SECONDS=${SWEEP_SECONDS:-6}       # per prompt size and setup
SWEEP_SIZES=${SWEEP_SIZES:-"1024 4096 65536 262144 1048576"}
WARMUP=3          # seconds of load before each measurement (pools, Wasm VM, caches)
CONNECTIONS=8
THREADS=2

run=.run/bench-proxy
mkdir -p "$run"
rm -f "$run"/*.log "$run"/*.yaml "$run"/*.txt "$run"/*.json
bin=${BIN_DIR:-target/release}
wasm=$PWD/target/wasm32-wasip1/release/fleetroute_filter.wasm
lua=scripts/bench-proxy.lua

# Tools, processes stopped by PID, readiness and free ports: scripts/lib/bench.sh.
. scripts/lib/bench.sh
need_tools
need_files "$bin/fleetroute" "$bin/fleetroute-engine" "$wasm"
read -r -a ports < <(free_ports 23)
base1=${ports[0]} base2=${ports[1]} burst1=${ports[2]} burst2=${ports[3]}
control=${ports[4]} grpc=${ports[5]} admin=${ports[6]}
# Each setup gets its own listener and admin port: no wait for the previous
# Envoy's sockets to be released.
listen_plain=${ports[7]} admin_plain=${ports[8]}
listen_filter=${ports[9]} admin_filter=${ports[10]}
listen_full=${ports[11]} admin_full=${ports[12]}
listen_route=${ports[13]} admin_route=${ports[14]}
listen_old=${ports[15]} admin_old=${ports[16]}
listen_slow=${ports[17]} admin_slow=${ports[18]}
listen_nofb=${ports[19]} admin_nofb=${ports[20]}
listen_token=${ports[21]} admin_token=${ports[22]}

# --- router config: the demo's, on this run's replica ports ------------------
python3 - envoy-config/router.yaml "$run/router.yaml" \
  "127.0.0.1:$base1,127.0.0.1:$base2" "127.0.0.1:$burst1,127.0.0.1:$burst2" << 'PY'
import sys, yaml
src, dst, base, burst = sys.argv[1:]
cfg = yaml.safe_load(open(src))
eps = {"base": base.split(","), "burst": burst.split(",")}
for fleet in cfg["fleets"]:
    fleet["endpoints"] = eps[fleet["name"]]
yaml.safe_dump(cfg, open(dst, "w"), sort_keys=False)
PY
"$bin/fleetroute" check-config "$run/router.yaml"
# 8. the same with a gRPC token.
od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$run/grpc-token"
cp "$run/router.yaml" "$run/router-token.yaml"
echo "grpc: { token_file: \"$PWD/$run/grpc-token\" }" >> "$run/router-token.yaml"
"$bin/fleetroute" check-config "$run/router-token.yaml"

# --- engine: fast enough that it is never the bottleneck ----------------------
"$bin/fleetroute-engine" \
  --replica "base-1=127.0.0.1:$base1" --replica "base-2=127.0.0.1:$base2" \
  --replica "burst-1=127.0.0.1:$burst1" --replica "burst-2=127.0.0.1:$burst2" \
  --control "127.0.0.1:$control" --models demo-model \
  --prefill-tokens-per-sec 1000000000 --decode-ms-per-token 0 --max-batch 256 \
  > "$run/engine.log" 2>&1 &
engine_pid=$!
pids+=($engine_pid)
wait_http "engine" "http://127.0.0.1:$control/replicas"

# --- Envoy configs -------------------------------------------------------------
# 3. full chain: exactly what fleetroute renders.
"$bin/fleetroute" bootstrap --config "$run/router.yaml" --wasm "$wasm" \
  --listen "127.0.0.1:$listen_full" --envoy-admin "127.0.0.1:$admin_full" \
  --grpc "127.0.0.1:$grpc" > "$run/full.yaml"

"$bin/fleetroute" bootstrap --config "$run/router-token.yaml" --wasm "$wasm" \
  --listen "127.0.0.1:$listen_token" --envoy-admin "127.0.0.1:$admin_token" \
  --grpc "127.0.0.1:$grpc" > "$run/token.yaml"

# 1. plain Envoy: the same kind of listener, straight to the base fleet.
cat > "$run/plain.yaml" << YAML
admin:
  address:
    socket_address: { address: 127.0.0.1, port_value: $admin_plain }
static_resources:
  listeners:
    - name: inference
      address:
        socket_address: { address: 127.0.0.1, port_value: $listen_plain }
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: inference
                route_config:
                  name: fleets
                  virtual_hosts:
                    - name: inference
                      domains: ["*"]
                      routes:
                        - match: { prefix: "/" }
                          route: { cluster: base, timeout: 600s }
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: base
      type: STATIC
      connect_timeout: 1s
      lb_policy: ROUND_ROBIN
      load_assignment:
        cluster_name: base
        endpoints:
          - lb_endpoints:
              - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $base1 } } }
              - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $base2 } } }
YAML

# 2. Envoy + filter: plain Envoy plus the rendered config's Wasm filter (same
# plugin configuration and .wasm) and the body buffer limit that goes with it.
python3 - "$run/plain.yaml" "$run/full.yaml" "$run/filter.yaml" "$admin_filter" "$listen_filter" << 'PY'
import sys, yaml
plain_path, full_path, out_path, admin_port, listen_port = sys.argv[1:]
plain = yaml.safe_load(open(plain_path))
full = yaml.safe_load(open(full_path))

def hcm(doc):
    return doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]

wasm = [f for f in hcm(full)["http_filters"] if f["name"] == "envoy.filters.http.wasm"]
assert len(wasm) == 1, "rendered config has no single Wasm filter"
hcm(plain)["http_filters"].insert(0, wasm[0])
vh_full = hcm(full)["route_config"]["virtual_hosts"][0]
vh = hcm(plain)["route_config"]["virtual_hosts"][0]
if "request_body_buffer_limit" in vh_full:
    vh["request_body_buffer_limit"] = vh_full["request_body_buffer_limit"]
plain["admin"]["address"]["socket_address"]["port_value"] = int(admin_port)
plain["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] = int(listen_port)
yaml.safe_dump(plain, open(out_path, "w"), sort_keys=False)
PY

# 3. routing only: the full chain without the access log, to measure what
# observing every response costs. 5. old observer: routing only plus the
# former observing ext_proc filter (a second gRPC stream per request).
python3 - "$run/full.yaml" "$run" "$admin_route" "$listen_route" "$admin_old" "$listen_old" \
  "$admin_slow" "$listen_slow" "$admin_nofb" "$listen_nofb" << 'PY'
import copy, sys, yaml
(full_path, out, admin_route, listen_route, admin_old, listen_old, admin_slow, listen_slow,
 admin_nofb, listen_nofb) = sys.argv[1:]
full = yaml.safe_load(open(full_path))

def variant(admin, listen, keep_log=False):
    doc = copy.deepcopy(full)
    doc["admin"]["address"]["socket_address"]["port_value"] = int(admin)
    listener = doc["static_resources"]["listeners"][0]
    listener["address"]["socket_address"]["port_value"] = int(listen)
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm.get("access_log"), "rendered config has no access log"
    if not keep_log:
        del hcm["access_log"]
    return doc, hcm

slow, hcm = variant(admin_slow, listen_slow, keep_log=True)
hcm["access_log"][0]["typed_config"]["common_config"]["buffer_flush_interval"] = "1s"
yaml.safe_dump(slow, open(f"{out}/slow.yaml", "w"), sort_keys=False)

nofb, hcm = variant(admin_nofb, listen_nofb, keep_log=True)
for f in hcm["http_filters"]:
    tc = f.get("typed_config", {})
    if tc.pop("allow_mode_override", None):
        tc.pop("allowed_override_modes", None)
        break
else:
    raise SystemExit("rendered config has no allow_mode_override")
yaml.safe_dump(nofb, open(f"{out}/nofb.yaml", "w"), sort_keys=False)

route, _ = variant(admin_route, listen_route)
yaml.safe_dump(route, open(f"{out}/route.yaml", "w"), sort_keys=False)

old, hcm = variant(admin_old, listen_old)
observer = {
    "name": "envoy.filters.http.ext_proc",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "fleetroute"}, "timeout": "1s"},
        "failure_mode_allow": True,
        "observability_mode": True,
        "forward_rules": {"allowed_headers": {"patterns": [
            {"prefix": "x-fleetroute-"}, {"exact": "x-request-id"},
            {"exact": ":status"}, {"exact": "content-type"}]}},
        "deferred_close_timeout": "1s",
        "processing_mode": {
            "request_header_mode": "SEND", "response_header_mode": "SEND",
            "request_body_mode": "NONE", "response_body_mode": "STREAMED",
            "request_trailer_mode": "SKIP", "response_trailer_mode": "SEND"},
    },
}
hcm["http_filters"].insert(len(hcm["http_filters"]) - 1, observer)
yaml.safe_dump(old, open(f"{out}/old.yaml", "w"), sort_keys=False)
PY

# Reject a broken config before starting anything that depends on it.
for setup in plain filter route full old slow nofb token; do
  envoy --mode validate -c "$run/$setup.yaml" --disable-hot-restart --log-level warn \
    > "$run/validate-$setup.log" 2>&1 \
    || { echo "envoy --mode validate rejected $run/$setup.yaml:" >&2; cat "$run/validate-$setup.log" >&2; exit 1; }
done
echo "==> envoy configs valid: plain, filter, route, full, old, slow, nofb, token"

# --- measuring -----------------------------------------------------------------
# cpu_snapshot NAME=PID...: "name=ticks ..." of CPU time (user + system) used
# so far, to tell which process was busy: the few cores run everything.
cpu_snapshot() {
  local np
  for np in "$@"; do
    awk -v n="${np%%=*}" '{ printf "%s=%d ", n, $14 + $15 }' "/proc/${np#*=}/stat"
  done
}

# cpu_share BEFORE AFTER SECONDS: "name N%, ..." in % of one core.
cpu_share() {
  python3 - "$1" "$2" "$3" "$(getconf CLK_TCK)" << 'PY'
import sys
before, after, secs, hz = sys.argv[1:]
b = dict(kv.split("=") for kv in before.split())
a = dict(kv.split("=") for kv in after.split())
print(", ".join(f"{k} {100 * (int(a[k]) - int(b[k])) / int(hz) / float(secs):.0f}%" for k in a))
PY
}

# One request checked by hand before each setup's load.
body='{"model":"demo-model","user":"bench-check","messages":[{"role":"user","content":"Say hello"}],"max_tokens":1}'

# served_counts: "name=count ..." of every replica, from the engine's control API.
served_counts() {
  curl -fsS "http://127.0.0.1:$control/replicas" | python3 -c '
import json, sys
print(" ".join("%s=%s" % (r["name"], r["requests_served"]) for r in json.load(sys.stdin)))'
}

# served_delta BEFORE AFTER: requests each replica served in between.
served_delta() {
  python3 - "$1" "$2" << 'PY'
import sys
before = dict(kv.split("=") for kv in sys.argv[1].split())
after = dict(kv.split("=") for kv in sys.argv[2].split())
print(", ".join(f"{k} {int(v) - int(before.get(k, 0))}" for k, v in sorted(after.items())))
PY
}

# run_wrk LABEL SECONDS LOG URL [--latency]: runs wrk and checks every request.
# The numbers come from the Lua done() callback (same histogram as --latency's
# table, in microseconds instead of rounded text); the log keeps wrk's output.
run_wrk() {
  local label=$1 secs=$2 log=$3 url=$4
  shift 4
  wrk -t"$THREADS" -c"$CONNECTIONS" -d"${secs}s" "$@" -s "$lua" "$url" > "$log" 2>&1 \
    || { echo "$label: wrk failed; see $log" >&2; cat "$log" >&2; exit 1; }
  bench_line "$label" "$log"
}

# to_numbers BENCH-LINE: prints "requests/s p50-ms p99-ms".
to_numbers() {
  awk '{
    for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    printf "%.0f %.2f %.2f\n", v["requests"] / (v["duration_us"] / 1e6), v["p50_us"] / 1000, v["p99_us"] / 1000
  }' <<< "$1"
}

# The engine's own ceiling, with no proxy: one replica under the same load.
# If plain Envoy gets close to (replicas behind it) x this, the engine, not the
# proxy, is what limits setups 1 and 2, and their ratios mean little.
echo "==> engine alone (one replica, no proxy)"
engine_url="http://127.0.0.1:$base1/v1/chat/completions"
run_wrk "engine warm-up" "$WARMUP" "$run/wrk-engine-warmup.log" "$engine_url" > /dev/null
read -r engine_rps engine_p50 engine_p99 < <(to_numbers "$(run_wrk "engine" "$DURATION" "$run/wrk-engine.log" "$engine_url" --latency)")
echo "    $engine_rps req/s, p50 $engine_p50 ms, p99 $engine_p99 ms"

declare -A rps p50 p99 served cpu envoy_us sweep50 sweep99
order=(plain filter route full old slow nofb token)
declare -A title=([plain]="plain Envoy" [filter]="Envoy + Wasm filter" [route]="filter + routing ext_proc (no observation)" [full]="full chain (filter + routing + gRPC access log)" [old]="old chain (filter + routing + observing ext_proc)" [slow]="full chain, access log flushed every 1 s" [nofb]="full chain without the first-byte report" [token]="full chain, every gRPC call with the token")
declare -A listen=([plain]=$listen_plain [filter]=$listen_filter [route]=$listen_route [full]=$listen_full [old]=$listen_old [slow]=$listen_slow [nofb]=$listen_nofb [token]=$listen_token)
declare -A eadmin=([plain]=$admin_plain [filter]=$admin_filter [route]=$admin_route [full]=$admin_full [old]=$admin_old [slow]=$admin_slow [nofb]=$admin_nofb [token]=$admin_token)
fell_open=0
log_dropped=0

for setup in "${order[@]}"; do
  echo "==> ${title[$setup]}"
  fr_pid=
  if [ "$setup" != plain ] && [ "$setup" != filter ]; then
    # Only the chains that ask fleetroute run it; it stays off during the other runs
    # so it takes no CPU from them. Ready = every replica probed.
    config="$run/router.yaml"
    [ "$setup" != token ] || config="$run/router-token.yaml"
    RUST_LOG=${RUST_LOG:-info} "$bin/fleetroute" serve --config "$config" \
      --grpc "127.0.0.1:$grpc" --admin "127.0.0.1:$admin" > "$run/fleetroute.log" 2>&1 &
    fr_pid=$!
    pids+=($fr_pid)
    wait_http "fleetroute" "http://127.0.0.1:$admin/ready"
  fi
  # --disable-hot-restart: no shared memory, so this cannot clash with another
  # Envoy (the demo, the tests) on this machine.
  envoy -c "$run/$setup.yaml" --concurrency 1 --disable-hot-restart --log-level warn \
    > "$run/envoy-$setup.log" 2>&1 &
  envoy_pid=$!
  pids+=($envoy_pid)
  wait_http "envoy ($setup)" "http://127.0.0.1:${eadmin[$setup]}/ready"

  url="http://127.0.0.1:${listen[$setup]}/v1/chat/completions"
  # One checked request first: a broken chain fails here, not after a long run.
  status=$(curl -sS -o "$run/check-$setup.json" -w '%{http_code}' "$url" \
    -H 'content-type: application/json' -d "$body")
  [ "$status" = 200 ] || { echo "$setup: first request got $status: $(cat "$run/check-$setup.json")" >&2; exit 1; }

  run_wrk "$setup warm-up" "$WARMUP" "$run/wrk-$setup-warmup.log" "$url" > /dev/null
  watched=("envoy=$envoy_pid" "engine=$engine_pid")
  [ -z "$fr_pid" ] || watched+=("fleetroute=$fr_pid")
  before=$(served_counts)
  cpu_before=$(cpu_snapshot "${watched[@]}")
  result=$(run_wrk "$setup" "$DURATION" "$run/wrk-$setup.log" "$url" --latency)
  cpu_after=$(cpu_snapshot "${watched[@]}")
  cpu[$setup]=$(cpu_share "$cpu_before" "$cpu_after" "$DURATION")
  served[$setup]=$(served_delta "$before" "$(served_counts)")
  read -r "rps[$setup]" "p50[$setup]" "p99[$setup]" < <(to_numbers "$result")
  # Envoy's CPU time per request, in microseconds.
  envoy_us[$setup]=$(python3 - "$cpu_before" "$cpu_after" "$(getconf CLK_TCK)" "$result" << 'PY'
import sys
before, after, hz, line = sys.argv[1:]
b = dict(kv.split("=") for kv in before.split())
a = dict(kv.split("=") for kv in after.split())
n = int(dict(kv.split("=") for kv in line.split()[1:] if "=" in kv)["requests"])
print(f"{(int(a['envoy']) - int(b['envoy'])) / int(hz) / n * 1e6:.0f}")
PY
)
  echo "    ${rps[$setup]} req/s, p50 ${p50[$setup]} ms, p99 ${p99[$setup]} ms, Envoy ${envoy_us[$setup]} µs CPU/request"
  echo "    served: ${served[$setup]}; CPU: ${cpu[$setup]}"

  if [ -n "$fr_pid" ]; then
    # With failure_mode_allow, a failed ext_proc call still gets a 200 (from
    # the fallback route), so the status check alone cannot see it. Any
    # failure_mode_allowed means some requests skipped fleetroute: the run did
    # not measure the chain.
    curl -fsS "http://127.0.0.1:${eadmin[$setup]}/stats" > "$run/envoy-$setup-stats.txt"
    n=$(awk -F': ' '$1 ~ /ext_proc\.failure_mode_allowed$/ { n += $2 } END { print n + 0 }' "$run/envoy-$setup-stats.txt")
    fell_open=$((fell_open + n))
    [ "$n" = 0 ] || echo "    $setup: $n ext_proc calls failed open" >&2
  fi
  if [ "$setup" = full ]; then
    written=$(awk -F': ' '$1 ~ /grpc_access_log\.logs_written$/ { n += $2 } END { print n + 0 }' "$run/envoy-$setup-stats.txt")
    log_dropped=$(awk -F': ' '$1 ~ /grpc_access_log\.logs_dropped$/ { n += $2 } END { print n + 0 }' "$run/envoy-$setup-stats.txt")
    echo "    access log: $written entries written, $log_dropped dropped"
  fi

  # Prompt-size sweep at one connection.
  if [ "$setup" = plain ] || [ "$setup" = filter ] || [ "$setup" = full ]; then
    for size in $SWEEP_SIZES; do
      PROMPT_BYTES=$size run_wrk "$setup sweep warm-up" 1 "$run/wrk-$setup-$size-warmup.log" "$url" > /dev/null
      THREADS=1 CONNECTIONS=1
      read -r _ "sweep50[$setup-$size]" "sweep99[$setup-$size]" < <(to_numbers \
        "$(PROMPT_BYTES=$size run_wrk "$setup sweep $size" "$SWEEP_SECONDS" "$run/wrk-$setup-$size.log" "$url" --latency)")
      THREADS=2 CONNECTIONS=8
      echo "    prompt $size B, 1 connection: p50 ${sweep50[$setup-$size]} ms, p99 ${sweep99[$setup-$size]} ms"
    done
  fi
  stop_pid "$envoy_pid"
  [ -z "$fr_pid" ] || stop_pid "$fr_pid"
done

# --- report --------------------------------------------------------------------
cpu_model=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
# Arm kernels may have no "model name" line.
[ -n "$cpu_model" ] || cpu_model=$(lscpu 2> /dev/null | awk -F': +' '/^Model name/ { print $2; exit }')
echo
echo "| setup | requests/s | p50 ms | p99 ms | Envoy CPU µs/request | requests/s vs plain | vs routing only |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for setup in "${order[@]}"; do
  ratio=$(awk -v a="${rps[$setup]}" -v b="${rps[plain]}" 'BEGIN { printf "%.2f", a / b }')
  vs_route=$(awk -v a="${rps[$setup]}" -v b="${rps[route]}" 'BEGIN { printf "%.2f", a / b }')
  echo "| ${title[$setup]} | ${rps[$setup]} | ${p50[$setup]} | ${p99[$setup]} | ${envoy_us[$setup]} | $ratio | $vs_route |"
done
awk -v t="${rps[token]}" -v f="${rps[full]}" -v t50="${p50[token]}" -v f50="${p50[full]}" \
    -v tu="${envoy_us[token]}" -v fu="${envoy_us[full]}" 'BEGIN {
  printf "\nThe gRPC token: %.2fx the full chain'"'"'s requests/s, p50 %+.2f ms, Envoy CPU %+d µs/request.\n", t / f, t50 - f50, tu - fu }'
echo
echo "Prompt-size sweep, 1 connection: p50 / p99 ms, and what the filter and the full chain add over plain Envoy."
echo "| prompt | plain | + filter | full chain | filter adds p50 / p99 | full chain adds p50 / p99 |"
echo "|---:|---:|---:|---:|---:|---:|"
for size in $SWEEP_SIZES; do
  awk -v s="$size" -v p50="${sweep50[plain-$size]}" -v p99="${sweep99[plain-$size]}" \
      -v f50="${sweep50[filter-$size]}" -v f99="${sweep99[filter-$size]}" \
      -v c50="${sweep50[full-$size]}" -v c99="${sweep99[full-$size]}" 'BEGIN {
    printf "| %d KB | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | +%.2f / +%.2f | +%.2f / +%.2f |\n",
      s / 1024, p50, p99, f50, f99, c50, c99, f50 - p50, f99 - p99, c50 - p50, c99 - p99 }'
done
echo
echo "Machine: $(nproc) CPUs, $(uname -m), ${cpu_model:-unknown CPU}; Envoy $(envoy --version | sed -nE 's|.*version: [0-9a-f]+/([0-9.]+)/.*|\1|p'); $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "Load: wrk $THREADS threads, $CONNECTIONS connections, ${DURATION}s per setup after ${WARMUP}s warm-up; Envoy --concurrency 1; non-streaming chat, max_tokens 1; every response checked (all 200)."
echo "Engine alone: $engine_rps req/s from one replica with no proxy (p50 $engine_p50 ms)."
echo "Served by replica, and CPU as % of one core (measured run):"
for setup in "${order[@]}"; do
  echo "  ${title[$setup]}: ${served[$setup]}; CPU: ${cpu[$setup]}"
done

status=0
# Setups 1 and 2 send to the two replicas of one fleet.
if awk -v p="${rps[plain]}" -v e="$engine_rps" 'BEGIN { exit !(p >= 0.8 * 2 * e) }'; then
  echo >&2
  echo "WARNING: plain Envoy reached $(awk -v p="${rps[plain]}" -v e="$engine_rps" 'BEGIN { printf "%.0f%%", 100 * p / (2 * e) }') of what its two replicas serve without a proxy: the engine, not the proxy, limits these numbers." >&2
fi
if [ "$fell_open" != 0 ]; then
  echo >&2
  echo "FAILED: $fell_open ext_proc calls failed open (no routing decision or no observation)," >&2
  echo "so its row does not measure the full chain. Envoy's fleetroute cluster stats: " >&2
  echo "See $run/envoy-*-stats.txt, $run/envoy-*.log and $run/fleetroute.log." >&2
  status=1
fi
if [ "$log_dropped" != 0 ]; then
  echo "NOTE: Envoy dropped $log_dropped access log entries in the full chain (buffer full)." >&2
fi
exit "$status"
