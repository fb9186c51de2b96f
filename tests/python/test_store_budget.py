"""The store budget bounds the watchdog's store traffic, and checks still work under it.

TORCH_EXT_STORE_BUDGET is ops/s for the whole job; a group of W ranks then
exchanges every max(interval, (3 + 1/k) W / budget) seconds, where 1/k is the
straggler analyst's read of every rank's status (rank 0, every k-th exchange:
k = 1 up to 64 ranks). Tested with a budget small enough to stretch a 3-rank
group (12 ops/s: one exchange per second), against the same group without a
budget, in real processes.
"""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import torch_ext
from harness import assert_all_ok, report, run_ranks

WORLD = 3
BUDGET = 12  # ops/s for the job: 3 ranks x (3 + 1) ops per exchange -> one exchange per second


def _store_ops(rank: int, world: int, seconds: float) -> tuple[int, float]:
    dist.all_reduce(torch.ones(1))  # the watchdog runs from here
    ops0, t0 = torch_ext._C._watchdog_stats()["store_ops"], time.monotonic()
    while True:
        # Progress every step (a status to publish at every exchange); rank 0's
        # clock says when to stop, so every rank stops at the same step.
        go = torch.tensor([1.0 if rank != 0 or time.monotonic() - t0 < seconds else 0.0])
        dist.all_reduce(go, op=dist.ReduceOp.MIN)
        if go.item() == 0:
            break
    return torch_ext._C._watchdog_stats()["store_ops"] - ops0, time.monotonic() - t0


@pytest.mark.serial  # counts store ops per second of wall time: run alone
def test_the_budget_is_the_ceiling_of_the_jobs_store_traffic():
    period = torch_ext._C.exchange_interval(0.2, BUDGET, WORLD)
    assert period == 1.0
    env = {"TORCH_EXT_INTERVAL": "0.2"}
    capped = assert_all_ok(run_ranks(_store_ops, WORLD, 5.0, env=dict(env, TORCH_EXT_STORE_BUDGET=str(BUDGET)),
                                     timeout=90))
    free = assert_all_ok(run_ranks(_store_ops, WORLD, 5.0, env=dict(env, TORCH_EXT_STORE_BUDGET="0"), timeout=90))
    assert torch_ext._C.straggler_look_every(WORLD) == 1
    for rank, (ops, elapsed) in enumerate(capped):
        # A ceiling: exchanges can be late on a loaded machine, never early (each
        # comes due 10 ms before its period ends), plus the one at the window's start.
        # Rank 0 also reads every status for the straggler report once per exchange,
        # after checking once that they exist, and writes its first analysis.
        exchanges = elapsed / (period - 0.01) + 1
        assert ops <= (4 * exchanges + 2 if rank == 0 else 3 * exchanges), (capped, free)
    # Without it the same group exchanges every 0.2 s: several times more traffic
    # (15 ops/s per rank; fewer when a loaded machine delays ticks).
    assert sum(o / e for o, e in free) > 2 * sum(o / e for o, e in capped), (capped, free)


def _mismatch_under_budget(rank: int, world: int) -> str:
    deadline = time.monotonic() + 30
    try:
        dist.all_reduce(torch.ones(5 if rank == 1 else 4))
        while time.monotonic() < deadline:
            dist.all_reduce(torch.ones(1))
    except torch_ext.CollectiveMismatchError as e:
        return str(e)
    return "no error"


def test_an_async_mismatch_is_still_found_on_every_rank_under_a_tight_budget():
    results = run_ranks(_mismatch_under_budget, WORLD,
                        env={"TORCH_EXT_CHECK": "async", "TORCH_EXT_STORE_BUDGET": str(BUDGET)},
                        timeout=90)
    for rank, text in enumerate(assert_all_ok(results)):
        assert "differs across ranks" in text, f"rank {rank}: {text}\n{report(results)}"
        assert "all_reduce(float32[5], SUM)" in text and "all_reduce(float32[4], SUM)" in text, text
