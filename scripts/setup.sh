#!/usr/bin/env bash
# Installs everything torch_ext needs on a fresh machine, then builds it in place.
# Idempotent: re-running only rebuilds what changed (the objects stay in build/,
# and ninja recompiles only sources whose inputs changed), in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

# Debian packages (need root or sudo): GoogleTest and cmake for the C++ suite;
# ccache, which torch's extension build uses when present: a build in another
# folder (the packaging tests' sdist and wheels) reuses the objects compiled here;
# and a headless Chromium that renders diagnose's HTML page in
# tests/python/test_post_mortem.py (without it that test skips). Chromium is the
# biggest download (about 30 s on a fresh machine) and nothing before the tests
# needs it, so it installs in the background, while pip installs and the extension
# compiles; the end of this script waits for it.
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
apt_updated=""
apt_install() {
  [ -n "$apt_updated" ] || { $SUDO apt-get update -qq && apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
if [ ! -f /usr/lib/x86_64-linux-gnu/libgtest.a ] && [ ! -f /usr/lib/libgtest.a ] && [ ! -d /usr/include/gtest ]; then
  apt_install libgtest-dev cmake $(command -v ccache >/dev/null || echo ccache)
elif ! command -v ccache >/dev/null; then
  apt_install ccache || echo "note: ccache could not be installed; builds in new folders compile from scratch"
fi
chromium_pid=""
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  chromium_log=$(mktemp)
  ( apt_install chromium ) >"$chromium_log" 2>&1 &
  chromium_pid=$!
fi

# torch first, alone: 2.13.0 is the CPU build on this kind of machine (a bare
# "torch" would pull a multi-GB CUDA build).
"$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
  || pip_install "torch==2.13.0"
# The setuptools floor is pyproject.toml's (the version the packaging tests build with).
SETUPTOOLS=$(grep -o '"setuptools>=[0-9.]*"' pyproject.toml | tr -d '"')
pip_install "$SETUPTOOLS" build ninja packaging pytest pytest-timeout pytest-xdist expecttest "lightning==2.6.6" "webdataset==1.0.2" \
  "accelerate==1.15.0"

# Build the extension against the installed torch (no build isolation: it would
# download a CUDA torch).
MAX_JOBS=${MAX_JOBS:-2} pip_install --no-build-isolation -e .

if [ -n "$chromium_pid" ]; then
  if ! wait "$chromium_pid"; then
    cat "$chromium_log" >&2
    echo "error: installing chromium failed (output above)" >&2
    exit 1
  fi
  rm -f "$chromium_log"
fi
