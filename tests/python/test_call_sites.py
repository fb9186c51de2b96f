"""Reports name the user's line, not the framework's (issue 14).

Real jobs under Lightning (``ddp_guard``, started by Lightning's own launcher and
by torchrun), Accelerate and a plain script, each with a classic bug; every test
asserts the user's file:line and function in the report, and that every process
ends by itself within the run's deadline.
"""
from __future__ import annotations

import os
import re
import shutil

import pytest

from harness import needs, run_script

JOBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs", "callsites")


def _line(script: str, mark: str) -> int:
    with open(os.path.join(JOBS, script)) as f:
        for n, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# LINE:{mark}"):
                return n
    raise AssertionError(f"no '# LINE:{mark}' in {script}")


def _copy(tmp_path, *names: str) -> None:
    for name in names:
        src = os.path.join(JOBS, name)
        if os.path.isdir(src):
            shutil.copytree(src, tmp_path / name)
        else:
            shutil.copy(src, tmp_path / name)


def _run(tmp_path, script: str, args: list[str], nproc: int | None, timeout: float = 150, **env: str):
    # subprocess.run raises TimeoutExpired (failing the test) if any process
    # outlives the deadline: every process must end by itself.
    proc = run_script([script, *args], tmp_path, timeout, nproc, PYTHONWARNINGS="ignore",
                      TORCH_EXT_INTERVAL="0.1", **env)
    return proc, proc.stdout + proc.stderr


LAUNCHERS = [pytest.param(None, id="lightning-launcher"), pytest.param(3, id="torchrun")]


def _names_ranks_1_2_as_gone(out: str) -> bool:
    """Rank 0's report names ranks 1 and 2 as gone without its collective. Both exit notices
    in the store: "ranks 1,2 never issued before ending". Under load either may not be there
    yet when the report is made (CI saw both missing once): such a rank is then named by its
    silence ("rank 2: no heartbeat for 2.5 s (process gone or frozen)"), any other as having
    ended without it."""
    if "ranks 1,2 never issued before ending" in out:
        return True

    def named(rank: int) -> bool:
        return (f"rank {rank} never issued before ending" in out
                or re.search(rf"rank {rank}: (exited|no heartbeat for [\d.]+ s \(process gone or frozen\))", out)
                is not None)
    return named(1) and named(2)


@pytest.mark.parametrize("nproc,case", [pytest.param(None, "log_rank0_step", id="lightning-launcher-step"),
                                        pytest.param(3, "log_rank0", id="torchrun-epoch")])
def test_lightning_rank0_only_log_sync_dist(tmp_path, nproc, case):
    needs("lightning")
    _copy(tmp_path, "lightning_job.py")
    proc, out = _run(tmp_path, "lightning_job.py", [case], nproc)
    if case == "log_rank0_step":
        # Synced inside self.log: the user's validation_step line.
        where = f"lightning_job.py:{_line('lightning_job.py', 'log_rank0_step')} in Model.validation_step"
    else:
        # Synced by Lightning's loop at epoch end: the user's innermost frame is trainer.fit.
        where = f"lightning_job.py:{_line('lightning_job.py', 'fit')} in main"
    # The user's line, then the Lightning frame it went through.
    assert re.search(re.escape(where) + r" \(via lightning \.\.\./distributed\.py:\d+ in _sync_ddp\)", out), out[-6000:]
    assert "rank 0 issued collectives that rank" in out and _names_ranks_1_2_as_gone(out), out[-6000:]
    # Ranks 1-2 finished fit; they did not run out of data.
    assert "ran out of data" not in out, out[-6000:]
    assert out.count("rank 1 finished fit") == 1 and out.count("rank 2 finished fit") == 1, out[-6000:]
    assert proc.returncode != 0  # rank 0's collective failed


def test_lightning_epoch_metric_sync_names_the_metric_its_log_line_and_a_hint(tmp_path):
    """Issue 29: the sync runs at epoch end, from Lightning's loop; the report still
    names the metric, the user's self.log line in validation_step, and says what to do."""
    needs("lightning")
    _copy(tmp_path, "lightning_job.py")
    proc, out = _run(tmp_path, "lightning_job.py", ["log_rank0"], None)  # Lightning's own launcher
    line = _line("lightning_job.py", "log_rank0")
    assert (f"for metric 'val_loss' logged with sync_dist=True (asked for at lightning_job.py:{line} in "
            "Model.validation_step)") in out, out[-6000:]
    assert ("hint: a metric logged with sync_dist=True on some ranks only "
            "(e.g. under `if self.trainer.is_global_zero:`") in out, out[-6000:]
    assert "rank_zero_only=True and without sync_dist" in out, out[-6000:]
    assert _names_ranks_1_2_as_gone(out), out[-6000:]
    assert proc.returncode != 0  # rank 0's collective failed; every process ended by itself (no TimeoutExpired)


def test_lightning_log_dict_key_on_one_rank_names_the_key_and_the_log_dict_line(tmp_path):
    """Lightning#19106: log_dict keys that differ across ranks. The extra key's sync names
    the key and the user's log_dict line (through Lightning's log_dict -> log)."""
    needs("lightning")
    _copy(tmp_path, "lightning_job.py")
    proc, out = _run(tmp_path, "lightning_job.py", ["log_dict_keys"], 3)
    line = _line("lightning_job.py", "log_dict")
    assert (f"for metric 'val_acc_c3' logged with sync_dist=True (asked for at lightning_job.py:{line} in "
            "Model.validation_step)") in out, out[-6000:]
    assert "hint: a metric logged with sync_dist=True on some ranks only" in out, out[-6000:]
    # Per rank, the metrics synced there, and which one is missing where (ranks 1 and 2
    # ended: their syncs are read from rank 0's ledger up to their last collective; under
    # load a rank whose exit notice is not in the store yet may be left out, as above).
    assert "metric syncs here: rank 0 synced val_loss, val_acc_c3; ranks 1,2 synced val_loss only" in out or (
        re.search(r"metric syncs here: rank 0 synced val_loss, val_acc_c3; rank [12] synced val_loss only", out)), \
        out[-6000:]
    assert re.search(r"val_acc_c3 is synced on rank 0 only: (ranks 1,2|rank 1|rank 2) never synced it here", out), \
        out[-6000:]
    assert proc.returncode != 0


def test_lightning_torchmetric_on_rank0_only_names_the_metric_its_log_line_and_a_hint(tmp_path):
    """Issue 29: a torchmetrics metric updated and logged on rank 0 only; Lightning computes
    it (torchmetrics syncs its state) at epoch end. The report names the logged name, the
    metric's class, the user's self.log line and what to do."""
    needs("lightning")
    needs("torchmetrics")
    _copy(tmp_path, "lightning_job.py")
    proc, out = _run(tmp_path, "lightning_job.py", ["torchmetric_rank0"], None)  # Lightning's own launcher
    line = _line("lightning_job.py", "torchmetric_rank0")
    assert (f"for metric 'val_mse' (MeanSquaredError, torchmetrics) logged with self.log (asked for at "
            f"lightning_job.py:{line} in Model.validation_step)") in out, out[-6000:]
    assert "hint: a torchmetrics metric logged with self.log(name, metric) is synced across all ranks" in out, \
        out[-6000:]
    assert "val_mse is synced on rank 0 only" in out, out[-6000:]
    assert _names_ranks_1_2_as_gone(out), out[-6000:]
    assert proc.returncode != 0  # rank 0's collective failed; every process ended by itself


@pytest.mark.parametrize("nproc", LAUNCHERS)
def test_lightning_rank0_only_validation_collective(tmp_path, nproc):
    needs("lightning")
    _copy(tmp_path, "lightning_job.py")
    proc, out = _run(tmp_path, "lightning_job.py", ["validate_rank0"], nproc)
    line = _line("lightning_job.py", "validate_rank0")
    assert f"lightning_job.py:{line} in Model.validation_step (via lightning " in out, out[-6000:]
    assert _names_ranks_1_2_as_gone(out), out[-6000:]


def test_lightning_hang_in_training_step(tmp_path):
    needs("lightning")
    _copy(tmp_path, "lightning_job.py")
    proc, out = _run(tmp_path, "lightning_job.py", ["hang"], 3, TORCH_EXT_WARN_AFTER="2")
    assert proc.returncode == 0, out[-6000:]  # a warning only: the stalled rank catches up
    sync = _line("lightning_job.py", "train_sync")
    stall = _line("lightning_job.py", "stall")
    assert re.search(rf"waiting: ranks 0,2 at lightning_job\.py:{sync} in Model\.training_step \(via lightning ",
                     out), out[-6000:]
    # The stalled rank's main thread: its user frames, framework frames folded.
    # (Each line of the logged report carries torch_ext's label: the job configures no logging.)
    m = re.search(r"rank 1 has not arrived.*?main thread now at\n"
                  r"(?:\[rank\d\] [\d:]+ torch_ext WARNING: )?    (.*)", out)
    assert m, out[-6000:]
    stack = m.group(1)
    assert "lightning_job.py:" in stack and "in load_slowly" in stack, stack
    assert f"lightning_job.py:{stall} in Model.training_step" in stack, stack
    assert re.search(r"\.\.\. \d+ [a-z_, ]*lightning[a-z_, ]* frames \.\.\.", stack), stack
    assert stack.index("in load_slowly") < stack.index("in Model.training_step") < stack.index(" in main")


def test_accelerate_rank0_only_gather(tmp_path):
    needs("accelerate")
    _copy(tmp_path, "accelerate_job.py")
    proc, out = _run(tmp_path, "accelerate_job.py", [], 2)
    line = _line("accelerate_job.py", "gather_rank0")
    assert f"accelerate_job.py:{line} in evaluate (via accelerate .../" in out, out[-6000:]
    assert "rank 0 issued collectives that rank 1 never issued before ending" in out, out[-6000:]


def test_plain_script_names_the_line_without_via(tmp_path):
    _copy(tmp_path, "plain_job.py")
    proc, out = _run(tmp_path, "plain_job.py", [], 2)
    line = _line("plain_job.py", "plain_reduce")
    assert re.search(rf"#4 all_reduce\(float32\[1\], SUM\) at plain_job\.py:{line} in log_metric\n", out), out[-6000:]
    assert "(via" not in out, out[-6000:]
    assert "rank 0 issued collectives that rank 1 never issued before ending" in out, out[-6000:]


def test_working_dir_package_is_user_code_unless_listed(tmp_path):
    _copy(tmp_path, "plain_job.py", "mylab")
    helper = _line("mylab/metrics.py", "mylab_reduce")
    call = _line("plain_job.py", "helper_call")
    # A package in the working directory is code under development: its line is named.
    proc, out = _run(tmp_path, "plain_job.py", ["--helper"], 2)
    assert f"metrics.py:{helper} in global_mean\n" in out, out[-6000:]
    # Listed as a library, it is folded into "via" and the script's line is named.
    proc, out = _run(tmp_path, "plain_job.py", ["--helper"], 2, TORCH_EXT_LIBRARY_PACKAGES="mylab")
    assert (f"plain_job.py:{call} in log_metric (via mylab .../metrics.py:{helper} in global_mean)" in out), \
        out[-6000:]
