"""The GPU rule: skip where GPUs are missing, fail on a GPU runner where they are missing.

A test that needs n CUDA devices is skipped on a machine with fewer (a laptop, a
CPU CI job), but on a runner that is *meant* to have them (``TORCH_EXT_GPU_RUNNER=1``)
the same shortfall is a failure: a broken driver or a wrong runner label must not
turn the whole GPU job into a green row of skips.
"""
from __future__ import annotations

import os

GPU_RUNNER_VAR = "TORCH_EXT_GPU_RUNNER"


def gpu_runner() -> bool:
    """Whether this machine is declared a GPU runner (``TORCH_EXT_GPU_RUNNER=1``).

    The one place the variable is read. Unset, empty or ``0``: no; ``1``: yes;
    anything else is refused, naming the accepted values.
    """
    value = os.environ.get(GPU_RUNNER_VAR, "")
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise ValueError(f"{GPU_RUNNER_VAR}={value!r}: expected 1 (this is a GPU runner: missing GPUs fail the "
                     "tests that need them) or 0/unset (they are skipped)")


def visible_gpus() -> int:
    """CUDA devices this process can use (0 with a CPU-only torch)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_shortfall(count: int) -> str | None:
    """None when ``count`` CUDA devices are visible, else a sentence saying what is missing."""
    have = visible_gpus()
    if have >= count:
        return None
    return f"needs {count} CUDA device(s), found {have}"


def apply_gpu_rule(count: int, what: str = "this test") -> None:
    """Skips (or, on a GPU runner, fails) the running pytest test when fewer than ``count`` GPUs are visible."""
    import pytest

    missing = gpu_shortfall(count)
    if missing is None:
        return
    if gpu_runner():
        pytest.fail(f"GPU runner ({GPU_RUNNER_VAR}=1): {what} {missing}. Check the runner's driver and "
                    "CUDA_VISIBLE_DEVICES, or run it on a machine with that many GPUs.", pytrace=False)
    pytest.skip(f"{what} {missing} (set {GPU_RUNNER_VAR}=1 on GPU runners to fail instead of skipping)")
