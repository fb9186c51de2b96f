"""Early stopping in a plain PyTorch loop: one fused collective per step, no broadcast.

Each rank decides on its own (here: its validation loss stopped improving) and
the decision, plus the cross-rank means of the step's metrics, comes back from
ONE all_reduce. Every rank leaves the loop at the same step.

    torchrun --nproc-per-node 2 examples/early_stop_step_sync.py
    python examples/early_stop_step_sync.py            # spawns 2 CPU processes itself
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
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    sync = torch_ext.StepSync()  # the default group; pass group=... for another one
    best, patience, bad = float("inf"), 3, 0
    for step in range(1000):
        x = torch.randn(16, 8, generator=gen)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        # This rank's own stopping rule: its loss has not improved for `patience` steps.
        if loss.item() < best - 1e-3:
            best, bad = loss.item(), 0
        else:
            bad += 1
        out = sync(stop=bad >= patience, metrics={"loss": loss})
        if rank == 0 and step % 20 == 0:
            print(f"step {step}: mean loss over {world} ranks = {out.metric('loss'):.4f}")
        if out.stop:  # True on every rank at this same step
            print(f"rank {rank}: stopping at step {step} ({out.ranks_stopping} rank(s) asked)")
            break
    dist.barrier()  # reached by every rank: nobody is left waiting in a collective


if __name__ == "__main__":
    run_example(train)
