#!/usr/bin/env bash
# Installs everything torch_ext needs on a fresh machine, then builds it in place.
# Idempotent: re-running only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

# torch first, alone: 2.13.0 is the CPU build on this kind of machine (a bare
# "torch" would pull a multi-GB CUDA build).
"$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
  || pip_install "torch==2.13.0"
pip_install "setuptools>=64" wheel ninja packaging pytest pytest-timeout pytest-xdist "lightning==2.6.6" "webdataset==1.0.2" \
  "accelerate==1.15.0"

# Debian packages (need root or sudo): GoogleTest for the C++ suite, and a headless
# Chromium that renders diagnose's HTML page in tests/python/test_post_mortem.py
# (about 30 s to install on a fresh machine; without it that test skips).
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
if [ ! -f /usr/lib/x86_64-linux-gnu/libgtest.a ] && [ ! -f /usr/lib/libgtest.a ] && [ ! -d /usr/include/gtest ]; then
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libgtest-dev cmake >/dev/null
fi
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    chromium >/dev/null
fi

# Build the extension against the installed torch (no build isolation: it would
# download a CUDA torch).
MAX_JOBS=${MAX_JOBS:-2} pip_install --no-build-isolation -e .
