"""Lightning on the guard: torch_ext.lightning.EarlyStopping, and an uneven IterableDataset that no longer hangs DDP.

``EarlyStopping`` takes Lightning's arguments; its cross-rank decision is one
fused collective, and with ``sync_metrics=["val_loss"]`` the monitored metric
is averaged across ranks in that same collective (log it without
``sync_dist=True``). The train loader is an IterableDataset with a different
length on each rank, wrapped in ``even_batches``. The strategy is
``"ddp_guard"`` (registered by ``import torch_ext.lightning``): Lightning's DDP
on the ``guard`` backend, so a rank that calls a different collective or never
arrives is reported, not a silent hang.

    torchrun --nproc-per-node 2 examples/early_stop_lightning.py
"""
from __future__ import annotations

import os
import warnings

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import torch_ext
from torch_ext.lightning import EarlyStopping  # also registers strategy "ddp_guard"


class Stream(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        g = torch.Generator().manual_seed(self.n)
        for _ in range(self.n):
            x = torch.randn(8, 4, generator=g)
            yield x, x.sum(1, keepdim=True)


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, _):
        x, y = batch
        return (self.net(x) - y).pow(2).mean()

    def validation_step(self, batch, _):
        x, y = batch
        # No sync_dist=True: the callback averages val_loss in its own collective.
        self.log("val_loss", (self.net(x) - y).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        rank = int(os.environ.get("RANK", 0))
        return torch_ext.even_batches(DataLoader(Stream(6 + 5 * rank), batch_size=None))

    def val_dataloader(self):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(32, 4, generator=g)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


if __name__ == "__main__":
    warnings.filterwarnings("ignore", ".*does not have many workers.*")  # tiny in-memory data: no workers needed
    # Lightning recommends sync_dist=True for every epoch-level metric; here the
    # EarlyStopping callback averages val_loss across ranks itself, in its one
    # fused collective (sync_metrics), so a per-metric all_reduce would be redundant.
    warnings.filterwarnings("ignore", r".*self\.log\('val_loss', \.\.\., sync_dist=True\).*")
    # Lightning's own pytree helper uses a torch API that this torch deprecates: not about this script.
    warnings.filterwarnings("ignore", r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")
    es = EarlyStopping("val_loss", patience=2, min_delta=1e-3, sync_metrics=["val_loss"])
    trainer = pl.Trainer(accelerator="cpu", devices=int(os.environ.get("WORLD_SIZE", 1)), strategy="ddp_guard",
                         max_epochs=50, callbacks=[es], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model())
    print(f"rank {trainer.global_rank}: stopped at epoch {trainer.current_epoch} "
          f"(reason: {es.stopping_reason.name}, mean val_loss {es.synced_metrics.get('val_loss', float('nan')):.3g})")
