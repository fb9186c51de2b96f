#!/usr/bin/env bash
# Sets up a fresh machine and runs the demo: 4 CPU ranks on gloo under torchrun,
# with the guard catching a rank-0-only reduce, a rank that has not arrived, a
# rank that never arrives in time, and ranks that disagree on when to stop.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m torch.distributed.run --nproc-per-node 4 examples/demo.py
