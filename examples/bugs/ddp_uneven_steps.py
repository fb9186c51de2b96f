"""Classic bug, as DDP meets it: one rank gets one batch fewer per epoch.

    python examples/bugs/ddp_uneven_steps.py

A hand-written bucket sampler (multi-scale buckets, shards that do not divide
evenly) gives rank 1 one batch fewer than rank 0. Rank 1 leaves the loop and
reaches the barrier before saving; rank 0 is inside ``loss.backward()``, where
DDP's reducer all_reduces the gradients. Plain gloo pairs the two and hangs
(NCCL hangs too, or pairs them with the next epoch's buckets). Under the guard
both ranks raise CollectiveMismatchError, rank 0 from inside ``loss.backward()``
(the autograd engine rethrows it there), so ``except
torch_ext.CollectiveMismatchError`` catches it on every rank (the launcher
prints each rank's error type), and the report names both lines.
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _launch import launch


def batches(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    count = 8 if rank == 0 else 7  # the sampler's buckets split unevenly across ranks
    return [torch.randn(16, 32, generator=g) for _ in range(count)]


def train(rank: int, world: int) -> None:
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x in batches(rank):
        loss = model(x).pow(2).mean()
        loss.backward()  # rank 0's last one raises CollectiveMismatchError
        opt.step()
        opt.zero_grad()
    dist.barrier()  # everyone done before rank 0 saves
    if rank == 0:
        torch.save(model.module.state_dict(), "model.pt")


if __name__ == "__main__":
    launch(train, 2)
