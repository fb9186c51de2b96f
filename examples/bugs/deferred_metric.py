"""Classic bug, deferred: a metric only one rank logs, synced later at epoch end.

    python examples/bugs/deferred_metric.py

A small metric logger, as training frameworks have: `log()` only remembers the
value, and `sync()` all_reduces every logged metric at the end of the epoch, far
from the line that logged it. Rank 0 logs "val_acc" under `if rank == 0:`, so its
epoch-end sync pairs with the others' next gradient all_reduce. The logger labels
each sync with `torch_ext.label`, carrying the line that logged the metric
(`torch_ext.here()`, a code object and a line: cheap enough for every `log()`),
so the report names the metric and that line, with a hint.

It runs with TORCH_EXT_CHECK=strict (checked before each collective): rank 0's
one-float sync meets the others' 16-float gradient sync, and gloo aborts a
process whose byte counts differ before an after-the-fact check could speak.
"""
import time

import torch
import torch.distributed as dist

import torch_ext
from _launch import launch

HINT = "a metric logged on some ranks only is synced by those ranks only: log it on every rank"


class MetricLogger:
    def __init__(self):
        self.values = {}

    def log(self, name: str, value: float) -> None:
        # Where the metric was logged: the caller's line, resolved only if a report names it.
        self.values[name] = (value, torch_ext.here(1))

    def sync(self) -> dict:
        out = {}
        for name, (value, origin) in sorted(self.values.items()):
            with torch_ext.label(f"metric {name!r}", origin=origin, hint=HINT, metric=name):
                t = torch.tensor([value])
                dist.all_reduce(t)
            out[name] = t.item() / dist.get_world_size()
        self.values.clear()
        return out


def train(rank: int, world: int) -> None:
    metrics = MetricLogger()
    for epoch in range(100):
        for step in range(5):
            dist.all_reduce(torch.ones(16))  # the gradient sync
            metrics.log("loss", 1.0 / (step + 1))
            time.sleep(0.01)  # a training step's compute
        if rank == 0:
            metrics.log("val_acc", 0.9)  # only rank 0 validates
        metrics.sync()  # epoch end: every logged metric, all ranks


if __name__ == "__main__":
    launch(train, 3, TORCH_EXT_CHECK="strict")
