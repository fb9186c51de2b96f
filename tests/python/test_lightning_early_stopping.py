"""torch_ext.lightning.EarlyStopping and even_batches under Lightning DDP, on 2 CPU processes.

Lightning runs in real processes started by torchrun (Lightning detects the
torchrun environment and does not spawn its own); each launch runs several
fits in the same processes and writes one JSON line per rank and fit.
"""
from __future__ import annotations

import json
import textwrap

import pytest

from harness import needs, run_script

needs("lightning", module=True)


# Validation loss per rank and epoch. Alone, rank 1 plateaus first (its own
# patience runs out at epoch 4); the cross-rank mean keeps improving until
# epoch 5 and plateaus after it (patience runs out at epoch 7). All values
# and means are exact in float32.
CURVES = [
    [8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 3.5, 3.25, 3.0, 2.0],
    [8.0, 6.0, 4.0, 4.5, 4.25, 3.0, 4.0, 3.5, 3.5, 3.5],
]

_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, warnings
    import torch, torch.distributed as dist
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset
    from lightning.pytorch.callbacks import EarlyStopping as LightningEarlyStopping
    import torch_ext
    import torch_ext.lightning as tel

    warnings.filterwarnings("ignore")
    CURVES = json.loads(sys.argv[2])
    STRATEGY = sys.argv[1]
    CASES = sys.argv[3].split(",")


    class Model(pl.LightningModule):
        def __init__(self, sync_dist=False, train_loader=None):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.sync_dist = sync_dist
            self.train_loader = train_loader
            self.train_batches = 0

        def training_step(self, batch, i):
            self.train_batches += 1
            return self.layer(batch[0]).pow(2).mean()

        def validation_step(self, batch, i):
            value = CURVES[self.global_rank][self.current_epoch]
            self.log("val_loss", torch.tensor(value), sync_dist=self.sync_dist)
            self.log("val_rank", torch.tensor(float(self.global_rank)), sync_dist=False)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            if self.train_loader is not None:
                return self.train_loader
            return DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2)

        def val_dataloader(self):
            return DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)


    class Uneven(IterableDataset):
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return ([torch.ones(2, 2)] for _ in range(self.n))


    def fit(model, callbacks, max_epochs):
        trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=STRATEGY, max_epochs=max_epochs,
                             callbacks=callbacks, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
        trainer.fit(model)
        return trainer


    def report(case, **values):
        # One file per rank: the ranks' stdout lines interleave.
        with open(f"result_{dist.get_rank()}.jsonl", "a") as f:
            f.write(json.dumps(dict(case=case, rank=dist.get_rank(), **values)) + "\\n")


    for case in CASES:
        if case in ("lightning_local", "fused_local", "lightning_sync_dist", "fused_riding"):
            sync_dist = case == "lightning_sync_dist"
            if case.startswith("lightning"):
                es = LightningEarlyStopping("val_loss", patience=2)
            elif case == "fused_local":
                es = tel.EarlyStopping("val_loss", patience=2)
            else:
                es = tel.EarlyStopping("val_loss", patience=2, sync_metrics=["val_loss", "val_rank"])
            trainer = fit(Model(sync_dist=sync_dist), [es], max_epochs=len(CURVES[0]))
            report(case, epoch=trainer.current_epoch, stopped_epoch=es.stopped_epoch, wait_count=es.wait_count,
                   best=float(es.best_score), synced=getattr(es, "synced_metrics", None))
        elif case == "uneven_even_batches":
            n = [3, 7][int(os.environ["RANK"])]  # the loader exists before Lightning initialises the group
            loader = torch_ext.even_batches(DataLoader(Uneven(n), batch_size=None))
            model = Model(train_loader=loader)
            trainer = fit(model, [], max_epochs=2)
            report(case, train_batches=model.train_batches, global_step=trainer.global_step,
                   reason=loader.reason)

    # Plain gloo (strategy "ddp") aborts at interpreter exit about 1 time in 5 when its
    # group is left alive ("terminate called without an active exception"); the
    # guard's own exit is tested in test_store_loss, not here.
    dist.destroy_process_group()
    """
)


def _launch(tmp_path, strategy: str, cases: list[str], timeout: float = 240) -> dict:
    script = tmp_path / "lightning_es.py"
    script.write_text(_SCRIPT)
    proc = run_script([str(script), strategy, json.dumps(CURVES), ",".join(cases)], tmp_path, timeout=timeout,
                      nproc=2, PYTHONWARNINGS="ignore")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    results: dict = {}
    for rank in (0, 1):
        for line in (tmp_path / f"result_{rank}.jsonl").read_text().splitlines():
            r = json.loads(line)
            results.setdefault(r.pop("case"), {})[r.pop("rank")] = r
    return results


def _expected_stop_epoch(curves: list[list[float]], patience: int) -> int:
    """Lightning's patience rule on a sequence of values, first epoch that triggers."""
    best, wait = float("inf"), 0
    for epoch, v in enumerate(curves):
        if v < best:
            best, wait = v, 0
        else:
            wait += 1
            if wait >= patience:
                return epoch
    return len(curves) - 1


CASES = ["lightning_local", "fused_local", "lightning_sync_dist", "fused_riding", "uneven_even_batches"]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("ddp"), "ddp", CASES)


@pytest.mark.xdist_group("ddp_run")  # pytest -n: one worker, one ddp_run
def test_fused_early_stopping_stops_at_the_same_epoch_as_lightning(ddp_run):
    local_stops = [_expected_stop_epoch(c, 2) for c in CURVES]
    expected = min(local_stops)  # any rank that wants to stop stops everyone
    assert expected == 4
    for case in ("lightning_local", "fused_local"):
        for rank in (0, 1):
            assert ddp_run[case][rank]["stopped_epoch"] == expected, (case, ddp_run)
    # Not only the epoch: the callback's state matches Lightning's on each rank.
    for rank in (0, 1):
        fused, ref = ddp_run["fused_local"][rank], ddp_run["lightning_local"][rank]
        assert (fused["wait_count"], fused["best"], fused["epoch"]) == (ref["wait_count"], ref["best"], ref["epoch"])


@pytest.mark.xdist_group("ddp_run")  # pytest -n: one worker, one ddp_run
def test_monitored_metric_riding_in_the_collective_matches_sync_dist(ddp_run):
    mean = [(a + b) / 2 for a, b in zip(*CURVES)]
    expected = _expected_stop_epoch(mean, 2)
    assert expected == 7
    for rank in (0, 1):
        ref, fused = ddp_run["lightning_sync_dist"][rank], ddp_run["fused_riding"][rank]
        assert ref["stopped_epoch"] == expected and fused["stopped_epoch"] == expected, ddp_run
        assert (fused["wait_count"], fused["best"], fused["epoch"]) == (ref["wait_count"], ref["best"], ref["epoch"])
        # The other synced metric is the cross-rank mean, the same on every rank.
        assert fused["synced"] == {"val_loss": mean[expected], "val_rank": 0.5}


@pytest.mark.xdist_group("ddp_run")  # pytest -n: one worker, one ddp_run
def test_uneven_iterable_wrapped_with_even_batches_does_not_hang_ddp(ddp_run):
    r = ddp_run["uneven_even_batches"]
    # Rank 0 has 3 batches per epoch, rank 1 has 7: both train 3 per epoch.
    assert r[0] == r[1] == {"train_batches": 6, "global_step": 6, "reason": "data"}, r


def test_with_ddp_guard_strategy(tmp_path):
    # Asked here, not in a skipif: that imported Lightning (2 CPU-s) in every pytest-xdist worker at collection.
    from lightning.pytorch.strategies import StrategyRegistry

    import torch_ext.lightning  # noqa: F401

    assert "ddp_guard" in StrategyRegistry
    results = _launch(tmp_path, "ddp_guard", ["fused_local", "fused_riding", "uneven_even_batches"])
    for rank in (0, 1):
        assert results["fused_local"][rank]["stopped_epoch"] == 4
        assert results["fused_riding"][rank]["stopped_epoch"] == 7
        assert results["uneven_even_batches"][rank]["train_batches"] == 6


def test_single_process_keeps_lightning_behaviour_and_fills_synced_metrics(tmp_path):
    """World 1: no collective; the stop epoch is Lightning's and ``synced_metrics`` holds the local values."""
    import warnings

    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import EarlyStopping as LightningEarlyStopping
    from torch.utils.data import DataLoader, TensorDataset

    import torch_ext.lightning as tel

    curve = CURVES[1]

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, i):
            return self.layer(batch[0]).pow(2).mean()

        def validation_step(self, batch, i):
            self.log("val_loss", torch.tensor(curve[self.current_epoch]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def fit(es):
        data = DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=len(curve), callbacks=[es], logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             default_root_dir=tmp_path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Model(), data, data)
        return trainer

    ours = tel.EarlyStopping("val_loss", patience=2, sync_metrics=["val_loss"])
    theirs = LightningEarlyStopping("val_loss", patience=2)
    t_ours, t_theirs = fit(ours), fit(theirs)
    assert (t_ours.current_epoch, ours.stopped_epoch) == (t_theirs.current_epoch, theirs.stopped_epoch)
    assert ours.stopped_epoch == _expected_stop_epoch(curve, 2)
    assert ours.synced_metrics == {"val_loss": curve[ours.stopped_epoch]}
