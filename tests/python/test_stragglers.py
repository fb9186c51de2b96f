"""The live straggler report (issue 28): who the others wait for, while the job runs.

Each test runs examples/straggler_ddp.py as a user does (four CPU ranks, DDP,
rank 2 slower in one way, 40 ms of "compute" per step) and reads what rank 0's
torch_ext.stragglers() returned (its STRAGGLERS line) and the warning it logged.
These assert on timings, so they run alone (marker ``serial``).
"""
from __future__ import annotations

import json
import os
import re

import pytest
import torch

import torch_ext
from harness import ROOT, needs, run_script

# The tests that time ranks against each other run alone (pytest -m serial, scripts/test.sh): each
# carries the mark; the ones that only parse settings or turn the analysis off run with the rest.
serial = pytest.mark.serial

EXAMPLE = os.path.join(ROOT, "examples", "straggler_ddp.py")
INJECTED_S = 0.008  # 20% of the 40 ms step


def _run(tmp_path, *args: str, nproc: int | None = None, timeout: float = 120) -> tuple[dict, str]:
    proc = run_script([EXAMPLE, *args], tmp_path, timeout, nproc)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]  # every rank ended by itself, and cleanly
    return _result(proc.stdout, out), out


def _result(stdout: str, out: str) -> dict:
    """Rank 0's STRAGGLERS line (the ranks share stdout: read the JSON wherever it starts)."""
    starts = [m.end() for m in re.finditer(r"STRAGGLERS ", stdout)]
    assert len(starts) == 1, out[-6000:]
    return json.JSONDecoder().raw_decode(stdout, starts[0])[0]


def _warnings(out: str) -> list[str]:
    return re.findall(r"torch_ext WARNING: guard: (straggler on group .*)", out)


def _assert_names_rank_2_with_its_extra_time(result: dict, out: str, site: str) -> None:
    assert result["first_named_at_step"] is not None and result["first_named_at_step"] <= 30, result
    [s] = result["stragglers"]
    assert s["rank"] == 2 and s["host"], s
    assert site in s["site"], s
    assert s["extra_s_per_step"] is not None, s
    assert abs(s["extra_s_per_step"] - INJECTED_S) <= 0.25 * INJECTED_S, s
    assert s["own_wait_share"] < s["others_wait_share"], s
    shares = {int(r): v for r, v in result["wait_shares"].items()}  # over the last windows, per rank
    assert sorted(shares) == [0, 1, 2, 3] and min(shares, key=shares.get) == 2, result
    warned = _warnings(out)
    assert warned and all('rank 2 (host ' in w and " is the straggler: the other 3 ranks waited on average" in w
                          for w in warned), out[-4000:]
    assert "straggler_ddp.py:" in warned[0] and "TORCH_EXT_STRAGGLER=off" in warned[0], warned


@serial
def test_a_rank_20_percent_slower_is_named_within_30_steps_with_its_extra_time(tmp_path):
    result, out = _run(tmp_path, "step")
    _assert_names_rank_2_with_its_extra_time(result, out, "in train")
    # The other ranks read the same verdict (rank 0 writes it to the store).
    assert sorted(re.findall(r"\[rank(\d)\] torch_ext.stragglers\(\) here names rank 2", out)) == ["1", "2", "3"], out


@serial
def test_a_rank_slow_only_in_backward_under_ddp_is_named(tmp_path):
    # DDP overlaps the gradient all_reduce with backward: the others' waits see it.
    result, out = _run(tmp_path, "backward")
    _assert_names_rank_2_with_its_extra_time(result, out, "in train")


@serial
def test_on_the_device_path_from_the_streams_own_timing(tmp_path):
    # nccl_sim: NCCL's host semantics on CPU. Completions are noticed by the watchdog's poll, so a
    # collective's wait is its time on the stream (Work.getDuration(); on NCCL, CUDA events).
    proc = run_script([EXAMPLE, "step"], tmp_path, 120, None, TORCH_EXT_INNER="cpu:nccl_sim",
                      TORCH_EXT_NCCL_SIM_WAIT="data")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    _assert_names_rank_2_with_its_extra_time(_result(proc.stdout, out), out, "in train")


@serial
def test_under_torchrun_too(tmp_path):
    # The store lives in torchrun's agent here; the example's own launcher puts it in rank 0.
    result, out = _run(tmp_path, "step", nproc=4)
    _assert_names_rank_2_with_its_extra_time(result, out, "in train")


@serial
def test_a_rank_slow_only_in_validation_is_named_with_the_phase(tmp_path):
    result, out = _run(tmp_path, "validation")
    assert result["first_named_at_step"] is not None, result
    [s] = result["stragglers"]
    assert s["rank"] == 2 and s["site"].endswith("in validate") and s["phase"] is True, s
    # A phase, not the main loop: its time is given per collective of validation.
    assert s["extra_s_per_step"] is None and 0.02 <= s["extra_s_per_collective"] <= 0.045, s
    assert any("in validate" in w for w in _warnings(out)), out[-4000:]


@serial
def test_a_balanced_run_of_several_hundred_steps_names_nobody(tmp_path):
    result, out = _run(tmp_path, "balanced", "--steps", "300", timeout=180)
    assert result["analysed_up_to"] >= 250, result  # it did look, all along
    assert result["stragglers"] == [] and result["first_named_at_step"] is None, result
    assert _warnings(out) == [], out[-4000:]


def test_off_turns_the_analysis_and_the_warning_off(tmp_path):
    proc = run_script([EXAMPLE, "step", "--steps", "40"], tmp_path, 120, None, TORCH_EXT_STRAGGLER="off")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    result = _result(proc.stdout, out)
    assert result["stragglers"] == [] and result["analysed_up_to"] == 0, result
    assert _warnings(out) == [], out[-4000:]


@pytest.mark.parametrize("value, share", [("0.1", 0.1), ("5%", 0.05), ("off", 0.0), ("0", 0.0)])
def test_the_threshold_setting_parses(value, share):
    assert torch_ext.GuardOptions(straggler=value).resolved()["straggler"] == pytest.approx(share)


@pytest.mark.parametrize("value", ["1", "150%", "-0.1", "slow"])
def test_a_bad_threshold_is_refused_with_the_fix(value):
    with pytest.raises(ValueError, match=r"straggler\)=.*expected a share of the time such as 0.05 or 5%"):
        torch_ext.GuardOptions(straggler=value).resolved()


def _fit_with_a_slow_rank(rank: int, world: int, tmp: str) -> dict:
    import time

    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger

    from torch_ext.lightning import GuardDDPStrategy

    pl.seed_everything(7, workers=True)

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            time.sleep(0.030 + (0.010 if self.global_rank == 2 else 0.0))  # rank 2's data is slower
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    # 120 steps (about 5 s): rank 0 analyses every 0.2 s from windows of at least 0.1 s and names a rank
    # after 3 windows; 40 steps (2 s) left the last logged figures to whichever window came last.
    data = torch.utils.data.TensorDataset(torch.randn(1440, 8), torch.randn(1440, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    trainer = pl.Trainer(accelerator="cpu", devices=world, strategy=GuardDDPStrategy(log_stragglers=5), max_epochs=1,
                         logger=CSVLogger(tmp, name="run"), log_every_n_steps=5, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(), train_dataloaders=loader)
    return {k: float(v) for k, v in trainer.logged_metrics.items() if k.startswith("straggler/")}


@serial
def test_lightning_logs_straggler_metrics_when_asked(tmp_path):
    needs("lightning")
    from harness import assert_all_ok, run_ranks

    metrics = assert_all_ok(run_ranks(_fit_with_a_slow_rank, 3, str(tmp_path), backend=None, timeout=180))
    assert metrics[0]["straggler/rank"] == 2.0 and metrics[0]["straggler/count"] >= 1, metrics[0]
    assert metrics[0]["straggler/extra_ms_per_step"] > 5, metrics[0]  # 10 ms injected, DDP's all_reduce waits it
    csv = (tmp_path / "run" / "version_0" / "metrics.csv").read_text()
    assert "straggler/rank" in csv.splitlines()[0], csv[:500]


def test_lightning_refuses_a_negative_straggler_interval():
    needs("lightning")
    from torch_ext.lightning import GuardDDPStrategy

    with pytest.raises(ValueError, match="log_stragglers must be True, False or a number of steps"):
        GuardDDPStrategy(log_stragglers=-1)
