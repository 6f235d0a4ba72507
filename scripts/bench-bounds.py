#!/usr/bin/env python3
"""Time to first token on a trace without a router's imperfections: a
floor no router can beat, and reference placements, for the HTTP
benchmark's fleet (scripts/bench-routers.sh), from the trace alone.

The model is the simulated engine's prefill path with nothing else: each
replica prefills one prompt at a time, first come first served, at
PREFILL tokens/s; a prompt's cached prefix (the trace's 512-token blocks
the replica saw before, no eviction) costs nothing. Decode, batching and
the network are left out. For each load it prints TTFT p50 / p90 / p99 ms
(trace time) and max/mean requests per replica of:

  floor       every prompt on an idle replica holding every block seen so
              far: its own uncached prefill only (no router can do better,
              up to the engines' own block size)
  round-robin the client's own round robin (checks the model: compare with
              the benchmark's `direct` rows)
  earliest    each request, in arrival order, on the replica where its own
              first token would come soonest, knowing every queue and cache
              exactly (a greedy reference, not a bound: it ignores what a
              placement does to the requests after it)
  split       with --split TOKENS:K, prompts of at least TOKENS go to the
              last K replicas and the rest to the others, each placed as
              `earliest` within its group (size-based placement, which
              keeps short prompts from queueing behind long ones)

  scripts/bench-bounds.py TRACE [--requests 300] [--replicas 8]
      (give --requests the bench's REQUESTS, 600 unless set)
      [--prefill 10000] [--rate 1 --rate 4 ...] [--split 30000:3]

Deterministic: no randomness, the trace's order and timestamps only.
"""

import argparse
import json


def load(path, n):
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
            if len(rows) == n:
                break
    return rows


def cached_tokens(row, seen, block=512):
    n = 0
    for h in row["hash_ids"]:
        if h not in seen:
            break
        n += 1
    return min(n * block, row["input_length"])


def pct(sorted_ms, p):
    return sorted_ms[min(len(sorted_ms) - 1, int(p * len(sorted_ms)))]


def summary(ttft_s, counts):
    t = sorted(x * 1000 for x in ttft_s)
    spread = "max/mean %.2f" % (max(counts) / (sum(counts) / len(counts))) if counts else ""
    return "%6.0f / %6.0f / %6.0f  %s" % (pct(t, 0.5), pct(t, 0.9), pct(t, 0.99), spread)


def replay(rows, rate, replicas, prefill, policy, split=None):
    free = [0.0] * replicas
    seen = [set() for _ in range(replicas)]
    everywhere = set()
    counts = [0] * replicas
    ttft = []
    for i, row in enumerate(rows):
        at = row["timestamp"] / 1000 / rate
        if policy == "floor":
            own = (row["input_length"] - cached_tokens(row, everywhere)) / prefill
            everywhere.update(row["hash_ids"])
            ttft.append(own)
            continue
        group = range(replicas)
        if policy == "split":
            tokens, k = split
            big = row["input_length"] >= tokens
            group = range(replicas - k, replicas) if big else range(replicas - k)
        if policy == "round-robin":
            r = i % replicas
        else:
            r = min(group, key=lambda r: max(free[r], at)
                    + (row["input_length"] - cached_tokens(row, seen[r])) / prefill)
        own = (row["input_length"] - cached_tokens(row, seen[r])) / prefill
        free[r] = max(free[r], at) + own
        seen[r].update(row["hash_ids"])
        counts[r] += 1
        ttft.append(free[r] - at)
    return summary(ttft, counts if policy != "floor" else [])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--prefill", type=float, default=10000.0, help="prompt tokens/s per replica")
    ap.add_argument("--rate", type=float, action="append", help="load, x the trace's rate")
    ap.add_argument("--split", help="TOKENS:K, see `split` above")
    a = ap.parse_args()
    if a.requests < 1 or a.replicas < 1 or a.prefill <= 0:
        ap.error("--requests, --replicas and --prefill must be positive")
    if any(r <= 0 for r in a.rate or []):
        ap.error("--rate must be positive")
    split = None
    if a.split:
        try:
            tokens, k = (int(x) for x in a.split.split(":"))
        except ValueError:
            ap.error("--split: want TOKENS:K, two integers")
        split = (tokens, k)
        if not 0 < k < a.replicas:
            ap.error("--split: K must be between 1 and replicas - 1")
    rows = load(a.trace, a.requests)
    print("%s, %d requests, %d replicas, %.0f prefill tokens/s; TTFT p50 / p90 / p99 ms"
          % (a.trace, len(rows), a.replicas, a.prefill))
    for rate in a.rate or [1.0, 1.5, 2.0, 4.0]:
        policies = ("floor", "round-robin", "earliest") + (("split",) if split else ())
        for policy in policies:
            print("%4gx  %-11s %s" % (rate, policy,
                                       replay(rows, rate, a.replicas, a.prefill, policy, split)))


if __name__ == "__main__":
    main()
