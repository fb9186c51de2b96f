"""Classic bug: ranks all_reduce tensors of different shapes.

    python examples/bugs/mismatched_shapes.py

Rank 1 builds its buffer from its own (different) config. Strict mode compares
fingerprints before the collective runs, so no data moves and every rank raises
the same CollectiveMismatchError. (In the default mode gloo would terminate the
rank that receives more bytes than it expects, from its transport thread; the
guard stops that thread instead of the process, and every rank raises the same
CollectiveMismatchError once the check has compared the ranks' collectives.)
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
