"""Classic bug: a collective only one rank calls.

    python examples/bugs/rank0_only_reduce.py

`dist.reduce` inside `if rank == 0:` pairs rank 0's reduce with the other ranks'
next all_reduce: gloo silently mixes them up (or hangs), NCCL hangs until its
timeout. With the guard, every rank raises CollectiveMismatchError within about
a second, naming what each rank issued and where.
"""
import time

import torch
import torch.distributed as dist

from _launch import launch


def log_metrics(loss: torch.Tensor) -> None:
    dist.reduce(loss, dst=0)  # only rank 0 gets here


def train(rank: int, world: int) -> None:
    for step in range(1000):
        loss = torch.ones(1) * step
        if rank == 0:
            log_metrics(loss)
        dist.all_reduce(torch.ones(16))  # the gradient sync
        time.sleep(0.01)  # a training step's compute


if __name__ == "__main__":
    launch(train, 3)
