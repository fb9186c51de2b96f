"""Uneven data per rank, and every sample is used (policy "join", with DDP).

Ranks that run out of data keep shadowing DDP's collectives with zero
gradients (DDP's own join hook) until every rank is done; gradients are
averaged over the ranks that still had data at each step, and at the end all
ranks hold the model of the ranks that trained last. Unlike
``torch.distributed.algorithms.Join``, there is no extra all_reduce per step:
the count of ranks with data comes from the same fused step sync.

    torchrun --nproc-per-node 2 examples/uneven_join_ddp.py
    python examples/uneven_join_ddp.py                 # spawns 2 CPU processes itself
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_ext
from _run import run_example


def train() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    data = [(torch.randn(8, 4, generator=gen), torch.randn(8, 1, generator=gen)) for _ in range(3 + 5 * rank)]
    batches = torch_ext.even_batches(data, policy="join", joinables=[model])
    for x, y in batches:
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"rank {rank}: trained on all {batches.steps} of its batches; loop ended because {batches.reason!r}")
    # Every rank holds the same model now.
    w = model.module.weight.detach().clone()
    gathered = [torch.empty_like(w) for _ in range(world)]
    dist.all_gather(gathered, w)
    assert all(torch.equal(g, gathered[0]) for g in gathered), "models differ across ranks"
    if rank == 0:
        print("all ranks hold the same model")


if __name__ == "__main__":
    run_example(train)
