#!/usr/bin/env bash
# Builds latticekit's extension with AddressSanitizer + UndefinedBehaviorSanitizer (gcc) in a
# folder of its own and runs the C++ unit tests (csrc/tests) and the search, model and
# bad-input tests against it. Any report fails the run (-fno-sanitize-recover: UBSan aborts
# like ASan does), and the log is searched for reports as well; it ends with
# "sanitizer reports: N".
#
#     tools/sanitize.sh                 # the default test files (a few minutes)
#     tools/sanitize.sh tests/test_search.py -k brute   # any pytest arguments instead
#
# Nothing here touches the in-place build: the instrumented extension lives in
# ${LK_SANITIZE_DIR:-/tmp/latticekit-sanitize} next to a copy of the Python package.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${LK_SANITIZE_DIR:-/tmp/latticekit-sanitize}
# (setup.py's own -O3 comes after these flags and wins; the sanitizers work at any level.)
FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"

mkdir -p "$OUT/build"
# CXXFLAGS as well as CFLAGS: setuptools' distutils (74 and later) compiles C++ sources with
# CXXFLAGS alone, and with CFLAGS only the extension was built without instrumentation (until
# stop 47; the C++ unit tests below were instrumented all along).
CC=gcc CXX=g++ CFLAGS="$FLAGS" CXXFLAGS="$FLAGS" LDFLAGS="-fsanitize=address,undefined" \
    python setup.py build_ext --build-lib "$OUT/lib" --build-temp "$OUT/build" -j 2 >"$OUT/build.log" 2>&1 \
    || { tail -30 "$OUT/build.log"; exit 1; }
# an extension the sanitizers never instrumented would report nothing: check that it calls them
symbols=$(nm -D "$OUT"/lib/latticekit/_core*.so)
for runtime in __asan_report __ubsan_handle; do
    grep -q "$runtime" <<<"$symbols" \
        || { echo "$OUT/lib: the extension was built without the sanitizers (no $runtime* symbols)"; exit 1; }
done
# The package as in the work tree, with the instrumented extension in place of the in-place one.
rm -rf "$OUT/pkg" && mkdir -p "$OUT/pkg"
cp -r latticekit "$OUT/pkg/"
find "$OUT/pkg/latticekit" -name "_core*.so" -delete
cp "$OUT"/lib/latticekit/_core*.so "$OUT/pkg/latticekit/"

# The C++ unit tests (csrc/tests/*.cc, with the sources setup.py lists), instrumented the same
# way; their reports go to the log searched below.
LOG="$OUT/pytest.log"
SOURCES=$(python -c "import sys; sys.path.insert(0, 'tests'); from test_cpp_units import core_sources, cpp_test_sources; print(' '.join(map(str, cpp_test_sources() + core_sources())))")
g++ -std=c++17 -O1 -pthread $FLAGS -Icsrc $SOURCES -o "$OUT/test_core" \
    >"$OUT/test_core.build.log" 2>&1 || { tail -30 "$OUT/test_core.build.log"; exit 1; }
mkdir -p "$OUT/test_core.scratch"
core_status=0
ASAN_OPTIONS="halt_on_error=1:strict_string_checks=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$OUT/test_core" "$OUT/test_core.scratch" >"$LOG" 2>&1 || core_status=$?
tail -1 "$LOG"

if [ $# -eq 0 ]; then
    set -- tests/test_search.py tests/test_ngram.py tests/test_binary.py tests/test_errors.py \
        tests/test_hostile_models.py tests/test_hostile_search.py tests/test_hostile_files.py \
        tests/lm/test_bad_input.py tests/lm/test_properties.py tests/drafting \
        tests/vllm_engine/test_proposer_units.py
fi
# Python itself is not instrumented: the ASan runtime is preloaded, leaks are not reported
# (the interpreter keeps objects alive at exit on purpose). PYTHONSAFEPATH (Python 3.11+)
# keeps the work tree's own latticekit/, with the plain build, off sys.path.
sanitized() {
    env LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
        ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:strict_string_checks=1" \
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
        PYTHONSAFEPATH=1 PYTHONPATH="$OUT/pkg:$ROOT/tests" "$@"
}
sanitized python -c "import sys, latticekit._core as c; sys.exit(0 if c.__file__.startswith('$OUT/pkg') else 'not the instrumented build: ' + c.__file__)"
status=0
sanitized python -m pytest -q -p no:cacheprovider "$@" 2>&1 | tee -a "$LOG" || status=$?
[ "$core_status" -eq 0 ] || status=$core_status
reports=$(grep -cE "ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer" "$LOG" || true)
echo "sanitizer reports: $reports"
[ "$reports" -eq 0 ] && exit "$status"
exit 1
