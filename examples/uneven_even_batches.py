"""Uneven data per rank: every rank leaves the loop at the same step (policy "stop").

Each rank streams a different number of batches (think: shards that do not
divide evenly, or a bucketing sampler). A plain loop would leave the ranks
with more data waiting forever in DDP's gradient all_reduce; wrapped in
``even_batches``, all ranks stop as soon as the first runs out, and the
DataLoader workers are shut down cleanly.

    torchrun --nproc-per-node 2 examples/uneven_even_batches.py
    python examples/uneven_even_batches.py             # spawns 2 CPU processes itself
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset

import torch_ext
from _run import run_example


class Shard(IterableDataset):
    """A stream whose length nobody knows in advance (here: 5 + 4 * rank samples)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        workers, wid = (info.num_workers, info.id) if info else (1, 0)
        for i in range(wid, 5 + 4 * self.rank, workers):
            yield torch.full((8,), float(i)), torch.tensor([float(i)])


def train() -> None:
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(Shard(rank), batch_size=2, num_workers=2)
    for epoch in range(2):
        batches = torch_ext.even_batches(loader)  # prefetches, syncs once per step
        for x, y in batches:
            loss = (model(x) - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()  # DDP's all_reduce: every rank is here the same number of times
            opt.step()
        print(f"rank {rank} epoch {epoch}: {batches.steps} steps, ended because {batches.reason!r}")
    dist.barrier()


if __name__ == "__main__":
    run_example(train)
