#!/usr/bin/env bash
# Issue 27's benchmark: auto (every source, the default of generate) against each single
# source (heads alone, the text alone = generate without heads), the union always, and auto
# with untrained heads, on held-out instruction requests and code windows; every output checked
# equal to greedy decoding. The whole run holds the timing lock (the step costs are measured in
# the machine state the decoders then meet); see headsfree_speed.py for how decoders are
# interleaved. Usage: benchmarks/sources_speed.sh [OUT]
set -euo pipefail
[ "${LATTICEKIT_TIMING_LOCKED:-}" = 1 ] || LATTICEKIT_TIMING_LOCKED=1 exec flock /tmp/latticekit-timing.lock "$0" "$@"
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/results/sources}
DECODERS="greedy headsfree heads heads+ngram auto auto@untrained"
run() { PYTHONPATH=. python benchmarks/headsfree_speed.py --out "$OUT" "$@"; }
run --measure-costs
run --domain code --prompts 0:10 --decoders $DECODERS
for chunk in 0:10 10:20 20:30; do
  run --domain instruction --prompts $chunk --decoders $DECODERS
done
PYTHONPATH=. python benchmarks/headsfree_speed.py --out "$OUT" --merge --name sources \
  --title "auto (every source) against each single source" --command "benchmarks/sources_speed.sh"
