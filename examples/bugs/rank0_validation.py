"""Classic bug: rank-0-only validation that hangs the others.

    python examples/bugs/rank0_validation.py

Rank 0 validates alone, and its validation syncs a metric with a collective the
other ranks never call; they wait in the barrier after it. The guard sees the
collectives differ (rank 0's all_reduce vs the others' barrier) and raises on
every rank, with call sites, instead of hanging until the 30-minute timeout.
"""
import torch
import torch.distributed as dist

from _launch import launch


def evaluate(model_output: torch.Tensor) -> float:
    acc = (model_output > 0).float().mean()
    dist.all_reduce(acc)  # "average over ranks" - but only rank 0 is here
    return acc.item()


def train(rank: int, world: int) -> None:
    dist.all_reduce(torch.ones(8))  # a training step
    if rank == 0:
        evaluate(torch.randn(100))
    dist.barrier()  # "wait for rank 0 to finish validating"


if __name__ == "__main__":
    launch(train, 3)
