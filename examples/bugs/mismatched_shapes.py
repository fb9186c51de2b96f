"""Classic bug: ranks all_reduce tensors of different shapes.

    python examples/bugs/mismatched_shapes.py

Rank 1 builds its buffer from its own (different) config. Strict mode compares
fingerprints before the collective runs, so no data moves and every rank raises
the same CollectiveMismatchError. (In async mode gloo itself would abort rank 1's
process on the size difference before any check could run.)
"""
import torch
import torch.distributed as dist

from _launch import launch


def sync_stats(rank: int, world: int) -> None:
    hidden = 128 if rank != 1 else 96  # rank 1 read an old config
    stats = torch.zeros(hidden)
    dist.all_reduce(stats)


if __name__ == "__main__":
    launch(sync_stats, 3, TORCH_EXT_CHECK="strict")
