#!/usr/bin/env bash
# Issue 34 (item 5): generate with the shipped heads against generate without heads, each
# learning its arms anew in every call (auto, auto@none: generate's default) and keeping their
# outcomes across calls (auto/kept, auto@none/kept: generate(..., arms=True), aged when a call
# resumes from them; auto/kept0: kept and not aged, as latticekit did before ageing), against
# greedy, on held-out code windows and instruction requests; every output checked equal to
# greedy decoding, decoders interleaved per prompt (see headsfree_speed.py). The kept outcomes
# start empty and carry from the warm-up and each chunk to the next, as a user's cache would;
# the chunks alternate between the domains (SEQUENCE), so kept outcomes meet calls of the other
# kind. The whole run holds the timing lock. Usage: benchmarks/persisted_speed.sh [OUT]
# Size: SEQUENCE (domain:A:B chunks, in order), REPEATS, CODE_TOKENS and INSTRUCTION_TOKENS (new
# tokens), THREADS (torch threads), DECODERS; SEED picks the prompts (0: sources_speed.sh's; another
# seed, other code windows and instruction requests: a held-out check).
set -euo pipefail
LOCK=${LATTICEKIT_TIMING_LOCK:-/tmp/latticekit-timing.lock}
[ "${LATTICEKIT_TIMING_LOCKED:-}" = 1 ] || LATTICEKIT_TIMING_LOCKED=1 exec flock "$LOCK" "$0" "$@"
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/results/sources/persisted}
SEQUENCE=${SEQUENCE-code:0:5 instruction:0:10 code:5:10 instruction:10:20}
REPEATS=${REPEATS:-3} SEED=${SEED:-0}
CODE_TOKENS=${CODE_TOKENS:-96} INSTRUCTION_TOKENS=${INSTRUCTION_TOKENS:-128} THREADS=${THREADS:-2}
DECODERS=${DECODERS:-greedy auto auto/kept auto/kept0 auto@none auto@none/kept}
rm -rf "$OUT/arms" "$OUT/arms-unaged" "$OUT/chunks"
run() { PYTHONPATH=. python benchmarks/headsfree_speed.py --out "$OUT" --repeats "$REPEATS" \
          --threads "$THREADS" --max-new-tokens "$CODE_TOKENS" --max-new-tokens-instruction "$INSTRUCTION_TOKENS" --seed "$SEED" "$@"; }
run --measure-costs
for chunk in $SEQUENCE; do run --domain "${chunk%%:*}" --prompts "${chunk#*:}" --decoders $DECODERS; done
PYTHONPATH=. python benchmarks/headsfree_speed.py --out "$OUT" --merge --name persisted --versus auto@none auto@none/kept \
  --title "generate with and without heads, arms learnt anew in every call or kept across calls" \
  --command "SEQUENCE='$SEQUENCE' SEED=$SEED REPEATS=$REPEATS THREADS=$THREADS CODE_TOKENS=$CODE_TOKENS INSTRUCTION_TOKENS=$INSTRUCTION_TOKENS benchmarks/persisted_speed.sh"
