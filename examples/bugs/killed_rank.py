"""Classic failure: a rank dies (OOM killer, preemption, segfault).

    python examples/bugs/killed_rank.py

Rank 2 is killed with SIGKILL during training. The others fail fast with
CollectiveFailureError naming the rank that is gone, instead of an error about a
closed connection that names nobody (gloo) or a hang until the timeout (NCCL).
Dumps go to ./torch_ext_dumps; read them with `python -m torch_ext.diagnose`.
"""
import os
import signal

import torch
import torch.distributed as dist

from _launch import launch


def train(rank: int, world: int) -> None:
    for step in range(100):
        if step == 3 and rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(torch.ones(16))


if __name__ == "__main__":
    launch(train, 3, TORCH_EXT_DUMP_DIR="torch_ext_dumps")
