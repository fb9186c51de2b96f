#!/usr/bin/env bash
# Sets up a fresh machine and runs every test: the linters, the GoogleTest suite
# of the C++ core, pytest (multi-process tests on gloo over loopback) and the
# packaging tests (sdist, wheel, lowest setuptools, each installed outside the tree).
#
# Arranged for a 2-core machine (docs/testing.md, "CI time"):
# - the GoogleTest binary links the core objects that setup.sh's extension build
#   compiled, instead of compiling the core a second time; it builds at low
#   priority (nice) and runs while pytest runs, in the CPU time the tests leave idle;
# - the sources are checked against the headers of torch 2.11 and 2.15 (the range's
#   ends; CI builds and tests on 2.13) in the background too, as one translation unit;
# - pytest runs three tests at a time (pytest-xdist; the packaging tests among
#   them, on one worker): most tests wait on deadlines, sleeps and other
#   processes part of the time, so two left a quarter of the two cores idle
#   (docs/testing.md, "CI time"); then the tests marked `serial`, whose
#   assertions time the guard against the clock, one at a time.
# PYTEST_WORKERS=N: N tests at a time (default 3; 0: one at a time, in one process).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test  # everything the tests need, not only what the demo uses
PY=${PYTHON:-python3}

echo "== Lint (ruff, clang-format: scripts/lint.sh)"
bash scripts/lint.sh

echo "== C++ (GoogleTest): built and run in the background, reported after the first pytest pass"
TORCH_CMAKE=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
# setup.py's build folder, build/temp.<platform>-<python tag>: the objects to link.
BUILD_TEMP=$("$PY" -c 'import sys, sysconfig; print(f"build/temp.{sysconfig.get_platform()}-{sys.implementation.cache_tag}")')
cmake -S tests/cpp -B tests/cpp/build -DCMAKE_PREFIX_PATH="$TORCH_CMAKE" -DCMAKE_BUILD_TYPE=Release \
  -DTORCH_EXT_BUILD_TEMP="$PWD/$BUILD_TEMP" >/dev/null
cpp_log=$(mktemp)
# The build at low priority (it takes the CPU time the tests leave idle); ctest
# at normal priority (its tests wait on deadlines: little CPU, but on time).
# In a process group of its own (setsid), so that a failing step below ends it
# with this script (the trap), compilers and tests included.
setsid bash -c 'nice -n 10 cmake --build tests/cpp/build -j "$1" && ctest --test-dir tests/cpp/build --output-on-failure' \
  _ "${MAX_JOBS:-2}" >"$cpp_log" 2>&1 &
cpp_pid=$!

echo "== torch range (issue 41): csrc/ against the oldest and newest supported torch's headers, in the background"
# Syntax only, every source in one translation unit (--unity: about 20 CPU-s a
# release); the headers are fetched from the package index (about 10 MB each).
range_log=$(mktemp)
setsid bash -c 'for v in 2.11.0 2.15.0; do nice -n 10 bash scripts/check_torch_headers.sh --unity "$v" || exit 1; done' \
  >"$range_log" 2>&1 &
range_pid=$!
trap 'kill -- -"$cpp_pid" -"$range_pid" 2>/dev/null || true' EXIT

pytest_pass() {
  local rc=0
  "$PY" -m pytest tests/python "$@" || rc=$?
  # 5: the arguments selected none of them (e.g. -k for a test of another pass).
  [ "$rc" = 0 ] || [ "$rc" = 5 ] || exit "$rc"
}

# -m replaces pyproject.toml's "not packaging and not sweep": the packaging tests (sdist -> wheel,
# lowest setuptools, installed outside the tree) run in this pass, on one worker.
echo "== Python (pytest -m 'not serial', ${PYTEST_WORKERS:-3} at a time), packaging tests included"
pytest_pass -n "${PYTEST_WORKERS:-3}" --dist loadgroup -m "not serial and not sweep" "$@"

echo "== C++ (GoogleTest): build and ctest output"
cpp_rc=0
wait "$cpp_pid" || cpp_rc=$?
range_rc=0
wait "$range_pid" || range_rc=$?
trap - EXIT
if [ "$cpp_rc" != 0 ]; then
  cat "$cpp_log"
  echo "error: building or running the GoogleTest suite failed (exit $cpp_rc, output above)" >&2
  exit 1
fi
# The build's own output only on failure (it is long); ctest's in full.
sed -n '/^Test project/,$p' "$cpp_log"
rm -f "$cpp_log"

echo "== torch range: header check output"
cat "$range_log"
rm -f "$range_log"
if [ "$range_rc" != 0 ]; then
  echo "error: csrc/ does not compile against a supported torch's headers (exit $range_rc, output above;" \
    "per file: bash scripts/check_torch_headers.sh VERSION)" >&2
  exit 1
fi

echo "== Python (pytest -m serial): timing-sensitive, one at a time"
pytest_pass -m serial "$@"
