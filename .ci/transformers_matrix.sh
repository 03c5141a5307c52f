#!/usr/bin/env bash
# CI: the torch adapter, decoder and heads tests under the oldest and the newest transformers
# that pyproject.toml allows, each in a venv of its own over the test environment: the venv's
# own site-packages first, then the test environment's (a .pth file that adds them as a site
# directory, so their .pth files, latticekit's editable install among them, work too). Only
# transformers and what it pins differ. The test environment is the interpreter that runs this
# script's `$PYTHON` (default python3): a venv or the machine's global Python alike.
# (`venv --system-site-packages` would not do: made from inside a venv it sees the base
# interpreter's packages, not the venv's.)
# The test environment itself holds the transformers vLLM's CPU build allows (<5.20), so the
# newest allowed release needs an environment of its own.
#
#   .ci/transformers_matrix.sh            # both venvs built at once, then the tests: oldest, newest
#   .ci/transformers_matrix.sh oldest     # or: newest
#   .ci/transformers_matrix.sh venv DIR   # only a venv in DIR over the test environment
#                                         # (tests/test_ci_matrix.py checks it from a venv)
#
# oldest: the lower bound of the "transformers>=A,<B" requirement in pyproject.toml, pinned.
# newest: whatever pip resolves for that requirement (the newest release below B).
# The venvs live under $LK_MATRIX_DIR (default ${TMPDIR:-/tmp}/latticekit-transformers-matrix)
# and are rebuilt on every run; torch, latticekit (editable) and the rest come from the test
# environment, which the README's test command installs first.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
ROOT=${LK_MATRIX_DIR:-${TMPDIR:-/tmp}/latticekit-transformers-matrix}
TESTS=(tests/torch_adapter tests/heads tests/decoding/test_generate.py tests/decoding/test_decoders.py
       tests/decoding/test_no_warnings.py tests/decoding/test_costs_context.py)

oldest=$(sed -n 's/.*"transformers>=\([0-9][0-9.]*\),<[0-9][0-9.]*".*/\1/p' pyproject.toml | sort -u)
if [[ -z "$oldest" || "$oldest" == *$'\n'* ]]; then
    echo "pyproject.toml: expected one bounded requirement \"transformers>=A,<B\", found: ${oldest:-none}" >&2
    exit 2
fi

layered_venv() {  # layered_venv DIR: a new venv whose own site-packages come before the test environment's
    local venv=$1
    # no pip of its own (ensurepip took 5 s a venv): the test environment's pip, on the venv's
    # path through the .pth file below, installs into the venv it runs in
    "$PYTHON" -m venv --clear --without-pip "$venv"
    "$PYTHON" - "$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")" <<'PY'
import site, sys, sysconfig
paths = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
if site.ENABLE_USER_SITE:
    paths[site.getusersitepackages()] = None
with open(f"{sys.argv[1]}/zz_test_environment.pth", "w") as pth:
    pth.write("import site; " + "; ".join(f"site.addsitedir({p!r})" for p in paths) + "\n")
PY
}

want() {  # want oldest|newest: the transformers requirement its venv installs
    if [[ $1 == oldest ]]; then
        echo "transformers==$oldest"
    else
        sed -n 's/.*"\(transformers>=[0-9][0-9.]*,<[0-9][0-9.]*\)".*/\1/p' pyproject.toml | sort -u
    fi
}

build() {  # build oldest|newest: its venv, with its own transformers
    local venv="$ROOT/$1" want version t0=$SECONDS
    want=$(want "$1")
    layered_venv "$venv"
    # --ignore-installed: the venv gets its own transformers (and what that release pins) even
    # where the test environment's would satisfy the requirement
    "$venv/bin/python" -m pip install -q --ignore-installed --no-deps "$want"
    "$venv/bin/python" -m pip install -q "$want"  # its dependencies, where the shared ones do not fit
    # the first import compiles the new transformers' modules (several seconds): here, side by side
    version=$("$venv/bin/python" -c "import torch, transformers; print(transformers.__version__)")
    echo "== transformers $version ($1): venv built in $((SECONDS - t0)) s"
}

run_tests() {  # run_tests oldest|newest: the tests in its venv (its transformers named by its build's line)
    local venv="$ROOT/$1" t0=$SECONDS
    # not the statistical tests (hundreds of seeded samples of a sampling law, half the
    # time): the main suite runs them; what differs here is transformers, which their models'
    # forward passes share with the greedy tests run here
    "$venv/bin/python" -m pytest -q -n 2 -p no:cacheprovider -m "not statistical" "${TESTS[@]}"
    echo "== transformers ($1): tests ran in $((SECONDS - t0)) s"
}

if [[ ${1:-} == venv ]]; then
    [[ $# -eq 2 ]] || { echo "usage: $0 venv DIR" >&2; exit 2; }
    layered_venv "$2"
    exit 0
fi

# Without torch in the test environment the tests would all be skipped: the matrix would test
# nothing. Say so and stop.
"$PYTHON" -c "import torch, transformers, latticekit" 2>/dev/null || {
    echo "$0: the test environment ($("$PYTHON" -c 'import sys; print(sys.prefix)')) lacks torch, transformers or" \
         "latticekit; install them first with the README's test command" >&2
    exit 2
}

[[ $# -gt 0 ]] || set -- oldest newest
for which in "$@"; do
    [[ $which == oldest || $which == newest ]] || { echo "usage: $0 [oldest] [newest]" >&2; exit 2; }
done
# the venvs are built side by side (pip keeps about one core busy: 55 s one after the other,
# 19-25 s at once on a 2-core VM), each into a log that is shown once it is done; then the tests
mkdir -p "$ROOT"
t0=$SECONDS
pids=()
for which in "$@"; do
    build "$which" >"$ROOT/$which.log" 2>&1 &
    pids+=($!)
done
for i in "${!pids[@]}"; do
    which=${*:i+1:1}
    if ! wait "${pids[$i]}"; then
        cat "$ROOT/$which.log" >&2
        echo "$0: the $which venv ($(want "$which")) could not be built" >&2
        exit 1
    fi
    cat "$ROOT/$which.log"
done
echo "== venvs ($*) built in $((SECONDS - t0)) s"
for which in "$@"; do
    run_tests "$which"
done
