"""A guard error's report as values: ``err.report`` (torch_ext.Report), read on every rank.

What a program (or torch_ext/_ddp.py) reads from a failure must come from the
facts the C++ core found, not from parsing the text: the error's kind, the
verdict, the group, the ranks by where they stand, what each rank issued and
from which line, and each named operation's dtype and shape. Real processes on
gloo; the mismatch in every check mode (verify is the default).
"""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

import torch_ext
from harness import assert_all_ok, report, run_ranks

MODES = {
    "verify": {},  # the default
    "strict": {"TORCH_EXT_CHECK": "strict"},
    "async": {"TORCH_EXT_CHECK": "async"},
}


def _facts(e: torch_ext.GuardError) -> dict:
    r = e.report
    assert r is not None, str(e)
    return {"type": type(e).__name__, "report": r, "text": str(e)}


def _issue() -> None:
    dist.all_reduce(torch.ones(5 if dist.get_rank() == 1 else 4))


def _mismatch(rank: int, world: int) -> dict:
    dist.all_reduce(torch.ones(2))
    try:
        _issue()
        for _ in range(200):  # async reports on the collectives that follow
            dist.all_reduce(torch.ones(1))
    except torch_ext.GuardError as e:
        return _facts(e)
    return {"type": None}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_mismatch_reports_each_ranks_op_and_line_as_values_on_every_rank(mode):
    results = run_ranks(_mismatch, 3, env=MODES[mode], timeout=90)
    values = assert_all_ok(results)
    for rank, v in enumerate(values):
        where = f"{mode} rank {rank}:\n{report(results)}"
        assert v["type"] == "CollectiveMismatchError", where
        r: torch_ext.Report = v["report"]
        assert (r.error, r.verdict, r.group, r.seq) == ("mismatch", "mismatch", "default_pg", 2), (r, where)
        assert v["text"].startswith(r.text), where  # later operations add a line saying they ran into it
        assert [row.rank for row in r.rows] == [0, 1, 2] and r.ranks == (0, 1, 2), r
        ops = {row.rank: row.op for row in r.rows}
        assert ops == {0: "all_reduce(float32[4], SUM)", 1: "all_reduce(float32[5], SUM)",
                       2: "all_reduce(float32[4], SUM)"}, r
        assert all(row.issued and "test_report_facts.py:" in row.site and "in _issue" in row.site
                   for row in r.rows), r
        facts = {f.text: (f.op, f.dtype, f.sizes, f.tensors, f.reduce_op, f.numel) for f in r.ops}
        assert facts == {"all_reduce(float32[4], SUM)": ("all_reduce", "float32", (4,), 1, "SUM", 4),
                         "all_reduce(float32[5], SUM)": ("all_reduce", "float32", (5,), 1, "SUM", 5)}, r


def _killed(rank: int, world: int) -> dict:
    dist.all_reduce(torch.ones(1))
    if rank == world - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(torch.ones(3, 2))
    except torch_ext.GuardError as e:
        return _facts(e)
    return {"type": None}


def test_a_dead_rank_is_gone_in_the_facts_of_every_survivor_at_the_defaults():
    results = run_ranks(_killed, 3, timeout=90)
    assert results[2].exitcode == -signal.SIGKILL, report(results)
    for r in results[:2]:
        assert r.ok and r.value["type"] == "CollectiveFailureError", report(results)
        facts: torch_ext.Report = r.value["report"]
        assert (facts.error, facts.verdict, facts.seq) == ("failure", "failure", 2), facts
        assert facts.op == "all_reduce(float32[3, 2], SUM)" and facts.gone == (2,), facts
        assert [(f.op, f.sizes, f.numel) for f in facts.ops] == [("all_reduce", (3, 2), 6)], facts
        assert facts.rows == () and r.value["text"].startswith(facts.text), facts


def _late(rank: int, world: int) -> dict:
    dist.all_reduce(torch.ones(1))
    try:
        if rank == 1:
            # Elsewhere (computing) until the others' wait is aborted: the verdict fails the group here too.
            deadline = time.monotonic() + 60
            while torch_ext.failure() is None and time.monotonic() < deadline:
                time.sleep(0.02)  # polls a condition, with a deadline
        dist.all_reduce(torch.ones(7))
    except torch_ext.GuardError as e:
        return _facts(e)
    return {"type": None}


def test_a_rank_that_never_arrives_is_not_arrived_and_the_others_wait_in_the_facts():
    env = {"TORCH_EXT_WARN_AFTER": "1", "TORCH_EXT_ABORT_AFTER": "3"}
    results = run_ranks(_late, 3, env=env, timeout=90)
    values = assert_all_ok(results)
    for rank, v in enumerate(values):
        assert v["type"] == "CollectiveTimeoutError", report(results)
        facts: torch_ext.Report = v["report"]
        assert (facts.error, facts.verdict, facts.seq, facts.op) == ("timeout", "hang", 2,
                                                                     "all_reduce(float32[7], SUM)"), facts
        assert facts.waiting == (0, 2) and facts.not_arrived == (1,) and facts.gone == (), facts
        assert facts.ranks == (0, 1, 2), facts


def test_an_error_no_guarded_group_raised_has_no_report():
    assert torch_ext.CollectiveFailureError("rank 1: made up").report is None
