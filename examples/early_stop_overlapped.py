"""Early stopping with the sync overlapped with the next step (read one step later).

``sync.start(...)`` launches the fused all_reduce and returns at once; the
result is read at the next step, after that step's work was issued, so the
collective runs while the model trains. A stop requested at step i takes
effect after step i+1, on every rank.

    torchrun --nproc-per-node 2 examples/early_stop_overlapped.py
    python examples/early_stop_overlapped.py           # spawns 2 CPU processes itself
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_ext
from _run import run_example


def train() -> None:
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    sync = torch_ext.StepSync(metrics=["loss"])
    stop_at = 25 + 10 * rank  # e.g. a time budget that runs out first on rank 0
    pending = None
    for step in range(1000):
        x = torch.randn(16, 8, generator=gen)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if pending is not None:
            prev = pending.wait()  # the sync started one step ago: long done by now
            if prev.stop:
                print(f"rank {rank}: stopping after step {step} (mean loss {prev.metric('loss'):.4f})")
                break
        pending = sync.start(stop=step >= stop_at, metrics={"loss": loss})
    else:
        if pending is not None:
            pending.wait()  # every started sync is waited for, on every rank
    dist.barrier()


if __name__ == "__main__":
    run_example(train)
