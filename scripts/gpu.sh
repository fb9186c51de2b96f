#!/usr/bin/env bash
# One command for a machine with a GPU (issue 24): what CPU CI cannot run.
#
#   bash scripts/gpu.sh
#
# 1. Checks that a GPU is there (nvidia-smi, torch.cuda.is_available()) and prints the
#    GPU model, driver, CUDA, torch and NCCL versions. Without a GPU it stops at once
#    with one line (exit 1), before anything else runs.
# 2. pytest -m gpu: the GPU tests, with TORCH_EXT_GPU_RUNNER=1 (unless set otherwise)
#    so that a test needing more GPUs than this machine has fails instead of skipping.
# 3. tests/python/test_device_path.py against real NCCL, twice:
#    TORCH_EXT_DEVICE_PATH_INNER=cuda:nccl (its world-1 cases on NCCL) and cuda:gloo
#    (its multi-rank cases on one GPU). If the file is not in this tree, says so and
#    goes on (reported as NOT RUN in the summary).
# 4. The GPU benchmarks, whose figures it prints: the host cost per collective, guard
#    vs plain nccl, 4 B and 4 MB all_reduce at world 1 (benchmarks/overhead.py --device
#    cuda); a DDP training step with 24 gradient buckets, guard vs nccl, world 1
#    (benchmarks/train_step.py --device cuda); the stream gate's costs: a hold's
#    launch, release and poison latency (benchmarks/stream_gate.py).
#
# Every part runs even when one before it failed; a summary ends the output, and the
# exit status is non-zero if any part failed. Everything printed is also written to
# gpu-report.txt in $OUT if set, else in ./gpu-report/ (the repository root's).
# It builds and installs nothing: torch (a CUDA build), pytest, pytest-timeout and
# torch_ext (built against that torch) must be importable by $PYTHON (default python3).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}

# --- 1. the GPU: one line and exit 1 where there is none --------------------------------
no_gpu() {
  echo "gpu.sh: no GPU here: $*; run it on a machine with an NVIDIA GPU, its driver and a CUDA build of torch" >&2
  exit 1
}
command -v nvidia-smi >/dev/null 2>&1 || no_gpu "nvidia-smi is not on PATH (no NVIDIA driver)"
nvidia-smi -L >/dev/null 2>&1 || no_gpu "nvidia-smi fails ($(nvidia-smi -L 2>&1 | head -n 1))"
why=$("$PY" -c '
import torch
if torch.version.cuda is None:
    print(f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)")
elif not torch.cuda.is_available() or torch.cuda.device_count() == 0:
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device (torch.cuda.is_available() is False)")
' 2>&1) || no_gpu "$PY cannot import torch ($(echo "$why" | tail -n 1))"
[ -z "$why" ] || no_gpu "$why"

OUT_DIR=${OUT:-$PWD/gpu-report}
mkdir -p "$OUT_DIR" || { echo "gpu.sh: cannot create the report folder $OUT_DIR" >&2; exit 1; }
REPORT=$OUT_DIR/gpu-report.txt

export TORCH_EXT_GPU_RUNNER=${TORCH_EXT_GPU_RUNNER:-1}
export PYTHONUNBUFFERED=1
DEVICE_PATH_TEST=tests/python/test_device_path.py

results=()  # "STATUS  part" lines for the summary
failed=0

# part NAME COMMAND...: runs it, records PASS/FAIL with its exit status and time.
part() {
  local name=$1 rc=0 start
  shift
  echo
  echo "== $name"
  echo "\$ $*"
  start=$(date +%s)
  "$@" || rc=$?
  local took=$(( $(date +%s) - start ))
  if [ "$rc" = 0 ]; then
    results+=("PASS     $name (${took} s)")
  else
    results+=("FAIL     $name (exit $rc, ${took} s)")
    failed=1
  fi
}

header() {
  echo "== GPU machine: $(hostname), $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs"
  echo "torch_ext commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv 2>/dev/null \
    || nvidia-smi -L
  echo "driver's CUDA: $(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9.]*' | head -n 1 || true)"
  "$PY" - <<'EOF'
import torch
import torch.distributed as dist

nccl = ".".join(map(str, torch.cuda.nccl.version())) if dist.is_nccl_available() else "not available"
print(f"python torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
      f"NCCL {nccl}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"  cuda:{i} {p.name}, {p.total_memory / 2**30:.1f} GiB, compute capability {p.major}.{p.minor}")
try:
    import torch_ext
    print(f"torch_ext {torch_ext.__version__} from {torch_ext.__file__}")
except Exception as e:  # noqa: BLE001
    print(f"torch_ext does not import: {type(e).__name__}: {e}")
EOF
  echo "TORCH_EXT_GPU_RUNNER=$TORCH_EXT_GPU_RUNNER"
  local gpus
  gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
  if [ "$gpus" -lt 2 ] && [ "$TORCH_EXT_GPU_RUNNER" = 1 ]; then
    echo "note: $gpus GPU visible; the tests marked gpu(count=2) need 2, so with TORCH_EXT_GPU_RUNNER=1 they fail here"
    echo "      (TORCH_EXT_GPU_RUNNER=0 bash scripts/gpu.sh skips them instead)"
  elif [ "$gpus" -lt 2 ]; then
    echo "note: $gpus GPU visible; the tests marked gpu(count=2) need 2: skipped here (TORCH_EXT_GPU_RUNNER=0)"
  fi
}

device_path() {
  local inner=$1
  if [ ! -f "$DEVICE_PATH_TEST" ]; then
    echo "gpu.sh: $DEVICE_PATH_TEST is not in this tree (issue 24's device-path tests): not run with $inner"
    results+=("NOT RUN  device-path tests, TORCH_EXT_DEVICE_PATH_INNER=$inner ($DEVICE_PATH_TEST missing)")
    return 0
  fi
  part "device-path tests on the GPU: TORCH_EXT_DEVICE_PATH_INNER=$inner" \
    env TORCH_EXT_DEVICE_PATH_INNER="$inner" "$PY" -m pytest "$DEVICE_PATH_TEST" -ra -p no:cacheprovider
}

main() {
  header
  part "GPU tests: pytest -m gpu" "$PY" -m pytest -m gpu -ra -p no:cacheprovider
  device_path cuda:nccl
  device_path cuda:gloo
  part "benchmark: host cost per collective, guard vs nccl, world 1" \
    "$PY" benchmarks/overhead.py --device cuda --rounds 31
  part "benchmark: DDP training step (24 buckets), guard vs nccl, world 1" \
    "$PY" benchmarks/train_step.py --device cuda --model ddp --rounds 21 --steps 20
  part "benchmark: the stream gate on CUDA (hold, release and poison latency)" \
    "$PY" benchmarks/stream_gate.py --rounds 21
  echo
  echo "== summary"
  printf '%s\n' "${results[@]}"
  if [ "$failed" = 0 ]; then
    echo "gpu.sh: every part that ran passed; report: $REPORT"
  else
    echo "gpu.sh: FAILED (see above); report: $REPORT"
  fi
  return "$failed"
}

main 2>&1 | tee "$REPORT"
exit "${PIPESTATUS[0]}"
