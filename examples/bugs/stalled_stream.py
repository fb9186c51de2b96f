"""A stalled NCCL stream while every host runs ahead, on CPU (nccl_sim).

    python examples/bugs/stalled_stream.py

The guard wraps nccl_sim (TORCH_EXT_INNER=cpu:nccl_sim), the CPU backend with
NCCL's host semantics (docs/testing.md): collectives are queued on a stream and
return at once. Rank 2's stream stops before its 10th collective
(TORCH_EXT_NCCL_SIM_STALL=2:10), as a hung kernel does, while every host issues
all 60 all_reduces and then waits at its sync point, nccl_sim.synchronize() (on
a GPU: torch.cuda.synchronize() or .item()), with no timeout of its own. At 2 s
the guard reports collective #10, the one the streams are stuck in, not #60, the
last one issued; at 4 s it aborts the streams and every rank raises
CollectiveTimeoutError from synchronize() instead of reading the sum.
"""
import torch
import torch.distributed as dist

from _launch import launch


def train(rank: int, world: int) -> None:
    from torch_ext.testing import nccl_sim

    t = torch.ones(4)
    for _ in range(60):
        dist.all_reduce(t)  # queued: returns at once
    nccl_sim.synchronize()  # where a GPU program would call .item()
    print(f"[rank{rank}] sum {t[0].item()}")  # never reached: rank 2's stream is stuck


if __name__ == "__main__":
    launch(train, 3, TORCH_EXT_INNER="cpu:nccl_sim", TORCH_EXT_NCCL_SIM_STALL="2:10", TORCH_EXT_WARN_AFTER="2",
           TORCH_EXT_ABORT_AFTER="4")
