#!/usr/bin/env bash
# Does csrc/ compile against another torch's headers? (issue 41) A syntax check,
# without building or installing anything: every csrc/**/*.cpp goes through
# `g++ -fsyntax-only -std=c++20` with setup.py's include paths and defines.
#
#   bash scripts/check_torch_headers.sh 2.11.0          # a release: its headers fetched once (below)
#   bash scripts/check_torch_headers.sh torch-2.11.0-cp312-....whl   # a wheel on disk
#   bash scripts/check_torch_headers.sh /path/to/torch/include       # unpacked headers
#   bash scripts/check_torch_headers.sh                 # the installed torch's headers
#   bash scripts/check_torch_headers.sh --unity 2.15.0  # every file in one translation unit
#
# --unity: one translation unit that includes every source, so torch's headers
# are parsed once, not once per file: about 15 CPU-s instead of 2 to 5 minutes
# (what CI runs, scripts/test.sh). It needs names private to a file (anonymous
# namespaces, statics) not to collide between files; a failure prints the
# compiler's errors, and the per-file run (without --unity) says which file fails.
# A wheel is unpacked (its torch/include only, about 60 MB) into
# ~/.cache/torch_ext/headers/<version>/ ($TORCH_EXT_HEADER_CACHE), once. A release
# is fetched there by scripts/fetch_torch_headers.py: only the ~10 MB of the
# wheel that holds torch/include, by HTTP range requests to the package index
# ($PIP_INDEX_URL or pypi.org), from the linux x86_64 wheel for Python 3.12
# (what the GPU runners use); a second or two, where pip would download the
# whole 530 MB wheel. Override the wheel's tags with TORCH_EXT_WHEEL_PYTHON (3.12)
# and TORCH_EXT_WHEEL_PLATFORM (manylinux_2_28_x86_64).
#
# Prints one line per failing file (its first error; the full log is kept under
# the log folder it names), then a summary. Exit status 1 if any file fails,
# 2 on a usage or download error. csrc/python/*.cpp use this machine's Python
# headers (python3's, or $PYTHON's), whatever Python the torch was built for:
# fine for a syntax check. JOBS (default 2) files compile at once.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
JOBS=${JOBS:-2}
CACHE=${TORCH_EXT_HEADER_CACHE:-$HOME/.cache/torch_ext/headers}
WHEEL_PYTHON=${TORCH_EXT_WHEEL_PYTHON:-3.12}
WHEEL_PLATFORM=${TORCH_EXT_WHEEL_PLATFORM:-manylinux_2_28_x86_64}

die() { echo "check_torch_headers: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit "${1:-2}"; }

# Unpacks the headers of wheel $1 into $2 (torch/include/...), atomically.
unpack_wheel() {
  local wheel=$1 dest=$2
  command -v unzip >/dev/null || die "unzip is not installed (apt-get install unzip)"
  mkdir -p "$(dirname "$dest")"
  local partial
  partial=$(mktemp -d "$dest.partial.XXXXXX")
  unzip -q "$wheel" 'torch/include/*' -d "$partial" || { rm -rf "$partial"; die "cannot unpack torch/include from $wheel"; }
  printf '%s %s bytes\n' "$(basename "$wheel")" "$(stat -c %s "$wheel")" >"$partial/wheel.txt"
  rm -rf "$dest"
  mv "$partial" "$dest"
}

# Sets INCLUDE to the torch/include folder that argument $1 names.
resolve() {
  local arg=$1
  if [[ -z $arg ]]; then
    INCLUDE=$("$PY" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "include"))') \
      || die "no argument and $PY cannot import torch"
  elif [[ -d $arg ]]; then
    INCLUDE=$(cd "$arg" && pwd)
    [[ -d $INCLUDE/torch/include/torch ]] && INCLUDE=$INCLUDE/torch/include  # an unpacked wheel's root
  elif [[ -f $arg && $arg == *.whl ]]; then
    local name version
    name=$(basename "$arg")
    version=${name#torch-}; version=${version%%-*}
    [[ $name == torch-* && -n $version ]] || die "$arg is not a torch wheel (torch-<version>-...whl)"
    if [[ ! -d $CACHE/$version/torch/include ]]; then
      echo "check_torch_headers: unpacking the headers of $name into $CACHE/$version"
      unpack_wheel "$arg" "$CACHE/$version"
    fi
    INCLUDE=$CACHE/$version/torch/include
  elif [[ $arg =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?([a-z0-9.+]*)$ ]]; then
    if [[ ! -d $CACHE/$arg/torch/include ]]; then
      "$PY" "$ROOT/scripts/fetch_torch_headers.py" "$arg" "$CACHE/$arg" \
        --python "$WHEEL_PYTHON" --platform "$WHEEL_PLATFORM" || exit 2
    fi
    INCLUDE=$CACHE/$arg/torch/include
  else
    case $arg in -h|--help) usage 0 ;; esac
    die "not a torch version, a wheel or a directory: $arg"
  fi
  [[ -d $INCLUDE/torch/csrc/api/include ]] || die "$INCLUDE is not a torch include folder (no torch/csrc/api/include)"
}

UNITY=""
if [[ ${1:-} == --unity ]]; then UNITY=1; shift; fi
[[ $# -le 1 ]] || usage
resolve "${1:-}"
VERSION=$(sed -n 's/^#define TORCH_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' \
  "$INCLUDE/torch/headeronly/version.h" "$INCLUDE/torch/csrc/api/include/torch/version.h" 2>/dev/null | head -n 3 | paste -sd.)
PY_INCLUDE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')

# setup.py's include paths and defines (CppExtension adds torch's two folders and
# Python's; TORCH_API_INCLUDE_EXTENSION_H and TORCH_EXTENSION_NAME come from
# BuildExtension). A response file keeps paths with spaces whole through xargs.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/check_torch_headers.XXXXXX")
for flag in -fsyntax-only -std=c++20 -Wno-unused-parameter \
    -I"$ROOT/csrc" -I"$INCLUDE" -I"$INCLUDE/torch/csrc/api/include" -I"$PY_INCLUDE" \
    -D_GLIBCXX_USE_CXX11_ABI=1 -DTORCH_EXTENSION_NAME=_C -DTORCH_API_INCLUDE_EXTENSION_H; do
  printf '"%s"\n' "$(printf '%s' "$flag" | sed 's/[\\"]/\\&/g')"
done >"$WORK/flags"

cd "$ROOT"
mapfile -d '' SOURCES < <(find csrc -name '*.cpp' -print0 | sort -z)
[[ ${#SOURCES[@]} -gt 0 ]] || die "no .cpp files under $ROOT/csrc"
how="$JOBS at a time"
[[ -z $UNITY ]] || how="in one translation unit"
echo "check_torch_headers: ${#SOURCES[@]} files against torch ${VERSION:-?} ($INCLUDE), $how"

start=$SECONDS
export WORK CXX=${CXX:-g++}
if [[ -n $UNITY ]]; then
  for src in "${SOURCES[@]}"; do printf '#include "%s"\n' "$ROOT/$src"; done >"$WORK/unity.cpp"
  if ! "$CXX" @"$WORK/flags" "$WORK/unity.cpp" >"$WORK/unity.log" 2>&1; then
    grep -E 'error' "$WORK/unity.log" | head -n 20 | sed "s|$ROOT/||"
    echo "check_torch_headers: torch ${VERSION:-?}: the ${#SOURCES[@]} files in one translation unit FAILED" \
      "in $((SECONDS - start)) s (first errors above; full log: $WORK/unity.log). Which file: run it without --unity." \
      "A name defined in two files' anonymous namespaces collides here: share it or rename one."
    exit 1
  fi
  rm -rf "$WORK"
  echo "check_torch_headers: torch ${VERSION:-?}: all ${#SOURCES[@]} files compile (-fsyntax-only -std=c++20," \
    "one translation unit) in $((SECONDS - start)) s"
  exit 0
fi
# Each file: its log as $WORK/logs/<path with / as __>.log, and ok/ or failed/ marked.
mkdir -p "$WORK/logs" "$WORK/ok" "$WORK/failed"
printf '%s\0' "${SOURCES[@]}" | xargs -0 -n 1 -P "$JOBS" bash -c '
  key=${1//\//__}
  if "$CXX" @"$WORK/flags" "$1" >"$WORK/logs/$key.log" 2>&1; then touch "$WORK/ok/$key"; else touch "$WORK/failed/$key"; fi
' _

failed=0
for src in "${SOURCES[@]}"; do
  key=${src//\//__}
  if [[ -e $WORK/failed/$key ]]; then
    failed=$((failed + 1))
    first=$(grep -m 1 -E 'error|Error' "$WORK/logs/$key.log" || head -n 1 "$WORK/logs/$key.log")
    echo "FAIL $src: $first"
  elif [[ ! -e $WORK/ok/$key ]]; then
    failed=$((failed + 1))
    echo "FAIL $src: not compiled (interrupted?)"
  fi
done
elapsed=$((SECONDS - start))
if [[ $failed -gt 0 ]]; then
  echo "check_torch_headers: torch ${VERSION:-?}: $failed of ${#SOURCES[@]} files FAILED in ${elapsed} s; full logs in $WORK/logs"
  exit 1
fi
rm -rf "$WORK"
echo "check_torch_headers: torch ${VERSION:-?}: all ${#SOURCES[@]} files compile (-fsyntax-only -std=c++20) in ${elapsed} s"
