"""Multi-process tests for distributed code: one process per rank, a deadline on
everything, and one error that says what every rank did.

::

    from torch_ext.testing import run_ranks

    def body(rank, world_size):
        t = torch.ones(1)
        dist.all_reduce(t)          # on an initialised guard group (gloo inside)
        return t.item()

    assert run_ranks(body, 4, timeout=30).values == [4.0] * 4

A hung collective fails with the guard's report (who waits where, who is
absent, with their stacks) well within ``timeout``; a rank that raises shows its
traceback; every rank's exit status is in the one :class:`RanksFailedError`.

The pytest plugin (loaded through the ``pytest11`` entry point once torch_ext is
installed; ``-p no:torch_ext`` disables it) runs whole test functions this way:
``@pytest.mark.world(4)`` / ``@pytest.mark.world(2, device="cuda")``, see
``docs/testing.md``.

:mod:`torch_ext.testing.nccl_sim` (registered on import as the ``nccl_sim``
backend) runs NCCL's host semantics on CPU tensors: a training loop written for
NCCL, and the guard's device path, can be tested without a GPU.

:mod:`torch_ext.testing.replay` runs what ``torch-ext-diagnose DUMP_DIR --repro
OUT.py`` wrote: a job's collectives replayed on CPU, checked against the job's
verdict (``replay.run(JOB, RANKS).same``).
"""
from __future__ import annotations

from torch_ext.testing import nccl_sim
from torch_ext.testing._gpu import GPU_RUNNER_VAR, apply_gpu_rule, gpu_runner, gpu_shortfall, visible_gpus
from torch_ext.testing._procs import ProcResult, launch_script
from torch_ext.testing._ranks import (
    RankResult,
    RanksFailedError,
    RunResults,
    assert_all_ok,
    free_port,
    guard_deadlines,
    rank_env,
    report,
    run_ranks,
)

__all__ = [
    "GPU_RUNNER_VAR",
    "ProcResult",
    "RankResult",
    "RanksFailedError",
    "RunResults",
    "apply_gpu_rule",
    "assert_all_ok",
    "free_port",
    "gpu_runner",
    "gpu_shortfall",
    "guard_deadlines",
    "launch_script",
    "nccl_sim",
    "rank_env",
    "report",
    "run_ranks",
    "visible_gpus",
]
