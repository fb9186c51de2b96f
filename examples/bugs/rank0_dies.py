"""Classic failure: rank 0 dies, and with it the TCPStore it hosts.

    python examples/bugs/rank0_dies.py               # rank 0 raises
    python examples/bugs/rank0_dies.py kill          # rank 0 is killed (the OOM killer's favourite)
    python examples/bugs/rank0_dies.py stop          # rank 0's host freezes

Launched the way SLURM srun, mpirun and Kubernetes launch ranks (plain env://),
rank 0's own process hosts the TCPStore, so its failure takes the guard's
cross-rank channel with it. The other ranks still fail fast, with
StoreLostError: its first line names the store, who hosts it and whether it
is gone or does not answer; then each rank's pending collective and what it
last knew of its peers. Every surviving process then ends by itself.
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from _launch import launch

FAULT = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else "raise"


def train(rank: int, world: int) -> None:
    for step in range(100):
        time.sleep(0.25)  # stands for a training step's compute
        if step == 3 and rank == 0:
            if FAULT == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif FAULT == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            else:
                raise RuntimeError("rank 0 ran out of memory in its training step")
        dist.all_reduce(torch.ones(16))


if __name__ == "__main__":
    launch(train, 3, store="rank0", TORCH_EXT_STORE_TIMEOUT="2")
