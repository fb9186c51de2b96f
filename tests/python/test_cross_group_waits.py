"""Waits across process groups, with real processes (issue 26).

A rank absent from one group's collective is often waiting in another group's.
The snapshots ranks exchange during an incident carry every group's position, so
the report follows the missing rank into the group where it waits, and names a
deadlock when the waits close a loop (torchrec#4149: two groups over the same
ranks, issued in a different order on different ranks), or the rank at the end
of a chain of waits.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

import torch_ext
from harness import ROOT, assert_all_ok, capture_logs, report, run_ranks

ENV = {"TORCH_EXT_WARN_AFTER": "1", "TORCH_EXT_ABORT_AFTER": "4", "TORCH_EXT_INTERVAL": "0.1"}


_capture = capture_logs


# --- the torchrec#4149 shape: dp then mp on rank 0, mp then dp on ranks 1,2 ----------

def sync_grads(group) -> None:
    dist.all_reduce(torch.ones(4), group=group)


def sync_embeddings(group) -> None:
    dist.all_reduce(torch.ones(2), group=group)


def _crossed(rank: int, world: int) -> dict:
    cap = _capture()
    dp = dist.new_group(list(range(world)), backend="guard", group_desc="dp")
    mp = dist.new_group(list(range(world)), backend="guard", group_desc="mp")
    start = time.monotonic()
    error = None
    try:
        if rank == 0:
            sync_grads(dp)
            sync_embeddings(mp)
        else:
            sync_embeddings(mp)
            sync_grads(dp)
    except torch_ext.CollectiveTimeoutError as e:
        error = str(e)
    return {"start": start, "error": error, "records": cap.records}


def test_two_groups_issued_in_opposite_orders_are_reported_as_one_deadlock(tmp_path):
    env = dict(ENV, TORCH_EXT_DUMP_DIR=str(tmp_path))
    results = run_ranks(_crossed, 3, env=env, timeout=90)
    values = assert_all_ok(results)

    # Every rank ends by itself with a typed error that says it in its first line.
    for rank, v in enumerate(values):
        assert v["error"], report(results)
        first = v["error"].splitlines()[0]
        assert first.startswith("deadlock across groups dp and mp: "), v["error"]
        assert "timeout after abort_after=4 s" in first, v["error"]

    # One warning names the deadlock, logged by one rank, within warn_after + 3 s.
    warnings = [(rank, t - v["start"], msg) for rank, v in enumerate(values) for t, lvl, msg in v["records"]
                if lvl == "WARNING" and "deadlock across groups" in msg]
    assert len(warnings) == 1, [v["records"] for v in values]
    rank, after, text = warnings[0]
    assert after < 1 + 3 + 1.5, (after, text)  # slack for a loaded 2-core machine
    assert text.startswith("deadlock across groups dp and mp: collective #1"), text
    # Every edge: who waits in which group's collective, for whom, who waits where.
    assert "\n  rank 0 waits in collective #1 all_reduce(float32[4], SUM) on group \"dp\" (at " in text, text
    assert "in sync_grads" in text and "for ranks 1,2, which wait in #1 on group \"mp\"" in text, text
    assert "\n  ranks 1,2 wait in collective #1 all_reduce(float32[2], SUM) on group \"mp\" (at " in text, text
    assert "in sync_embeddings" in text and "for rank 0, which waits in #1 on group \"dp\"" in text, text
    # The missing ranks are followed into the group where they wait.
    missing = 'has not arrived: it waits in collective #1 all_reduce'
    assert missing in text, text

    # The post-mortem finds the same cycle from the dumps alone.
    out = subprocess.run([sys.executable, "-m", "torch_ext.diagnose", str(tmp_path)], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert "deadlock across groups dp and mp" in out.stdout, out.stdout + out.stderr
    assert 'rank 0 waits in collective #1 all_reduce(float32[4], SUM) on group "dp"' in out.stdout, out.stdout


# --- a chain: rank 0 waits in dp for rank 1, which waits in mp for rank 2, computing ---

def _compute(seconds: float) -> None:
    time.sleep(seconds)  # stands for a long rank-local computation


def _chain(rank: int, world: int) -> dict:
    cap = _capture()
    dp = dist.new_group([0, 1, 2], backend="guard", group_desc="dp")
    mp = dist.new_group([1, 2], backend="guard", group_desc="mp")
    if rank == 0:
        sync_grads(dp)
    elif rank == 1:
        sync_embeddings(mp)
        sync_grads(dp)
    else:
        _compute(3.0)
        sync_embeddings(mp)
        sync_grads(dp)
    return {"records": cap.records}


def test_a_chain_of_waits_names_the_rank_everything_waits_for():
    env = dict(ENV, TORCH_EXT_ABORT_AFTER="20")
    values = assert_all_ok(run_ranks(_chain, 3, env=env, timeout=90))
    texts = [msg for v in values for _, lvl, msg in v["records"] if lvl == "WARNING" and "has waited" in msg]
    assert not any("deadlock" in t for t in texts), texts
    dp = [t for t in texts if 'on group "dp"' in t.splitlines()[0]]
    assert len(dp) == 1, texts
    text = dp[0]
    assert 'rank 1 has not arrived: it waits in collective #1 all_reduce(float32[2], SUM) on group "mp"' in text, text
    assert '\n  rank 1 waits in collective #1 all_reduce(float32[2], SUM) on group "mp"' in text, text
    assert "\n  everything waits for rank 2: in no guarded collective" in text, text
    assert "in _compute" in text, text  # rank 2's main thread, as before


def _in_order(cap, first, second) -> dict:
    """One all_reduce on `first`, then one on `second`; the error it ends with, and the records."""
    error = None
    try:
        dist.all_reduce(torch.ones(1), group=first)
        dist.all_reduce(torch.ones(1), group=second)
    except torch_ext.CollectiveTimeoutError as e:
        error = str(e)
    except torch_ext.CollectiveFailureError as e:
        # A peer that raised its timeout first and exited closed the gloo
        # connection under this rank's wait: a race between the two outcomes.
        error = str(e)
    return {"error": error, "records": cap.records}


# --- three groups over the same 4 ranks, each rank issuing two of them in its own order ---

def _three_groups(rank: int, world: int) -> dict:
    cap = _capture()
    groups = {d: dist.new_group(list(range(world)), backend="guard", group_desc=d) for d in ("a", "b", "c")}
    # 0: a then b; 1: b then c; 2: c then a; 3: a then b (with rank 0).
    first, second = {0: ("a", "b"), 1: ("b", "c"), 2: ("c", "a"), 3: ("a", "b")}[rank]
    return _in_order(cap, groups[first], groups[second])


def test_three_groups_over_four_ranks_are_one_deadlock_logged_once():
    results = run_ranks(_three_groups, 4, env=ENV, timeout=90)
    values = assert_all_ok(results)
    for v in values:
        assert v["error"] and v["error"].startswith("deadlock across groups a, b and c: "), report(results)
    warnings = [msg for v in values for _, lvl, msg in v["records"]
                if lvl == "WARNING" and "deadlock across groups" in msg]
    assert len(warnings) == 1, [v["records"] for v in values]
    text = warnings[0]
    assert 'ranks 0,3 wait in collective #1 all_reduce(float32[1], SUM) on group "a"' in text, text
    assert 'rank 1 waits in collective #1 all_reduce(float32[1], SUM) on group "b"' in text, text
    assert 'rank 2 waits in collective #1 all_reduce(float32[1], SUM) on group "c"' in text, text


# --- three pairwise groups: no group holds the whole loop --------------------------------

def _pairwise(rank: int, world: int) -> dict:
    cap = _capture()
    groups = {d: dist.new_group(r, backend="guard", group_desc=d) for d, r in (("a", [0, 1]), ("b", [1, 2]),
                                                                               ("c", [0, 2]))}
    first, second = {0: ("a", "c"), 1: ("b", "a"), 2: ("c", "b")}[rank]
    return _in_order(cap, groups[first], groups[second])


def test_pairwise_groups_live_reports_follow_the_chain_and_diagnose_names_the_deadlock(tmp_path):
    env = dict(ENV, TORCH_EXT_DUMP_DIR=str(tmp_path))
    results = run_ranks(_pairwise, 3, env=env, timeout=90)
    values = assert_all_ok(results)
    assert all(v["error"] for v in values), report(results)
    # Live, each group sees two of the three ranks: the chain leaves it at the third.
    texts = [msg for v in values for _, lvl, msg in v["records"] if lvl == "WARNING" and "has waited" in msg]
    a = [t for t in texts if t.startswith('collective #1 all_reduce(float32[1], SUM) on group "a"')]
    assert len(a) == 1, texts
    assert 'rank 1 has not arrived: it waits in collective #1 all_reduce(float32[1], SUM) on group "b"' in a[0], a[0]
    assert "everything waits for rank 2 (not a member of this group" in a[0], a[0]
    # Every rank's dump holds all its groups: the post-mortem sees the whole loop.
    out = subprocess.run([sys.executable, "-m", "torch_ext.diagnose", str(tmp_path)], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert "deadlock across groups a, b and c" in out.stdout, out.stdout + out.stderr
