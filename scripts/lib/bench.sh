# Shared by the loopback benchmarks (bench-proxy.sh, bench-rename.sh,
# bench-filter-ab.sh): process bookkeeping, readiness waits, free ports and
# the check of wrk's result line. Source it after setting `run` (the log dir).

# Every process a benchmark starts goes into `pids` and is stopped by PID on exit.
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2> /dev/null || true; done
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# stop_pid PID: stops one process started here and forgets it.
stop_pid() {
  kill "$1" 2> /dev/null || true
  wait "$1" 2> /dev/null || true
  local keep=() p
  for p in "${pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  pids=("${keep[@]}")
}

# wait_http WHAT URL: up to 30 s for URL to answer 2xx.
wait_http() {
  for _ in $(seq 1 150); do
    if curl -fs -o /dev/null "$2"; then return 0; fi
    sleep 0.2
  done
  echo "$1 did not come up at $2; see $run/*.log" >&2
  exit 1
}

# free_ports N: N distinct free loopback ports, picked by the kernel (all
# sockets held open at once so no port is handed out twice).
free_ports() {
  python3 - "$1" << 'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# need_tools: Envoy, wrk and PyYAML, installing the first two when missing.
need_tools() {
  command -v envoy > /dev/null || scripts/setup.sh
  command -v wrk > /dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
  python3 -c 'import yaml' 2> /dev/null || { echo "python3 with PyYAML is required (pip install pyyaml)" >&2; exit 1; }
}

# need_files FILE...: benchmarks measure what was built, so building is left
# to the caller.
need_files() {
  local f
  for f in "$@"; do
    [ -e "$f" ] || { echo "$f is missing: run PROFILE=release scripts/build.sh first" >&2; exit 1; }
  done
}

# bench_line LABEL LOG: the `BENCH requests=…` line that scripts/bench-proxy.lua
# prints, after checking that no request failed (any non-200 or socket error
# invalidates the numbers).
bench_line() {
  local line n k
  line=$(grep '^BENCH requests=' "$2") || { echo "$1: no result from wrk; see $2" >&2; exit 1; }
  for k in non200 connect read write timeout; do
    n=$(sed -E "s/.* $k=([0-9]+).*/\1/" <<< "$line")
    if [ "$n" != 0 ]; then
      echo "$1: $n requests failed ($k); see $2" >&2
      grep '^BENCH first_non200' "$2" >&2 || true
      exit 1
    fi
  done
  echo "$line"
}
