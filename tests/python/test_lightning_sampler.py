"""BucketBatchSampler under Lightning's DDP: no per-rank re-wrapping, equal batches, epochs advance.

Lightning 2.x (``use_distributed_sampler=True``, the default) re-creates a
training DataLoader around a ``DistributedSampler`` unless its ``sampler`` is
one already, and re-creates or rejects custom batch samplers on the way. The
test runs real 2-process Lightning fits (gloo, CPU) and checks, per rank and per
epoch, that training saw exactly the batches the bucket sampler plans for that
rank: with ``torch_ext.lightning.BucketDataLoader`` under the default setting,
with a plain DataLoader under ``use_distributed_sampler=False``, and that a
plain DataLoader under the default setting fails with a clear error instead of
silently splitting the data twice.
"""
from __future__ import annotations

import collections

import torch
from torch.utils.data import DataLoader

from harness import assert_all_ok, needs, report, run_ranks
from torch_ext import BucketBatchSampler

needs("lightning", module=True)

KEYS = [0.5, 1.0, 1.0, 2.0, 1.0] * 13 + [0.5, 2.0]  # 67 samples: no even split over 2 ranks
BATCH = {0.5: 3, 1.0: 4, 2.0: 2}
SEED = 3
EPOCHS = 2


def _fit(mode: str, world: int):
    import lightning.pytorch as pl

    from torch_ext.lightning import BucketDataLoader

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen = collections.defaultdict(list)

        def train_dataloader(self):
            # Built in the hook, after Lightning initialised the process group:
            # num_replicas and rank come from it.
            sampler = BucketBatchSampler(KEYS, BATCH, seed=SEED)
            data = list(range(len(KEYS)))
            if mode == "bucket_loader":
                return BucketDataLoader(data, batch_sampler=sampler)
            return DataLoader(data, batch_sampler=sampler)

        def training_step(self, batch, batch_idx):
            self.seen[self.current_epoch].append(batch.tolist())
            return self.layer(batch.float().unsqueeze(1)).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = pl.Trainer(
        accelerator="cpu", devices=world, strategy="ddp", max_epochs=EPOCHS,
        use_distributed_sampler=(mode != "plain_loader_no_distributed_sampler"),
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    model = Model()
    try:
        trainer.fit(model)
    except TypeError as e:
        return {"error": str(e)}
    return {"seen": dict(model.seen), "num_training_batches": trainer.num_training_batches}


def _lightning_ranks(rank, world, modes):
    # Lightning rendezvouses through env://, on the harness's store.
    return {mode: _fit(mode, world) for mode in modes}


def _expected(rank: int, world: int, epoch: int) -> list[list[int]]:
    s = BucketBatchSampler(KEYS, BATCH, num_replicas=world, rank=rank, seed=SEED)
    s.set_epoch(epoch)
    return list(s)


def test_lightning_ddp_keeps_bucket_batches_per_rank():
    world = 2
    modes = ["bucket_loader", "plain_loader_no_distributed_sampler", "plain_loader_default"]
    results = run_ranks(_lightning_ranks, world, modes, backend=None, timeout=120)
    values = assert_all_ok(results)
    for mode in modes[:2]:
        for rank in range(world):
            got = values[rank][mode]
            assert "error" not in got, f"{mode}, rank {rank}: {got.get('error')}\n{report(results)}"
            for epoch in range(EPOCHS):
                assert got["seen"][epoch] == _expected(rank, world, epoch), (
                    f"{mode}: rank {rank} epoch {epoch} trained on other batches than the sampler plans "
                    "(re-wrapped per rank, or set_epoch not called)")
            assert got["num_training_batches"] == len(_expected(rank, world, 0))
        assert values[0][mode]["seen"][0] != values[0][mode]["seen"][1], "Lightning must advance the epoch"
    # A plain DataLoader under use_distributed_sampler=True: Lightning refuses to inject its
    # sampler into a batch sampler that is not a BatchSampler, and says how to fix it.
    for rank in range(world):
        error = values[rank]["plain_loader_default"].get("error", "")
        assert "use_distributed_sampler=False" in error, report(results)
