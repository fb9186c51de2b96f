"""WebDataset with uneven shards under Lightning DDP: the same epoch length on every rank.

Writes six small tar shards of different sizes, then trains on 2 CPU processes
(Lightning's "ddp" strategy re-runs this script for rank 1). With
``split_by_node`` alone the two ranks would get different numbers of batches and
the rank with more would hang in its next all_reduce;
``torch_ext.webdataset.set_epoch_length`` sets the same ``with_epoch`` on both,
and ``len(loader)``, so Lightning knows the epoch length (its progress bar shows
"x/n" instead of "x/?"). Needs ``pip install webdataset lightning``; runs in
seconds:

    python examples/webdataset_lightning.py
"""
from __future__ import annotations

import io
import os
import tarfile
import tempfile

import lightning.pytorch as pl
import torch
import webdataset as wds

from torch_ext.webdataset import count_samples, rank_batches, set_epoch_length

SIZES = [40, 31, 33, 27, 25, 29]  # samples per shard: rank 0 reads 98 (13 batches), rank 1 87 (11)
BATCH = 8
WORLD = 2


def write_shards(directory: str) -> list[str]:
    urls, index = [], 0
    for s, n in enumerate(SIZES):
        path = os.path.join(directory, f"shard-{s:03d}.tar")
        with tarfile.open(path, "w") as tar:
            for i in range(n):
                for ext, data in (("x", f"{index / 200:.4f}"), ("y", f"{2 * index / 200 + 1:.4f}")):
                    payload = data.encode()
                    info = tarfile.TarInfo(f"{s:03d}-{i:04d}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
                index += 1
        urls.append(path)
    return urls


def to_pair(sample):
    return float(sample["x"]), float(sample["y"])


def collate(pairs):
    x, y = zip(*pairs)
    return torch.tensor(x).unsqueeze(1), torch.tensor(y).unsqueeze(1)


class Regression(pl.LightningModule):
    def __init__(self, urls: list[str]) -> None:
        super().__init__()
        self.urls = urls
        self.layer = torch.nn.Linear(1, 1)
        self.steps = 0

    def train_dataloader(self):
        dataset = (
            wds.WebDataset(self.urls, nodesplitter=wds.split_by_node, shardshuffle=False)
            .map(to_pair)
            .batched(BATCH, collation_fn=collate, partial=True)
        )
        loader = wds.WebLoader(dataset, batch_size=None, num_workers=0)
        counts = count_samples(self.urls)  # from the tar headers; or your shard index
        n = set_epoch_length(loader, self.urls, counts, batch_size=BATCH, policy="drop")
        print(f"rank {self.global_rank}: split_by_node alone gives ranks "
              f"{rank_batches(self.urls, counts, BATCH)} batches; with_epoch set to {n}", flush=True)
        return loader

    def training_step(self, batch, batch_idx):
        self.steps += 1
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def on_train_epoch_start(self) -> None:
        self.steps = 0

    def on_train_epoch_end(self) -> None:
        print(f"rank {self.global_rank}: epoch {self.current_epoch} trained {self.steps} batches; Lightning knew "
              f"the length in advance: {self.trainer.num_training_batches}", flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    # Lightning starts rank 1 by re-running this script with the same environment:
    # write the shards once and hand their directory down.
    directory = os.environ.get("TORCH_EXT_EXAMPLE_SHARDS")
    if directory is None:
        directory = tempfile.mkdtemp(prefix="torch_ext_wds_")
        write_shards(directory)
        os.environ["TORCH_EXT_EXAMPLE_SHARDS"] = directory
    urls = sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".tar"))
    trainer = pl.Trainer(accelerator="cpu", devices=WORLD, strategy="ddp", max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(Regression(urls))


if __name__ == "__main__":
    main()
