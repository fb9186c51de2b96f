#!/usr/bin/env bash
# Sets up a fresh machine and runs every test: the linters, the GoogleTest suite
# of the C++ core, pytest (multi-process tests on gloo over loopback) and the
# packaging tests (sdist, wheel, lowest setuptools, each installed outside the tree).
#
# Arranged for a 2-core machine (docs/testing.md, "CI time"):
# - the C++ work that only compiles runs in the background at the lowest CPU
#   priority (SCHED_IDLE: it gets a core only while no test wants it, so it does
#   not stretch a test's deadline): the check of the sources against the headers
#   of torch 2.11 and 2.15 (the range's ends; CI builds and tests on 2.13; one
#   translation unit each) from the start, the GoogleTest binary (two unity units,
#   linking the core objects of the extension build) once the set-up is done;
#   ctest runs at normal priority as soon as its binary is there (3 CPU-s over
#   16 s: its tests wait on their own short deadlines); all of it is done (and its
#   output shown) before the serial tests start;
# - pytest runs five tests at a time (pytest-xdist; the packaging tests among
#   them, on one worker): most tests wait on deadlines and other processes part of
#   the time (four used 1.6 of the two cores: docs/testing.md, "CI time"); then the
#   tests marked `serial`, whose assertions time the guard against the clock, one
#   at a time. The programs the tests start are forked from an interpreter that
#   imported torch once (torch_ext/testing/_warm.py).
# PYTEST_WORKERS=N: N tests at a time (default 5; 0: one at a time, in one process).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# Background jobs, each in a process group of its own (setsid), so that a failing
# step ends them with this script (the trap), compilers included.
groups=()
trap 'for g in "${groups[@]}"; do kill -- -"$g" 2>/dev/null || true; done' EXIT
# The lowest CPU priority there is: SCHED_IDLE where the kernel offers it, else nice 19.
if chrt -i 0 true 2>/dev/null; then IDLE=(chrt -i 0); else IDLE=(nice -n 19); fi

# The torch range (issue 41): csrc/ against the oldest and newest supported
# torch's headers, syntax only, every source in one translation unit (--unity:
# about 20 CPU-s a release); the headers are fetched from the package index
# (about 10 MB each). (A machine without a C++ compiler yet gets one from the
# set-up first.)
range_log=$(mktemp)
range_pid=""
start_range() {
  setsid "${IDLE[@]}" bash -c 'bash scripts/check_torch_headers.sh --unity 2.11.0 &&
    bash scripts/check_torch_headers.sh --unity 2.15.0' >"$range_log" 2>&1 &
  range_pid=$!
  groups+=("$range_pid")
}
if command -v g++ >/dev/null 2>&1; then start_range; fi

# Everything the tests need but the GoogleTest binary, which is built below.
bash scripts/setup.sh test --no-cpp-tests
[ -n "$range_pid" ] || start_range

# The GoogleTest binary, then its tests at normal priority.
cpp_log=$(mktemp)
setsid bash -c '"$@" bash scripts/setup.sh cpp-tests && ctest --test-dir tests/cpp/build --output-on-failure' \
  _ "${IDLE[@]}" >"$cpp_log" 2>&1 &
cpp_pid=$!
groups+=("$cpp_pid")

echo "== Lint (ruff, clang-format: scripts/lint.sh)"
bash scripts/lint.sh

# The tree's Python byte-compiled once (0.4 s): where PYTHONDONTWRITEBYTECODE is set (as on the CI
# kind of machine) nothing writes a .pyc, and each of the 2,000-odd processes the tests fork or start
# compiled torch_ext and its test's module from source again (about 30 ms each; test_paths and
# test_verify: 124 -> 110 CPU-s). Stale files are rewritten by their sources' times.
"$PY" -m compileall -q -j 0 torch_ext tests examples benchmarks scripts >/dev/null

pytest_pass() {
  local rc=0
  "$PY" -m pytest tests/python "$@" || rc=$?
  # 5: the arguments selected none of them (e.g. -k for a test of another pass).
  [ "$rc" = 0 ] || [ "$rc" = 5 ] || exit "$rc"
}

# -m replaces pyproject.toml's "not packaging and not sweep": the packaging tests (sdist -> wheel,
# lowest setuptools, installed outside the tree) run in this pass, on one worker.
echo "== Python (pytest -m 'not serial', ${PYTEST_WORKERS:-5} at a time), packaging tests included;" \
  "C++ builds at idle priority beside it"
pytest_pass -n "${PYTEST_WORKERS:-5}" --dist loadgroup -m "not serial and not sweep" "$@"

# finish NAME PID LOG HINT: the background job's output; its failure fails the run.
finish() {
  local rc=0
  wait "$2" || rc=$?
  cat "$3"
  rm -f "$3"
  if [ "$rc" != 0 ]; then
    echo "error: $1 failed (exit $rc, output above; $4)" >&2
    exit 1
  fi
}
# Before the serial tests: nothing in the background while they time the guard against the clock
# (the C++ work is done by now unless something else took the idle CPU during the pass).
echo "== torch range: header check output"
finish "the check against a supported torch's headers" "$range_pid" "$range_log" \
  "per file: bash scripts/check_torch_headers.sh VERSION"
echo "== C++ (GoogleTest): build and ctest output"
finish "the GoogleTest suite" "$cpp_pid" "$cpp_log" "rebuild: bash scripts/setup.sh cpp-tests"
trap - EXIT

echo "== Python (pytest -m serial): timing-sensitive, one at a time"
pytest_pass -m serial "$@"
