#!/usr/bin/env bash
# Sets up a machine for torch_ext and builds it in place.
#
#   bash scripts/setup.sh demo      what scripts/demo.sh needs: a C++ compiler and Python headers
#                                   (Debian packages, only if missing), torch 2.13.0 CPU, setuptools
#                                   and ninja, then the extension build
#   bash scripts/setup.sh [test]    the same, plus what the tests need (scripts/test.sh): GoogleTest,
#                                   cmake, ccache and a headless Chromium (Debian packages), pytest,
#                                   lightning, webdataset, accelerate, torchmetrics, ruff, clang-format,
#                                   and the GoogleTest suite's binary (tests/cpp/build), built while
#                                   the packages download
#   bash scripts/setup.sh cpp-tests only the GoogleTest suite's binary, against the extension's build
#   --no-cpp-tests                  (with test) all of it but the GoogleTest binary: scripts/test.sh
#                                   builds it itself, at the lowest CPU priority, beside the tests
#   --dry-run                       print the stages it would run, run none
#
# One progress line per stage, with its expected time; the installers' and the
# build's output goes to a log file whose path is printed if a stage fails.
# Debian packages need root or password-less sudo; without either, and with a
# package missing, it stops at once with one line naming the packages and the
# command that installs them. Idempotent: a re-run installs nothing new and the
# build recompiles only what changed (objects stay in build/), in seconds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY=${PYTHON:-python3}
TORCH_VERSION=2.13.0
DRY=""
LOG=""

say() { echo "setup: $*"; }

# stage "WHAT (about N)" COMMAND...: one progress line; the command's output goes to the log.
stage() {
  local what=$1
  shift
  say "$what"
  [ -z "$DRY" ] || return 0
  [ -n "$LOG" ] || LOG=$(mktemp "${TMPDIR:-/tmp}/torch_ext_setup.XXXXXX.log")
  echo "== $what" >>"$LOG"
  if ! "$@" >>"$LOG" 2>&1; then
    echo "setup: error: this stage failed: $what; its last lines:" >&2
    tail -n 15 "$LOG" | sed 's/^/  | /' >&2
    echo "setup: full log: $LOG" >&2
    exit 1
  fi
}

# await WHAT PID LOG: waits for a stage started in the background; on failure
# shows the end of its log (kept) and fails.
await() {
  say "waiting for $1"
  if ! wait "$2"; then
    tail -n 15 "$3" | sed 's/^/  | /' >&2
    echo "setup: error: $1 failed; full log: $3" >&2
    return 1
  fi
  rm -f "$3"
}

# The prefix that installs Debian packages here: "" as root, "sudo" where sudo
# works without a password (or can ask for one on a terminal); fails otherwise.
admin_prefix() {
  if [ "$(id -u)" = 0 ]; then
    echo ""
  elif command -v sudo >/dev/null 2>&1 && { sudo -n true 2>/dev/null || [ -t 0 ]; }; then
    echo "sudo"
  else
    return 1
  fi
}

gtest_present() {
  [ -f /usr/lib/x86_64-linux-gnu/libgtest.a ] || [ -f /usr/lib/libgtest.a ] || [ -d /usr/include/gtest ]
}

have_chromium() {
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1
}

# The Debian packages MODE (demo|test) needs that are missing here, space-separated.
system_packages() {
  local pkgs=()
  command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || pkgs+=(g++)
  "$PY" -m pip --version >/dev/null 2>&1 || pkgs+=(python3-pip)
  "$PY" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
    2>/dev/null || pkgs+=(python3-dev)
  if [ "$1" = test ]; then
    gtest_present || pkgs+=(libgtest-dev)
    command -v cmake >/dev/null 2>&1 || pkgs+=(cmake)
    # ccache: torch's extension build uses it when present, so a build in another
    # folder (the packaging tests' sdist and wheels) reuses the objects compiled here.
    command -v ccache >/dev/null 2>&1 || pkgs+=(ccache)
  fi
  echo "${pkgs[*]}"
}

APT=""
apt_update() { $APT apt-get update -qq; }
apt_install() { DEBIAN_FRONTEND=noninteractive $APT apt-get install -y -qq --no-install-recommends "$@"; }
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }
torch_ok() { "$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; }

build_cpp_tests() {
  local torch_cmake build_temp
  torch_cmake=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  # setup.py's build folder, build/temp.<platform>-<python tag>: the objects to link.
  build_temp=$("$PY" -c 'import sys, sysconfig; print(f"build/temp.{sysconfig.get_platform()}-{sys.implementation.cache_tag}")')
  cmake -S tests/cpp -B tests/cpp/build -DCMAKE_PREFIX_PATH="$torch_cmake" -DCMAKE_BUILD_TYPE=Release \
    -DTORCH_EXT_BUILD_TEMP="$PWD/$build_temp" &&
    cmake --build tests/cpp/build -j "$MAX_JOBS"
}

main() {
  local mode=test arg cpp_tests=1
  for arg in "$@"; do
    case $arg in
      demo | test | cpp-tests) mode=$arg ;;
      --no-cpp-tests) cpp_tests="" ;;
      --dry-run) DRY=1 ;;
      *) echo "usage: bash scripts/setup.sh [demo|test|cpp-tests] [--no-cpp-tests] [--dry-run]" >&2; return 2 ;;
    esac
  done
  if [ "$mode" = cpp-tests ]; then
    export MAX_JOBS=${MAX_JOBS:-2}
    stage "building the C++ tests (GoogleTest: about 60 CPU-s)" build_cpp_tests
    [ -z "$LOG" ] || rm -f "$LOG"
    return 0
  fi
  local missing chromium=""
  missing=$(system_packages "$mode")
  if [ "$mode" = test ] && ! have_chromium; then chromium=1; fi
  if [ -n "$missing" ] || [ -n "$chromium" ]; then
    if ! APT=$(admin_prefix); then
      if [ -n "$missing" ]; then
        echo "setup: error: the $mode needs the Debian packages $missing, and installing them needs root:" \
          "run 'sudo apt-get install -y $missing' (or ask an administrator), then run this again" >&2
        return 1
      fi
      say "note: no Chromium and no root to install it: the HTML page test (test_post_mortem) will skip"
      chromium=""
    fi
  fi

  if [ -n "$missing" ]; then
    stage "updating the Debian package lists (about 10 s)" apt_update
    stage "installing Debian packages: $missing (about 30 s)" apt_install $missing
  fi
  # Chromium renders diagnose's HTML page in tests/python/test_post_mortem.py. It is
  # the biggest download (about 30 s) and nothing before the tests needs it: it
  # installs in the background while pip installs and the extension compiles.
  local chromium_pid="" chromium_log=""
  if [ -n "$chromium" ]; then
    say "installing a headless Chromium in the background (for the HTML test, about 30 s)"
    if [ -z "$DRY" ]; then
      chromium_log=$(mktemp "${TMPDIR:-/tmp}/torch_ext_setup_chromium.XXXXXX.log")
      ( { [ -z "$missing" ] && apt_update || true; } && apt_install chromium ) >"$chromium_log" 2>&1 &
      chromium_pid=$!
    fi
  fi

  # torch first, alone: the CPU build, pinned (a bare "torch" would pull a multi-GB CUDA build).
  if torch_ok; then
    say "torch $TORCH_VERSION: already installed"
  else
    stage "installing torch $TORCH_VERSION (CPU build, about 1 min)" pip_install "torch==$TORCH_VERSION"
  fi
  # The setuptools floor is pyproject.toml's (the version the packaging tests build with).
  local setuptools
  setuptools=$(grep -o '"setuptools>=[0-9.]*"' pyproject.toml | tr -d '"')
  # packaging: torch_ext's own dependency besides torch, so that the extension's
  # install below adds nothing but torch_ext (it runs beside the test packages' install).
  stage "installing the build tools: $setuptools, ninja, packaging (a few seconds)" \
    pip_install "$setuptools" ninja packaging
  # The test packages download while the extension compiles: one waits on the
  # network, the other on the CPU. A second pip beside the extension's install
  # is safe: they install disjoint packages (the one above leaves the extension's
  # install nothing to add but itself).
  local packages_pid="" packages_log=""
  if [ "$mode" = test ]; then
    # The linters pinned: a new rule never fails a tree that passed (scripts/lint.sh). pytest below 9.2:
    # there pytest-xdist's loadgroup stops keeping a group on one worker (pytest-dev/pytest-xdist#1386;
    # tests/python/conftest.py refuses it), and each worker built the groups' fixtures again.
    say "installing the test packages in the background: pytest, lightning, webdataset, accelerate, torchmetrics," \
      "build, ruff, clang-format (about 1 min)"
    if [ -z "$DRY" ]; then
      packages_log=$(mktemp "${TMPDIR:-/tmp}/torch_ext_setup_packages.XXXXXX.log")
      pip_install build "pytest<9.2" pytest-timeout pytest-xdist expecttest "lightning==2.6.6" "webdataset==1.0.2" \
        "accelerate==1.15.0" "torchmetrics==1.9.0" "ruff==0.8.0" "clang-format==18.1.8" >"$packages_log" 2>&1 &
      packages_pid=$!
    fi
  fi

  # Against the installed torch, without build isolation (it would download a CUDA torch).
  local what="building the C++ extension (about 1 min on 2 cores)"
  if compgen -G "torch_ext/_C*.so" >/dev/null; then
    what="rebuilding the C++ extension (only what changed: seconds when nothing did)"
  fi
  export MAX_JOBS=${MAX_JOBS:-2}
  stage "$what" pip_install --no-build-isolation -e .
  if [ "$mode" = test ] && [ -n "$cpp_tests" ]; then
    # The C++ tests' binary, while the test packages download (CPU beside the network):
    # it links the core objects the extension build just compiled (tests/cpp/CMakeLists.txt).
    stage "building the C++ tests (GoogleTest: about 30 s on 2 cores, beside the downloads)" build_cpp_tests
  fi

  [ -z "$packages_pid" ] || await "the test packages' install" "$packages_pid" "$packages_log" || return 1
  [ -z "$chromium_pid" ] || await "the Chromium install" "$chromium_pid" "$chromium_log" || return 1
  [ -z "$LOG" ] || rm -f "$LOG"
  say "ready for the $mode${DRY:+ (dry run: nothing was installed or built)}"
}

# Run, unless sourced (a test sources it to exercise its functions).
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
