#!/usr/bin/env bash
# Sets up a fresh machine and runs every test: the GoogleTest suite of the C++
# core, pytest (multi-process tests on gloo over loopback), then the packaging
# tests (sdist, wheel, lowest setuptools, each installed outside the tree).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}

echo "== C++ (GoogleTest)"
TORCH_CMAKE=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
# The suite links the core objects that setup.sh's extension build compiled (in
# setup.py's build folder, build/temp.<platform>-<python tag>) instead of
# compiling the core a second time; see tests/cpp/CMakeLists.txt.
BUILD_TEMP=$("$PY" -c 'import sys, sysconfig; print(f"build/temp.{sysconfig.get_platform()}-{sys.implementation.cache_tag}")')
cmake -S tests/cpp -B tests/cpp/build -DCMAKE_PREFIX_PATH="$TORCH_CMAKE" -DCMAKE_BUILD_TYPE=Release \
  -DTORCH_EXT_BUILD_TEMP="$PWD/$BUILD_TEMP" >/dev/null
cmake --build tests/cpp/build -j "${MAX_JOBS:-2}" >/dev/null
ctest --test-dir tests/cpp/build --output-on-failure

echo "== Python (pytest)"
"$PY" -m pytest tests/python "$@"

echo "== Packaging (pytest -m packaging): sdist -> wheel, lowest setuptools, installed outside the tree"
rc=0
"$PY" -m pytest tests/python "$@" -m packaging || rc=$?
# 5: the arguments selected none of them (e.g. -k for another test).
[ "$rc" = 0 ] || [ "$rc" = 5 ] || exit "$rc"
