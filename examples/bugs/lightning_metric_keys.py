"""Classic Lightning bug (Lightning#19106): `self.log_dict` with keys that differ across ranks.

    python examples/bugs/lightning_metric_keys.py      # Lightning's own launcher starts 3 ranks

A per-class accuracy is logged only for the classes present in a rank's batch, so
rank 0 logs "val_acc_c3" and ranks 1 and 2 do not. With `sync_dist=True`,
Lightning syncs every logged key at the end of the epoch, key by key, from its
own loop: rank 0 syncs one metric more than the others, and its extra sync meets
their next training collective. Lightning cannot say which key; `ddp_guard`
labels each sync with its metric and the `self.log_dict` line, and the report
names, per rank, the metrics it synced there and the one missing where.

It runs with check="strict" (each collective checked before it runs): rank 0's
extra metric sync meets the others' gradient all_reduce, and gloo aborts a
process whose byte counts differ before an after-the-fact check could speak.
"""
import os
import sys
import warnings

import lightning.pytorch as pl
import torch

import torch_ext
import torch_ext.lightning  # noqa: F401  (registers "ddp_guard")
from torch_ext.lightning import GuardDDPStrategy

warnings.filterwarnings("ignore")  # Lightning's advice on workers and logging; not this example's point


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        metrics = {"val_loss": torch.nn.functional.cross_entropy(logits, y)}
        for c in y.unique().tolist():  # the bug: only the classes this rank's batch holds
            metrics[f"val_acc_c{c}"] = (logits.argmax(1) == y)[y == c].float().mean()
        self.log_dict(metrics, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    x = torch.randn(24, 4, generator=torch.Generator().manual_seed(0))
    # Sample i goes to rank i % 3: every rank's batch holds classes 0, 1 and 2 ...
    y = torch.tensor([(i // 3) % 3 for i in range(24)])
    y[0] = 3  # ... and class 3 appears once, in rank 0's first validation batch
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    strategy = GuardDDPStrategy(guard_options=torch_ext.GuardOptions(check="strict"))
    trainer = pl.Trainer(accelerator="cpu", devices=3, strategy=strategy, max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_train_batches=2, limit_val_batches=2, num_sanity_val_steps=0)
    try:
        trainer.fit(Classifier(), train_dataloaders=loader, val_dataloaders=loader)
    except torch_ext.CollectiveMismatchError as e:  # ranks 1 and 2 get theirs inside loss.backward()
        # Each rank shows what it raised (one write: the ranks share the terminal) and
        # ends, as the launcher of the other examples in this folder shows them.
        sys.stdout.write(f"[rank{trainer.global_rank}] raised {type(e).__name__}:\n{e}\n")
        sys.stdout.flush()
        return
    print(f"[rank{trainer.global_rank}] finished", flush=True)


if __name__ == "__main__":
    # Like every example in this folder: the ranks' dumps in ./torch_ext_dumps, unless set.
    os.environ.setdefault("TORCH_EXT_DUMP_DIR", "torch_ext_dumps")
    main()
