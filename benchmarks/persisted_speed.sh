#!/usr/bin/env bash
# Issue 34 (item 5): generate with the shipped heads against generate without heads, each
# learning its arms anew in every call (auto, auto@none: latticekit 15c2808) and keeping their
# outcomes across calls (auto/kept, auto@none/kept: generate's default now), against greedy, on
# held-out code windows and instruction requests; every output checked equal to greedy
# decoding, decoders interleaved per prompt (see headsfree_speed.py). The kept outcomes start
# empty and carry from the warm-up and each chunk to the next, as a user's cache would.
# The whole run holds the timing lock. Usage: benchmarks/persisted_speed.sh [OUT]
set -euo pipefail
LOCK=${LATTICEKIT_TIMING_LOCK:-/tmp/latticekit-timing.lock}
[ "${LATTICEKIT_TIMING_LOCKED:-}" = 1 ] || LATTICEKIT_TIMING_LOCKED=1 exec flock "$LOCK" "$0" "$@"
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/results/sources/persisted}
DECODERS="greedy auto auto/kept auto@none auto@none/kept"
rm -rf "$OUT/arms" "$OUT/chunks"
run() { PYTHONPATH=. python benchmarks/headsfree_speed.py --out "$OUT" "$@"; }
run --measure-costs
run --domain code --prompts 0:10 --decoders $DECODERS
for chunk in 0:10 10:20; do
  run --domain instruction --prompts $chunk --decoders $DECODERS
done
PYTHONPATH=. python benchmarks/headsfree_speed.py --out "$OUT" --merge --name persisted --versus auto@none auto@none/kept \
  --title "generate with and without heads, arms learnt anew in every call or kept across calls" \
  --command "benchmarks/persisted_speed.sh"
