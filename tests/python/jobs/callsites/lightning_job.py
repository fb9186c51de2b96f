"""Lightning jobs with the classic distributed bugs, for tests/python/test_call_sites.py.

    python lightning_job.py CASE            # Lightning's own launcher starts 3 ranks
    torchrun --nproc-per-node 3 lightning_job.py CASE

CASE: log_rank0 / log_rank0_step (rank-0-only self.log(sync_dist=True), synced at
epoch end / at the step), log_dict_keys (self.log_dict with a key only rank 0 logs),
torchmetric_rank0 (a torchmetrics metric updated and logged on rank 0 only),
validate_rank0 (a
collective only rank 0 runs in validation), hang (rank 1 stalls in
training_step while the others sync). The lines marked "# LINE:name" are the
ones the reports must name.
"""
import os
import sys
import time

import lightning.pytorch as pl
import torch

import torch_ext.lightning  # noqa: F401  (registers "ddp_guard")

CASE = sys.argv[1]


def load_slowly():
    time.sleep(5)  # the workload stalls (a slow filesystem, say); not synchronisation


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        if CASE == "torchmetric_rank0":
            import torchmetrics

            self.val_mse = torchmetrics.MeanSquaredError()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if CASE == "hang" and batch_idx == 2:
            if self.global_rank == 1:
                load_slowly()  # LINE:stall
            self.log("train_loss", loss, sync_dist=True)  # LINE:train_sync
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if CASE == "log_rank0" and self.trainer.is_global_zero:
            # Lightning syncs an on_epoch value at the end of the epoch, from its loop:
            # the innermost user frame then is trainer.fit in main.
            self.log("val_loss", loss, sync_dist=True)  # LINE:log_rank0
        if CASE == "log_rank0_step" and self.trainer.is_global_zero:
            self.log("val_loss", loss, sync_dist=True, on_step=True, on_epoch=False)  # LINE:log_rank0_step
        if CASE == "log_dict_keys":
            # Lightning#19106: a key only some ranks log (a class present in this rank's batch).
            metrics = {"val_loss": loss}
            if self.global_rank == 0 and batch_idx == 0:
                metrics["val_acc_c3"] = loss
            self.log_dict(metrics, sync_dist=True)  # LINE:log_dict
        if CASE == "torchmetric_rank0" and self.trainer.is_global_zero:
            # A torchmetrics metric logged on rank 0 only: Lightning computes it (a sync) at epoch end.
            self.val_mse(self.net(x), y)
            self.log("val_mse", self.val_mse)  # LINE:torchmetric_rank0
        if CASE == "validate_rank0" and self.trainer.is_global_zero:
            self.all_gather(loss)  # LINE:validate_rank0

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main():
    gen = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(48, 4, generator=gen), torch.randn(48, 1, generator=gen))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    trainer = pl.Trainer(accelerator="cpu", devices=3, strategy="ddp_guard", max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_train_batches=4, limit_val_batches=2, num_sanity_val_steps=0)
    trainer.fit(Model(), train_dataloaders=loader, val_dataloaders=loader)  # LINE:fit
    print(f"rank {trainer.global_rank} finished fit", flush=True)


if __name__ == "__main__":
    main()
