#!/usr/bin/env bash
# Runs the property tests of every parser a request or response reaches (the
# filter's body extraction, header parsing and response usage scanner, the
# wire contract, ext-proc's route headers, the router config loader) with
# many cases, round after round with fresh random seeds, until SECONDS have
# passed (default 300). `cargo test` runs the same properties with few cases.
#
#   scripts/fuzz.sh 600                 # ten minutes
#   CASES=50000 scripts/fuzz.sh 600     # cases per property and round (default 20000)
#
# A failure stops the run; proptest prints the smallest failing input and
# saves its seed in the test's .proptest-regressions file (commit it, so
# every later run replays it first).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-300}
logs=.run/fuzz
mkdir -p "$logs"
cases=${CASES:-20000}
targets=(
  "fleetroute-filter fuzz_extract"
  "fleetroute-filter fuzz_headers"
  "fleetroute-filter fuzz_contract"
  "fleetroute-filter fuzz_response"
  "fleetroute-filter fuzz_rename"
  "fleetroute fuzz_route_key"
  "fleetroute fuzz_config"
)

echo "==> building the property tests"
for t in "${targets[@]}"; do
  read -r pkg test <<< "$t"
  cargo test -q -p "$pkg" --test "$test" --no-run
done

start=$SECONDS
round=0
declare -A spent
while [ $((SECONDS - start)) -lt "$seconds" ]; do
  round=$((round + 1))
  for t in "${targets[@]}"; do
    read -r pkg test <<< "$t"
    t0=$SECONDS
    if ! PROPTEST_CASES=$cases cargo test -q -p "$pkg" --test "$test" -- --test-threads 1 > "$logs/$test.log" 2>&1; then
      cat "$logs/$test.log" >&2
      echo "FAILED: $pkg $test in round $round (PROPTEST_CASES=$cases); see the minimal input above" >&2
      exit 1
    fi
    rm -f "$logs/$test.log"
    spent[$test]=$(( ${spent[$test]:-0} + SECONDS - t0 ))
  done
  echo "round $round passed ($((SECONDS - start)) s)"
done

echo
echo "$round rounds in $((SECONDS - start)) s, PROPTEST_CASES=$cases per property and round"
echo "(expensive properties run a fixed fraction of that, see each file's cases(default, cost))."
for t in "${targets[@]}"; do
  read -r _ test <<< "$t"
  echo "  $test: ${spent[$test]} s"
done
echo "No failures."
