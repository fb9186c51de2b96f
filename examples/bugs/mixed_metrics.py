"""Classic bug: ranks sync different metrics of the same shape at the same step (Lightning#19106).

    python examples/bugs/mixed_metrics.py

Each rank logs per-class accuracies for the classes its batches contained: rank 0
saw class "cat", ranks 1 and 2 saw "dog". Every rank then syncs one metric at the
same point, all of the same shape, so the backend happily adds rank 0's cat
accuracy to ranks 1 and 2's dog accuracy, and every rank logs a wrong number.

The guard counts a label's metric as part of the collective (Lightning's
`ddp_guard` labels each `self.log(..., sync_dist=True)` sync this way, and
torch_ext.label(..., metric=...) does it by hand): no rank reads the mixed value,
every rank raises CollectiveMismatchError at that sync, naming which metric each
rank synced.
"""
import torch
import torch.distributed as dist

import torch_ext
from _launch import launch


def sync_metric(name: str, value: float) -> float:
    with torch_ext.label(f"metric '{name}'", metric=name):
        t = torch.tensor([value])
        dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def train(rank: int, world: int) -> None:
    dist.all_reduce(torch.ones(16))  # a training step
    seen = "cat" if rank == 0 else "dog"
    acc = sync_metric(f"val_acc_{seen}", 0.5 + 0.1 * rank)
    print(f"[rank{rank}] val_acc_{seen} = {acc:.3f}")  # never reached: it would be a mix of two metrics


if __name__ == "__main__":
    launch(train, 3)
