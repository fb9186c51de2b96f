#!/usr/bin/env bash
# Sets up this machine for the demo (only what it uses: torch, the build tools,
# the extension; scripts/setup.sh demo) and runs it: 4 CPU ranks on gloo under
# torchrun, with the guard catching a rank-0-only reduce, a rank that has not
# arrived, a rank that never arrives in time, and ranks that disagree on when to stop.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
echo "demo: 4 CPU ranks under torchrun, 4 scenes, about 15 s"
# torch's CPU wheel does not depend on numpy, and without it every process warns
# "Failed to initialize NumPy" once at import. Neither the demo nor torch_ext uses
# numpy, so that warning (torch's, about an optional package) is left out here.
export PYTHONWARNINGS="ignore:Failed to initialize NumPy${PYTHONWARNINGS:+,$PYTHONWARNINGS}"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} exec "${PYTHON:-python3}" -m torch.distributed.run --nproc-per-node 4 examples/demo.py
