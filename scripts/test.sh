#!/usr/bin/env bash
# Sets up a fresh machine and runs every test: the linters, the GoogleTest suite
# of the C++ core, pytest (multi-process tests on gloo over loopback) and the
# packaging tests (sdist, wheel, lowest setuptools, each installed outside the tree).
#
# Arranged for a 2-core machine (docs/testing.md, "CI time"):
# - the C++ work is done before any test that times a deadline runs, where the
#   set-up leaves the CPU idle: setup.sh builds the GoogleTest binary (two unity
#   units, linking the core objects of its extension build) while the test packages
#   download, and the check of the sources against the headers of torch 2.11 and
#   2.15 (the range's ends; CI builds and tests on 2.13; one translation unit
#   each) runs from the start, beside the set-up;
# - ctest then runs beside the first pytest pass (3 CPU-s over 16 s: its tests
#   wait on their own short deadlines);
# - pytest runs four tests at a time (pytest-xdist; the packaging tests among
#   them, on one worker): most tests wait on deadlines and other processes part of
#   the time (three left a sixth of the two cores idle: docs/testing.md); then the tests marked `serial`, whose assertions time the guard
#   against the clock, one at a time. The programs the tests start are forked from
#   an interpreter that imported torch once (torch_ext/testing/_warm.py).
# PYTEST_WORKERS=N: N tests at a time (default 4; 0: one at a time, in one process).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# The torch range (issue 41), from the start: csrc/ against the oldest and newest
# supported torch's headers, syntax only, every source in one translation unit
# (--unity: about 20 CPU-s a release); the headers are fetched from the package
# index (about 10 MB each). In a process group of its own (setsid), so that a
# failing step ends it with this script (the trap), compilers included.
# (A machine without a C++ compiler yet gets one from the set-up first.)
range_log=$(mktemp)
start_range() {
  setsid bash -c 'bash scripts/check_torch_headers.sh --unity 2.11.0 && bash scripts/check_torch_headers.sh --unity 2.15.0' \
    >"$range_log" 2>&1 &
  range_pid=$!
  trap 'kill -- -"$range_pid" 2>/dev/null || true' EXIT
}
range_pid=""
if command -v g++ >/dev/null 2>&1; then start_range; fi

bash scripts/setup.sh test  # everything the tests need, not only what the demo uses; builds the C++ tests
[ -n "$range_pid" ] || start_range

echo "== Lint (ruff, clang-format: scripts/lint.sh)"
bash scripts/lint.sh

echo "== torch range: header check output"
range_rc=0
wait "$range_pid" || range_rc=$?
trap - EXIT
cat "$range_log"
rm -f "$range_log"
if [ "$range_rc" != 0 ]; then
  echo "error: csrc/ does not compile against a supported torch's headers (exit $range_rc, output above;" \
    "per file: bash scripts/check_torch_headers.sh VERSION)" >&2
  exit 1
fi

echo "== C++ (GoogleTest, built by setup.sh): ctest beside the first pytest pass, output after it"
# 3 CPU-s over 16 s: its tests wait on their own short deadlines. In its own process
# group, so that the trap ends it if a step below fails.
cpp_log=$(mktemp)
setsid ctest --test-dir tests/cpp/build --output-on-failure >"$cpp_log" 2>&1 &
cpp_pid=$!
trap 'kill -- -"$cpp_pid" 2>/dev/null || true' EXIT

pytest_pass() {
  local rc=0
  "$PY" -m pytest tests/python "$@" || rc=$?
  # 5: the arguments selected none of them (e.g. -k for a test of another pass).
  [ "$rc" = 0 ] || [ "$rc" = 5 ] || exit "$rc"
}

# -m replaces pyproject.toml's "not packaging and not sweep": the packaging tests (sdist -> wheel,
# lowest setuptools, installed outside the tree) run in this pass, on one worker.
echo "== Python (pytest -m 'not serial', ${PYTEST_WORKERS:-4} at a time), packaging tests included"
pytest_pass -n "${PYTEST_WORKERS:-4}" --dist loadgroup -m "not serial and not sweep" "$@"

echo "== C++ (GoogleTest): ctest output"
cpp_rc=0
wait "$cpp_pid" || cpp_rc=$?
trap - EXIT
cat "$cpp_log"
rm -f "$cpp_log"
if [ "$cpp_rc" != 0 ]; then
  echo "error: the GoogleTest suite failed (exit $cpp_rc, output above)" >&2
  exit 1
fi

echo "== Python (pytest -m serial): timing-sensitive, one at a time"
pytest_pass -m serial "$@"
