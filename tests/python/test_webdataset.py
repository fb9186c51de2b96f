"""WebDataset with uneven shards: unequal per-rank batch counts, and the fix.

Shards are real tar files written by the test with different sample counts.
``split_by_node`` gives ranks different numbers of batches (the hang of
webdataset#225); ``torch_ext.webdataset.set_epoch_length`` makes them equal, and
``torch_ext.even_batches`` ends the epoch together when counts are unknown.
"""
from __future__ import annotations

import collections
import io
import os
import tarfile

import pytest
import torch
import torch.distributed as dist

import torch_ext
from harness import assert_all_ok, needs, report, run_ranks
from torch_ext.webdataset import count_samples, rank_batches, set_epoch_length, shard_split

wds = pytest.importorskip("webdataset")

# Six shards of different sizes: over 2 ranks, rank 0 reads shards 0, 2, 4 (21 samples)
# and rank 1 shards 1, 3, 5 (9 samples).
SIZES = [7, 3, 9, 2, 5, 4]
BATCH = 4


def make_shards(directory, sizes=SIZES) -> list[str]:
    urls, index = [], 0
    for s, n in enumerate(sizes):
        path = os.path.join(directory, f"shard-{s:03d}.tar")
        with tarfile.open(path, "w") as tar:
            def add(name, data: bytes):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

            if s == 0:  # members WebDataset does not count as samples
                add("__shardinfo__", b"{}")  # metadata: skipped
                add("README", b"no extension: belongs to no sample")
            for i in range(n):
                key = f"{s:03d}-{i:04d}"
                add(f"{key}.idx", str(index).encode())
                add(f"{key}.txt", f"sample {index}".encode())
                index += 1
        urls.append(path)
    return urls


def _index(sample):
    return int(sample["idx"])


def make_loader(urls, num_workers, batch_size=BATCH):
    dataset = (
        wds.WebDataset(urls, nodesplitter=wds.split_by_node, shardshuffle=False, empty_check=False)
        .map(_index)
        .batched(batch_size, collation_fn=None, partial=True)
    )
    return wds.WebLoader(dataset, batch_size=None, num_workers=num_workers)


@pytest.fixture
def shards(tmp_path):
    return make_shards(str(tmp_path))


# ------------------------------------------------------------------ counting and splitting


def test_count_samples_counts_like_webdataset(shards):
    assert count_samples(shards) == SIZES
    for url, n in zip(shards, SIZES):
        assert sum(1 for _ in wds.WebDataset(url, shardshuffle=False)) == n
    # Brace patterns and file: URLs, as WebDataset accepts them.
    pattern = os.path.join(os.path.dirname(shards[0]), "shard-{000..005}.tar")
    assert count_samples("file:" + pattern) == SIZES
    with pytest.raises(ValueError, match=r"only read local tar files.*pass samples_per_shard"):
        count_samples(["pipe:curl -s http://example.invalid/shard.tar"])


@pytest.mark.parametrize("world,workers", [(2, 0), (2, 2), (3, 0), (3, 2)])
def test_rank_batches_match_what_webdataset_yields(shards, monkeypatch, world, workers):
    predicted = rank_batches(shards, SIZES, BATCH, world_size=world, num_workers=workers)
    actual = []
    for rank in range(world):
        # split_by_node reads RANK / WORLD_SIZE first; the DataLoader workers inherit them.
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        actual.append(sum(1 for _ in make_loader(shards, workers)))
    assert predicted == actual
    assert len(set(actual)) > 1, "these shards are meant to be uneven"


def test_shard_split_errors_name_the_fix(shards):
    with pytest.raises(ValueError, match=r"5 counts for 6 shards"):
        shard_split(shards, SIZES[:5], world_size=2)
    with pytest.raises(ValueError, match=r"6 shards cannot feed 2 ranks x 4 DataLoader workers.*num_workers <= 3"):
        shard_split(shards, SIZES, world_size=2, num_workers=4)
    with pytest.raises(ValueError, match=r"6 shards cannot feed 7 ranks"):
        shard_split(shards, SIZES, world_size=7)
    loader = make_loader(shards, 0)
    with pytest.raises(ValueError, match=r"policy='even'"):
        set_epoch_length(loader, shards, SIZES, batch_size=BATCH, world_size=2, policy="even")
    with pytest.raises(ValueError, match=r"some rank gets no batch"):
        set_epoch_length(loader, shards, SIZES, batch_size=50, world_size=2, partial=False)
    with pytest.raises(ValueError, match=r"on the loader \(wds.WebLoader\), not on the dataset"):
        set_epoch_length(wds.WebDataset(shards, shardshuffle=False), shards, SIZES, batch_size=BATCH,
                         world_size=2, num_workers=2)


# ------------------------------------------------------------------ multi-process scenarios


def _train_epoch(loader, weight):
    """A data-parallel step per batch: local gradient, all_reduce, update (what DDP does per step)."""
    seen = []
    for batch in loader:
        seen.append(list(batch))
        grad = torch.tensor([float(sum(batch))]) * weight
        dist.all_reduce(grad)  # a rank with fewer batches would leave the others waiting here
        weight -= 1e-6 * grad
    dist.barrier()
    return seen


def _uneven_shards(rank, world, urls):
    # num_workers=0: the harness's rank processes are daemonic and cannot start DataLoader
    # workers; test_rank_batches_match_what_webdataset_yields covers split_by_worker.
    workers = 0
    out = {}
    # Without the helper: count only (a training loop on these counts would hang).
    out["plain"] = sum(1 for _ in make_loader(urls, workers))
    weight = torch.ones(1)
    for policy in ("drop", "pad"):
        loader = make_loader(urls, workers)
        n = set_epoch_length(loader, urls, SIZES, batch_size=BATCH, policy=policy)
        epochs = [_train_epoch(loader, weight) for _ in range(2)]
        out[policy] = {"n": n, "len": len(loader), "epochs": epochs}
    return out


def test_uneven_shards_unequal_without_helper_equal_with_it(shards):
    world, workers = 2, 0
    results = run_ranks(_uneven_shards, world, shards, backend="gloo", timeout=60)
    values = assert_all_ok(results)
    plain = [v["plain"] for v in values]
    assert plain == rank_batches(shards, SIZES, BATCH, world_size=world, num_workers=workers)
    assert len(set(plain)) > 1, f"split_by_node should give unequal counts here, got {plain}"
    for policy, expected_n in (("drop", min(plain)), ("pad", max(plain))):
        for epoch in range(2):
            per_rank = [v[policy]["epochs"][epoch] for v in values]
            assert [len(b) for b in per_rank] == [expected_n] * world, (policy, [len(b) for b in per_rank])
            samples = collections.Counter(i for batches in per_rank for b in batches for i in b)
            if policy == "drop":
                assert max(samples.values()) == 1, "drop: no sample repeated"
            else:
                assert set(samples) == set(range(sum(SIZES))), "pad: every sample seen"
        for v in values:
            assert v[policy]["n"] == v[policy]["len"] == expected_n


def _even_batches(rank, world, urls):
    natural = sum(1 for _ in make_loader(urls, 0))
    # No counts given: even_batches must end the epoch on both ranks at the same step.
    seen = _train_epoch(torch_ext.even_batches(make_loader(urls, 0)), torch.ones(1))
    return natural, len(seen)


def test_even_batches_ends_the_epoch_together_when_counts_are_unknown(shards):
    results = run_ranks(_even_batches, 2, shards, backend="gloo", timeout=60)
    values = assert_all_ok(results)
    natural = [v[0] for v in values]
    steps = [v[1] for v in values]
    assert len(set(natural)) > 1, natural
    assert len(set(steps)) == 1, f"ranks ended the epoch at different steps: {steps}\n{report(results)}"
    assert min(natural) <= steps[0] <= max(natural)


# ------------------------------------------------------------------ Lightning


def _lightning_webdataset(rank, world, urls):
    import lightning.pytorch as pl  # rendezvous through env://, on the harness's store

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.steps = collections.Counter()

        def train_dataloader(self):
            loader = make_loader(urls, 0)
            set_epoch_length(loader, urls, SIZES, batch_size=BATCH)
            return loader

        def training_step(self, batch, batch_idx):
            self.steps[self.current_epoch] += 1
            return self.layer(torch.tensor(batch, dtype=torch.float32).unsqueeze(1)).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    trainer = pl.Trainer(accelerator="cpu", devices=world, strategy="ddp", max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    model = Model()
    trainer.fit(model)
    return trainer.num_training_batches, dict(model.steps)


def test_lightning_knows_the_webdataset_epoch_length(shards):
    needs("lightning")
    world = 2
    results = run_ranks(_lightning_webdataset, world, shards, backend=None, timeout=120)
    values = assert_all_ok(results)
    n = min(rank_batches(shards, SIZES, BATCH, world_size=world))
    for total, steps in values:
        # A number, so the progress bar shows "x/n" rather than "x/?".
        assert total == n, report(results)
        assert steps == {0: n, 1: n}
