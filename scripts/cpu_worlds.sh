#!/usr/bin/env bash
# The default's cost at worlds 4 and 8 with a core per rank (issue 70): what a 2-core machine
# cannot measure, where three or four ranks share two cores and a step's wall time follows the
# scheduler as much as the work (docs/performance.md, "Where issue 70 stands").
#
#   bash scripts/cpu_worlds.sh                  # worlds 4 and 8
#   WORLDS="4 6 8" bash scripts/cpu_worlds.sh
#
# Runs on CPU (gloo over loopback), one part after another, each under a time limit:
#   1. benchmarks/cost.py at those worlds, quiet (--no-busy: a busy process needs a core to spare);
#   2. benchmarks/train_step.py, DDP and FSDP2, at each world.
# Needs at least as many cores as the largest world (plus one): with fewer it stops at once with
# one line (exit 1), since shared cores are what it is meant to avoid. Everything printed is also
# written to cpu-worlds-report.txt in $OUT if set, else in ./gpu-report/. It builds and installs
# nothing: torch and torch_ext must be importable by $PYTHON (default python3). The 16-core
# machine that `scripts/gpu.sh` runs on serves; run it there as a second call after gpu.sh.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
WORLDS=${WORLDS:-4 8}
LIMIT=${PART_LIMIT_S:-240}  # seconds a part may take before it is stopped and reported

largest=0
for w in $WORLDS; do
  case $w in '' | *[!0-9]*) echo "cpu_worlds.sh: WORLDS holds '$w', not a whole number (e.g. WORLDS=\"4 8\")" >&2; exit 2 ;; esac
  [ "$w" -gt "$largest" ] && largest=$w
done
cores=$(nproc)
if [ "$cores" -le "$largest" ]; then
  echo "cpu_worlds.sh: $cores cores here, world $largest needs $((largest + 1)) (a core per rank and one spare); run it on a machine with more cores or set WORLDS lower" >&2
  exit 1
fi

OUT_DIR=${OUT:-$PWD/gpu-report}
mkdir -p "$OUT_DIR" || { echo "cpu_worlds.sh: cannot create the report folder $OUT_DIR" >&2; exit 1; }
REPORT=$OUT_DIR/cpu-worlds-report.txt
export PYTHONUNBUFFERED=1
failed=0

part() {
  local name=$1 rc=0 start=$SECONDS
  shift
  echo
  echo "== $name"
  echo "\$ $*"
  timeout "$LIMIT" "$@" || rc=$?
  echo "-- $name: exit $rc after $((SECONDS - start)) s"
  [ "$rc" = 0 ] || failed=1
}

main() {
  echo "cpu_worlds.sh: $cores cores, worlds $WORLDS, $("$PY" -c 'import torch; print("torch", torch.__version__)')"
  # shellcheck disable=SC2086  # WORLDS is a list of numbers
  part "cost.py: verify and async against gloo, quiet" "$PY" benchmarks/cost.py --worlds $WORLDS --no-busy
  for w in $WORLDS; do
    part "train_step.py: DDP and FSDP2, world $w" "$PY" benchmarks/train_step.py --world "$w" --rounds 11 --steps 4
  done
  echo
  if [ "$failed" = 0 ]; then echo "cpu_worlds.sh: every part passed; report: $REPORT"; else echo "cpu_worlds.sh: FAILED (see above); report: $REPORT"; fi
  return "$failed"
}

main 2>&1 | tee "$REPORT"
exit "${PIPESTATUS[0]}"
