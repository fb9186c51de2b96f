"""Classic bug: a torchmetrics metric computed on the main rank only.

    python examples/bugs/rank0_metric_compute.py

`metric.compute()` syncs the metric's state across all ranks (torchmetrics'
`sync_on_compute`, on by default), so calling it under `if rank == 0:` to print
the validation accuracy makes rank 0 gather while the others go on training. The
gather is issued inside torchmetrics; the guard labels it with the metric's class
and the line that called `compute()`, and says what to do.
"""
import torch
import torch.distributed as dist
import torchmetrics

from _launch import launch


def train(rank: int, world: int) -> None:
    accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes=3)
    gen = torch.Generator().manual_seed(rank)
    for epoch in range(100):
        for step in range(5):
            dist.all_reduce(torch.ones(16))  # the gradient sync
        preds, target = torch.randint(0, 3, (8,), generator=gen), torch.randint(0, 3, (8,), generator=gen)
        accuracy.update(preds, target)
        if rank == 0:
            print(f"epoch {epoch}: val accuracy {accuracy.compute():.2f}")  # only rank 0 computes
        accuracy.reset()


if __name__ == "__main__":
    launch(train, 3)
