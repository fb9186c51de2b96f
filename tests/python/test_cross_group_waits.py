"""Waits across process groups, with real processes (issue 26).

A rank absent from one group's collective is often waiting in another group's.
The snapshots ranks exchange during an incident carry every group's position, so
the report follows the missing rank into the group where it waits, and names a
deadlock when the waits close a loop (torchrec#4149: two groups over the same
ranks, issued in a different order on different ranks), or the rank at the end
of a chain of waits. Where no group holds the whole loop (pairwise groups, a 2x2
DeviceMesh, pipeline stages), the analyst follows the waits through the
positions every rank publishes job-wide when it answers an incident. Send/recv
count as waits too: a receive waits for its peer's send.

Each case runs with the store in the test's process (as torchrun's agent holds
it) and in rank 0's (plain env://).
"""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import torch_ext
from harness import ROOT, assert_all_ok, capture_logs, report, run_ranks, run_script
from jobs import defaults_job  # the pipeline's step, also run at the defaults there

# The deadlocks here end at abort_after (END_DEADLOCKS=0): these tests read the warn_after
# report and the abort; test_verdicts_at_defaults ends them at once, with nothing set.
ENV = {"TORCH_EXT_WARN_AFTER": "1", "TORCH_EXT_ABORT_AFTER": "4", "TORCH_EXT_INTERVAL": "0.1",
       "TORCH_EXT_END_DEADLOCKS": "0"}
STORES = pytest.mark.parametrize("store", ["parent", "rank0"])


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


@STORES
def test_two_groups_issued_in_opposite_orders_are_reported_as_one_deadlock(tmp_path, store):
    env = dict(ENV, TORCH_EXT_DUMP_DIR=str(tmp_path))
    results = run_ranks(_crossed, 3, env=env, timeout=90, store=store)
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
    out = run_script(["-m", "torch_ext.diagnose", str(tmp_path)], ROOT, 60)
    assert "deadlock across groups dp and mp" in out.stdout, out.stdout + out.stderr
    assert 'rank 0 waits in collective #1 all_reduce(float32[4], SUM) on group "dp"' in out.stdout, out.stdout


# --- a chain: rank 0 waits in dp for rank 1, which waits in mp for rank 2, computing ---

def _compute(seconds: float) -> None:
    time.sleep(seconds)  # stands for a long rank-local computation


def _chain(rank: int, world: int) -> dict:
    cap = _capture()
    dp = dist.new_group([0, 1, 2], backend="guard", group_desc="dp")
    mp = dist.new_group([1, 2], backend="guard", group_desc="mp")
    start = time.monotonic()
    if rank == 0:
        sync_grads(dp)
    elif rank == 1:
        sync_embeddings(mp)
        sync_grads(dp)
    else:
        _compute(3.0)
        sync_embeddings(mp)
        sync_grads(dp)
    return {"start": start, "records": cap.records}


@STORES
def test_a_chain_of_waits_names_the_rank_everything_waits_for(store):
    env = dict(ENV, TORCH_EXT_ABORT_AFTER="20")
    values = assert_all_ok(run_ranks(_chain, 3, env=env, timeout=90, store=store))
    texts = [(t - v["start"], msg) for v in values for t, lvl, msg in v["records"]
             if lvl == "WARNING" and "has waited" in msg]
    assert not any("deadlock" in t for _, t in texts), texts
    dp = [(after, t) for after, t in texts if 'on group "dp"' in t.splitlines()[0]]
    assert len(dp) == 1, texts
    after, text = dp[0]
    assert after < 1 + 3 + 1.5, (after, text)  # within warn_after + 3 s (slack for a loaded 2-core machine)
    assert 'rank 1 has not arrived: it waits in collective #1 all_reduce(float32[2], SUM) on group "mp"' in text, text
    assert '\n  rank 1 waits in collective #1 all_reduce(float32[2], SUM) on group "mp"' in text, text
    assert "\n  everything waits for rank 2: in no guarded collective" in text, text
    assert "in _compute" in text, text  # rank 2's main thread, as before


def _in_order(cap, first, second) -> dict:
    """One all_reduce on `first`, then one on `second`; the error it ends with, and the records."""
    def step():
        dist.all_reduce(torch.ones(1), group=first)
        dist.all_reduce(torch.ones(1), group=second)
    return _timed(cap, step)


# --- three groups over the same 4 ranks, each rank issuing two of them in its own order ---

def _three_groups(rank: int, world: int) -> dict:
    cap = _capture()
    groups = {d: dist.new_group(list(range(world)), backend="guard", group_desc=d) for d in ("a", "b", "c")}
    # 0: a then b; 1: b then c; 2: c then a; 3: a then b (with rank 0).
    first, second = {0: ("a", "b"), 1: ("b", "c"), 2: ("c", "a"), 3: ("a", "b")}[rank]
    return _in_order(cap, groups[first], groups[second])


@STORES
def test_three_groups_over_four_ranks_are_one_deadlock_logged_once(store):
    results = run_ranks(_three_groups, 4, env=ENV, timeout=90, store=store)
    values = assert_all_ok(results)
    for v in values:
        assert v["error"] and v["error"].startswith("deadlock across groups a, b and c: "), report(results)
    warnings = [(t - v["start"], msg) for v in values for t, lvl, msg in v["records"]
                if lvl == "WARNING" and "deadlock across groups" in msg]
    assert len(warnings) == 1, [v["records"] for v in values]
    after, text = warnings[0]
    assert after < 1 + 3 + 1.5, (after, text)
    assert 'ranks 0,3 wait in collective #1 all_reduce(float32[1], SUM) on group "a"' in text, text
    assert 'rank 1 waits in collective #1 all_reduce(float32[1], SUM) on group "b"' in text, text
    assert 'rank 2 waits in collective #1 all_reduce(float32[1], SUM) on group "c"' in text, text


# --- loops that no group holds whole: followed through the positions ranks publish ------

def _one_deadlock(results, headline: str) -> str:
    """Every rank ended by itself with the deadlock in its error's first line; one warning names it,
    logged once within warn_after + 3 s. Returns that warning."""
    values = assert_all_ok(results)
    for v in values:
        assert v["error"] and v["error"].splitlines()[0].startswith(headline + ": "), report(results)
        assert "timeout after abort_after=4 s" in v["error"].splitlines()[0] or "failed" in v["error"], v["error"]
    warnings = [(t - v["start"], msg) for v in values for t, lvl, msg in v["records"]
                if lvl == "WARNING" and "deadlock across groups" in msg]
    assert len(warnings) == 1, [v["records"] for v in values]
    after, text = warnings[0]
    assert text.startswith(headline + ": "), text
    assert after < 1 + 3 + 1.5, (after, text)  # slack for a loaded 2-core machine
    return text


def _diagnose(path) -> str:
    out = run_script(["-m", "torch_ext.diagnose", str(path)], ROOT, 60)
    assert out.returncode != 0 or out.stdout, out.stderr
    return out.stdout + out.stderr


def _timed(cap, fn) -> dict:
    start = time.monotonic()
    error = None
    try:
        fn()
    except (torch_ext.CollectiveTimeoutError, torch_ext.CollectiveFailureError) as e:
        # CollectiveFailureError: a peer that raised its timeout first and exited
        # closed the gloo connection under this rank's wait (a race between the two).
        error = str(e)
    return {"start": start, "error": error, "records": cap.records}


# A 2x2 DeviceMesh ("dp" x "tp"): ranks 0 and 3 reduce over dp first, ranks 1 and 2 over tp first.
# Each dimension is two pairwise groups, so the loop 0 -> 2 -> 3 -> 1 -> 0 crosses four groups.

def _mesh(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    cap = _capture()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    order = ("dp", "tp") if rank in (0, 3) else ("tp", "dp")

    def step():
        for dim in order:
            dist.all_reduce(torch.ones(2), group=mesh.get_group(dim))
    return _timed(cap, step)


@STORES
def test_device_mesh_dimensions_issued_in_crossed_orders_are_one_deadlock_live(tmp_path, store):
    env = dict(ENV, TORCH_EXT_DUMP_DIR=str(tmp_path))
    text = _one_deadlock(run_ranks(_mesh, 4, env=env, timeout=90, store=store),
                         "deadlock across groups mesh_dp and mesh_tp")
    # Every edge of the loop, each through the mesh dimension torch named the group after.
    for waiter, group, waited in ((0, "mesh_dp", 2), (2, "mesh_tp", 3), (3, "mesh_dp", 1), (1, "mesh_tp", 0)):
        assert (f'\n  rank {waiter} waits in collective #1 all_reduce(float32[2], SUM) on group "{group}" (at '
                in text), text
        assert f") for rank {waited}, which waits in #1 on group " in text, text
    out = _diagnose(tmp_path)
    assert out.count("deadlock across groups mesh_dp and mesh_tp") == 4, out  # printed once, referred to 3 times
    assert out.count("part of the deadlock across groups mesh_dp and mesh_tp above") == 3, out


# Two pipeline stages of two data-parallel replicas each: stage 0 is ranks 0,1 (dp), stage 1 ranks 2,3
# (dp); pp pairs 0-2 and 1-3. Rank 0 reduces before sending its activations to rank 2, which receives
# before reducing; rank 1 receives its gradients from rank 3 before reducing, and rank 3 reduces before
# sending them: 2 waits for 0 (recv), 0 for 1 (dp), 1 for 3 (recv), 3 for 2 (dp).

def _pipeline(rank: int, world: int) -> dict:
    cap = _capture()
    dp, pp = defaults_job.pipeline_groups(rank)
    t = torch.ones(3)
    return _timed(cap, lambda: defaults_job.pipeline_step(rank, dp, pp, t))


@STORES
def test_pipeline_send_recv_and_data_parallel_reduce_are_one_deadlock_live(tmp_path, store):
    env = dict(ENV, TORCH_EXT_DUMP_DIR=str(tmp_path))
    text = _one_deadlock(run_ranks(_pipeline, 4, env=env, timeout=90, store=store), "deadlock across groups dp and pp")
    assert '\n  rank 2 waits in recv(float32[3], src=0, tag=0) from rank 0 on group "pp" (at ' in text, text
    assert '\n  rank 1 waits in recv(float32[3], src=1, tag=0) from rank 3 on group "pp" (at ' in text, text
    assert '\n  rank 0 waits in collective #1 all_reduce(float32[3], SUM) on group "dp" (at ' in text, text
    assert '\n  rank 3 waits in collective #1 all_reduce(float32[3], SUM) on group "dp" (at ' in text, text
    assert "for rank 1, which waits in recv(float32[3], src=1, tag=0) from rank 3 on group \"pp\"" in text, text
    out = _diagnose(tmp_path)
    assert "deadlock across groups dp and pp" in out, out
    # The HTML view draws the loop: an arrow per wait, labelled with its group and operation.
    html = run_script(["-m", "torch_ext.diagnose", str(tmp_path), "--html", str(tmp_path / "r.html")], ROOT, 60)
    page = (tmp_path / "r.html").read_text()
    assert "<svg class='cycle'" in page, html.stdout + html.stderr
    assert page.count("class='wait'") == 4, page
    assert ">pp: recv</text>" in page and ">dp #1 all_reduce</text>" in page, page


# --- three pairwise groups: no group holds the whole loop --------------------------------

def _pairwise(rank: int, world: int) -> dict:
    cap = _capture()
    groups = {d: dist.new_group(r, backend="guard", group_desc=d) for d, r in (("a", [0, 1]), ("b", [1, 2]),
                                                                               ("c", [0, 2]))}
    first, second = {0: ("a", "c"), 1: ("b", "a"), 2: ("c", "b")}[rank]
    return _in_order(cap, groups[first], groups[second])


@STORES
def test_pairwise_groups_are_one_deadlock_live_and_in_the_post_mortem(tmp_path, store):
    env = dict(ENV, TORCH_EXT_DUMP_DIR=str(tmp_path))
    results = run_ranks(_pairwise, 3, env=env, timeout=90, store=store)
    values = assert_all_ok(results)
    for v in values:
        assert v["error"] and v["error"].startswith("deadlock across groups a, b and c: "), report(results)
    # Each group holds two of the three ranks; its analyst reads the third's published positions.
    warnings = [msg for v in values for _, lvl, msg in v["records"]
                if lvl == "WARNING" and "deadlock across groups" in msg]
    assert len(warnings) == 1, [v["records"] for v in values]
    assert 'rank 0 waits in collective #1 all_reduce(float32[1], SUM) on group "a"' in warnings[0], warnings[0]
    assert 'rank 1 waits in collective #1 all_reduce(float32[1], SUM) on group "b"' in warnings[0], warnings[0]
    assert 'rank 2 waits in collective #1 all_reduce(float32[1], SUM) on group "c"' in warnings[0], warnings[0]
    # Every rank's dump holds all its groups: the post-mortem sees the whole loop, and prints it once.
    out = _diagnose(tmp_path)
    assert out.count("deadlock across groups a, b and c") == 3, out
    assert out.count("part of the deadlock across groups a, b and c above") == 2, out
