"""Pipeline parallelism under the guard (issue 68): torch.distributed.pipelining's schedules and the send
cycles pipelines make, at the guard's default settings.

gloo's send completes only once its peer has posted the receive, so a stage blocked in a send to a peer
that is itself blocked (in a collective, or in a send back) waits forever: the guard ends such a loop at
warn_after's look (10 s) with DeadlockError on every stage, as it ends a cycle of collectives, instead
of at abort_after (the group's timeout, 30 minutes). Real ranks (tests/python/harness.py run_ranks), each
run under a deadline.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import torch_ext
from harness import report, run_ranks

DEFAULTS = {"TORCH_EXT_WARN_AFTER": "", "TORCH_EXT_ABORT_AFTER": ""}  # "": the guard's defaults


def _gpipe(rank: int, world: int, fault: str):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 8) for _ in range(2 * world)]
    stage = PipelineStage(torch.nn.Sequential(*layers[2 * rank:2 * rank + 2]), rank, world, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=lambda out, target: ((out - target) ** 2).mean())
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    try:
        for step in range(4):
            if step == 2 and rank == 1 and fault == "collective":
                dist.barrier()  # the bug: a collective on one stage while the others run the schedule  # BARRIER
            if step == 2 and rank == 1 and fault == "gone":
                os._exit(3)
            if rank == 0:
                schedule.step(x)  # STEP
            elif rank == world - 1:
                schedule.step(target=y, losses=[])
            else:
                schedule.step()
    except torch_ext.GuardError as e:
        return type(e).__name__, str(e)
    return "done", ""


@pytest.mark.timeout(120)
def test_a_gpipe_schedule_runs_under_the_guard_at_every_stage():
    results = run_ranks(_gpipe, 3, "none", env=DEFAULTS, timeout=90)
    assert [r.value for r in results] == [("done", "")] * 3, report(results)


@pytest.mark.timeout(120)
def test_a_stage_that_issues_a_collective_mid_schedule_is_a_deadlock_ended_on_every_stage_at_warn_after():
    results = run_ranks(_gpipe, 2, "collective", env=DEFAULTS, timeout=90)
    for r in results:
        assert not r.timed_out and r.ok, report(results)
        kind, text = r.value
        assert kind == "DeadlockError", report(results)
        assert "rank 1 waits in collective #1 barrier()" in text and "test_pipelining.py:" in text, text
        assert "every rank of the loop blocks in its wait" in text, text


@pytest.mark.timeout(120)
def test_a_stage_gone_mid_schedule_ends_the_others_naming_it():
    results = run_ranks(_gpipe, 2, "gone", env=DEFAULTS, timeout=90)
    assert results[1].exitcode == 3, report(results)
    kind, text = results[0].value
    assert kind == "CollectiveFailureError" and "rank 1" in text, report(results)


def _both_send_first(rank: int, world: int):
    peer = 1 - rank
    try:
        dist.send(torch.ones(4), peer)  # the bug: both stages send first  # SEND
        dist.recv(torch.empty(4), peer)
    except torch_ext.GuardError as e:
        return type(e).__name__, str(e)
    return "done", ""


@pytest.mark.timeout(120)
def test_two_stages_that_both_send_first_end_typed_on_both_within_seconds():
    # Every rank waits in a point-to-point op no peer has posted the counterpart of: check="verify" pairs
    # them and fails the group as a mismatch about a second in, before any deadlock look.
    results = run_ranks(_both_send_first, 2, env=DEFAULTS, timeout=90)
    for r in results:
        assert not r.timed_out and r.ok, report(results)
        kind, text = r.value
        assert kind == "CollectiveMismatchError" and "do not pair" in text, report(results)
        assert f"send(float32[4], dst={1 - r.rank}" in text and "test_pipelining.py:" in text, text
