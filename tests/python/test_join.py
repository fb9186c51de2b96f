"""The guard never causes the hang it exists to name (issue 57): the ranks agree at the door.

Before the inner backends rendezvous, every guard rank joins the group
(csrc/guard/store/JoinHandshake.h): the job-wide settings are rank 0's (the
rank whose own value differed logs one line), a rank that created plain gloo
there fails every guard rank at once, and a rank that never comes fails them
at join_timeout. Real processes, launched as SLURM or mpirun do (plain env://,
rank 0's process hosts the store) and as torchrun does (the store outside the
ranks), at the guard's defaults unless a test says otherwise.
"""
from __future__ import annotations

import json

import pytest

from harness import launch_script

JOB = ["tests/python/jobs/join_job.py"]
DEFAULTS = {"TORCH_EXT_WARN_AFTER": "", "TORCH_EXT_ABORT_AFTER": ""}  # "": the guard's defaults
STORES = ["rank0", "parent"]
NOTE = 'torch_ext WARNING: group "default_pg": '


def _launch(tmp_path, world: int, store: str, timeout: float = 90, wait_for=None, **env: str):
    results = launch_script(JOB, world, store=store, timeout=timeout, wait_for=wait_for,
                            env={"OUT": str(tmp_path), **DEFAULTS, **env})
    text = "\n".join(r.describe() for r in results)
    records = {}
    for r in results:
        path = tmp_path / f"rank{r.rank}.json"
        if path.exists():
            records[r.rank] = json.loads(path.read_text())
    return results, records, text


def _sums(world: int) -> list:
    return [float(sum(r + i for r in range(world))) for i in range(20)] + [world - 1]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("store,differs,setting,mine,theirs", [
    # rank 0 strict, the others verify: before, every rank hung in the first all_reduce
    ("rank0", 0, "TORCH_EXT_CHECK", "strict", "verify"),
    ("parent", 0, "TORCH_EXT_CHECK", "strict", "verify"),
    # one rank off: it created no helper group, which the others waited for
    ("rank0", 1, "TORCH_EXT_CHECK", "off", "verify"),
    ("parent", 2, "TORCH_EXT_CHECK", "strict", "verify"),
    ("rank0", 1, "TORCH_EXT_WARN_AFTER", "5", "10"),
    ("parent", 1, "TORCH_EXT_INNER", "cpu:nccl_sim", "cpu:gloo,cuda:nccl"),
])
def test_a_job_wide_setting_on_one_rank_runs_rank_zeros_value_with_one_line(tmp_path, store, differs, setting,
                                                                              mine, theirs):
    option = setting.removeprefix("TORCH_EXT_").lower()
    results, records, text = _launch(tmp_path, 3, store, RANK_ENV=json.dumps({str(differs): {setting: mine}}),
                                     TORCH_EXT_NCCL_SIM_WAIT="data")
    group = mine if differs == 0 else theirs  # rank 0's value is the group's
    for r in results:
        assert r.returncode == 0, text
        rec = records[r.rank]
        assert rec["sums"] == _sums(3), text
        if option == "check":
            assert f"check={group})" in rec["describe"], text
        notes = [line for line in r.output.splitlines() if NOTE in line]
        if r.rank != 0 and (r.rank == differs or differs == 0):
            # The rank whose own value was overruled: one line, its value and where it came from, rank 0's.
            own = mine if r.rank == differs else theirs
            assert len(notes) == 1, text
            assert f"{option}={own}" in notes[0] and f"rank 0 has {option}={group}" in notes[0], notes[0]
            assert ("from " + setting if own == mine else "the default") in notes[0], notes[0]
        else:
            assert notes == [], text


@pytest.mark.timeout(150)
@pytest.mark.parametrize("store", STORES)
def test_every_other_job_wide_setting_on_one_rank_is_rank_zeros_with_a_line_each(tmp_path, store):
    theirs = {"TORCH_EXT_ABORT_AFTER": "600", "TORCH_EXT_END_DEADLOCKS": "0", "TORCH_EXT_STREAM_GATE": "off",
              "TORCH_EXT_EPOCH_CHECK": "0", "TORCH_EXT_INTERVAL": "0.5", "TORCH_EXT_STORE_BUDGET": "1000",
              "TORCH_EXT_STRAGGLER": "off"}
    results, records, text = _launch(tmp_path, 2, store, RANK_ENV=json.dumps({"1": theirs}))
    for r in results:
        assert r.returncode == 0 and records[r.rank]["sums"] == _sums(2), text
    notes = [line for line in results[1].output.splitlines() if NOTE in line]
    assert NOTE not in results[0].output, text
    assert len(notes) == len(theirs), text
    for var in theirs:
        option = var.removeprefix("TORCH_EXT_").lower()
        assert sum(f" {option}=" in n and f"from {var}" in n for n in notes) == 1, (option, notes)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("store", STORES)
def test_per_rank_settings_may_differ_and_nothing_is_said(tmp_path, store):
    per_rank = {"TORCH_EXT_DUMP_DIR": str(tmp_path / "dumps"), "TORCH_EXT_LEDGER_SIZE": "64",
                "TORCH_EXT_STORE_TIMEOUT": "5", "TORCH_EXT_LIVE_SIGNAL": "off", "TORCH_EXT_JOIN_TIMEOUT": "60"}
    results, records, text = _launch(tmp_path, 2, store, RANK_ENV=json.dumps({"1": per_rank}))
    for r in results:
        assert r.returncode == 0 and records[r.rank]["sums"] == _sums(2), text
        assert NOTE not in r.output, text


@pytest.mark.timeout(150)
@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("gloo_rank", [0, 1])
def test_a_plain_gloo_rank_fails_every_guard_rank_typed_within_seconds(tmp_path, store, gloo_rank):
    """One launcher script edited, the other not: the guard ranks end with GroupJoinError naming the gloo rank.

    The gloo rank itself is outside the guard: it waited in gloo's own rendezvous to gloo's
    timeout (30 minutes) wherever the store outlived the guard ranks. The refusing guard ranks
    now complete that rendezvous and close it: the gloo rank ends by itself at its first
    collective, with gloo's error, seconds later (issue 68).
    """
    guard_ranks = [r for r in range(3) if r != gloo_rank]
    results, records, text = _launch(tmp_path, 3, store, timeout=60, **{f"BACKEND_{gloo_rank}": "gloo"})
    for r in guard_ranks:
        assert results[r].returncode == 3, text  # each ended by itself, with the error
        rec = records[r]
        assert rec["error"] == "GroupJoinError", text
        assert rec["after_s"] < 15, text  # found at once, not at join_timeout (300 s)
        assert f"rank {gloo_rank}: created a plain gloo group here" in rec["message"], rec["message"]
        assert "joined: ranks " + ",".join(map(str, guard_ranks)) in rec["message"], rec["message"]
    # The gloo rank: ended by itself (not by the launcher's timeout), with an error, no sums read.
    plain = results[gloo_rank]
    assert plain.returncode == 3, text
    assert "sums" not in records[gloo_rank] and records[gloo_rank]["after_s"] < 30, text


@pytest.mark.timeout(150)
@pytest.mark.parametrize("store", STORES)
def test_a_rank_that_never_reaches_init_fails_the_others_naming_it(tmp_path, store):
    """join_timeout is 5 min by default; 3 s here.

    Outside torchrun (store="rank0") rank 0's process waits in torch's own store
    set-up until every rank has connected, before any guard exists: there rank 1
    joins alone and names rank 0 and the absent rank 2.
    """
    hold = tmp_path / "release"
    joined = [0, 1] if store == "parent" else [1]
    absent = [2] if store == "parent" else [0, 2]
    results, records, text = _launch(tmp_path, 3, store, timeout=60, wait_for=joined, TORCH_EXT_JOIN_TIMEOUT="3",
                                     HOLD_2=str(hold))
    hold.touch()
    for r in joined:
        assert results[r].returncode == 3, text
        rec = records[r]
        assert rec["error"] == "GroupJoinError", text
        assert rec["after_s"] < 20, text
        names = "rank 2" if absent == [2] else "ranks 0,2"
        assert f"{names} did not join it within join_timeout (3 s)" in rec["message"], rec["message"]
        for a in absent:
            assert f"rank {a}: never reached this group's creation" in rec["message"], rec["message"]
        # Three seconds of waiting print nothing of torch's (a store.wait that timed out every
        # half second made the TCPStore client log two c10d warnings each time).
        assert "[c10d]" not in results[r].output, results[r].output
    # The lowest joined rank decides at its own join_timeout; a rank that started
    # later hears that verdict sooner after its own start (CI's busy cores start
    # processes a second or more apart), so only the decider's wait is bounded below.
    assert records[joined[0]]["after_s"] > 2.5, text


PAIRS = ["tests/python/jobs/pairs_job.py"]


def _pairs(tmp_path, store: str, mode: str):
    results = launch_script(PAIRS, 4, store=store, timeout=60, env={"OUT": str(tmp_path), "MODE": mode, **DEFAULTS})
    text = "\n".join(r.describe() for r in results)
    records = {r.rank: json.loads((tmp_path / f"rank{r.rank}.json").read_text())
               for r in results if (tmp_path / f"rank{r.rank}.json").exists()}
    return results, records, text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("mode", ["own", "staggered"])
def test_pairs_creating_a_group_from_their_own_lists_all_fail_naming_both_lists(tmp_path, store, mode):
    """Each pair calls new_group with its own ranks: torch names both groups "1", one store prefix.

    Plain gloo cross-wires them: rank 0 sums with rank 3 and exits 0, the others fail in
    gloo's transport (docs/conformance.md). Before, the guard hung some ranks in its own
    group creation. Now the second process to claim a group rank refuses the group: ranks
    still joining read the verdict, ranks that concluded it (staggered: ranks 0 and 1 are
    training in it) read the refusal in the group's alerts, all within seconds.
    """
    results, records, text = _pairs(tmp_path, store, mode)
    for r in results:
        rec = records[r.rank]
        if "error" in rec:
            assert r.returncode == 3, text  # ended by itself, with the error: none exits 0, none hangs
            assert rec["error"] == "GroupJoinError", text
            assert rec["after_s"] < 10, text
            message = rec["message"]
        else:
            # A pair that concluded first and finished its five all_reduces before its watchdog's
            # next exchange: the refusal is read when it leaves, and its exit says so, status 1.
            assert mode == "own" and r.returncode == 1, text
            message = r.output.split("torch_ext: GroupJoinError at exit: ", 1)[1]
        assert "asked for different member lists" in message, message
        assert "new_group([0, 1]) on global rank" in message, message
        assert "new_group([2, 3]) on global rank" in message, message
    assert max(r.ended_at for r in results) - min(r.ended_at for r in results) < 10, text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store", STORES)
def test_pairs_created_as_torch_asks_work_each_in_its_own_pair(tmp_path, store):
    results, records, text = _pairs(tmp_path, store, "right")
    for r in results:
        assert r.returncode == 0, text
        pair = [0, 1] if r.rank < 2 else [2, 3]
        assert records[r.rank]["sums"] == [float(sum(p + i for p in pair)) for i in range(5)], text
