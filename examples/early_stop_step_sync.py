"""Early stopping in a plain PyTorch loop: one fused collective per step, no broadcast.

Each rank decides on its own (here: its validation loss stopped improving) and
the decision, plus the cross-rank means of the step's metrics, comes back from
ONE all_reduce. Every rank leaves the loop at the same step.

    torchrun --nproc-per-node 2 examples/early_stop_step_sync.py
    python examples/early_stop_step_sync.py            # spawns 2 CPU processes itself
"""
from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_ext


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


def _worker(rank: int, world: int, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    main()


def main() -> None:
    dist.init_process_group("guard")  # or "gloo" / "nccl": the op works on any group
    try:
        train()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" in os.environ:
        main()
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # fork where available: quick to start, and DataLoader workers then fork too
        # (under "spawn" every worker would start a fresh interpreter).
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        mp.start_processes(_worker, args=(2, port), nprocs=2, start_method=method)
