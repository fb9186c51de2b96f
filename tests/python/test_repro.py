"""``torch-ext-diagnose DUMP_DIR --repro OUT.py`` (issue 58): a job's dumps become a replay that ends in its verdict.

Every example in ``examples/bugs/`` that ends in a verdict is replayed from its
dumps in ``test_examples.py`` (``_replays``). Here: the comparison itself (it
must be able to fail), the pytest file ``--repro-test`` writes, a replay that is
not the job's, and what ``--repro`` says about dumps it cannot replay.
"""
from __future__ import annotations

import json
import os
import re

import pytest
import torch
import torch.distributed as dist

import torch_ext
from harness import run_ranks, run_script
from torch_ext.diagnose import analyze_dir
from torch_ext.diagnose.repro import ReproError, build, compare, summarize
from torch_ext.testing import replay

MISMATCH = {"kind": "mismatch", "group": "default_pg", "group_name": "0", "seq": 7, "text": "",
            "ranks": [{"rank": 0, "issued": True, "op": "reduce(float32[1], SUM, dst=0)", "where": "t.py:3 in f"},
                      {"rank": 1, "issued": True, "op": "all_reduce(float32[4], SUM)", "where": "t.py:9 in g"},
                      {"rank": 2, "issued": True, "op": "all_reduce(float32[4], SUM)", "where": "t.py:9 in g"}]}
GONE = {"kind": "failure", "group": "default_pg", "group_name": "0", "seq": 12, "text": "", "op": "all_reduce(...)",
        "not_arrived": [], "gone": [1], "waiting": [0], "wait_shape": "none"}


def _with(verdict: dict, **changes) -> dict:
    return {**json.loads(json.dumps(verdict)), **changes}


def test_the_comparison_names_each_difference_and_accounts_for_the_skipped_collectives():
    want = [summarize(MISMATCH)]
    assert compare(want, [_with(MISMATCH, seq=3)], {"0": 4}) == []
    assert compare(want, [_with(MISMATCH, seq=3)], {}) == ['group "default_pg": seq: the job 7, the replay 3']
    other_site = _with(MISMATCH)
    other_site["ranks"][0]["where"] = "replay.py:1 in _issue"
    assert any("calls" in d and "replay.py:1" in d for d in compare(want, [other_site]))
    no_culprit = _with(MISMATCH)
    no_culprit["ranks"][0]["op"] = "all_reduce(float32[4], SUM)"
    assert compare(want, [no_culprit]) != []
    assert compare(want, []) == ['group "default_pg": the job ended in a mismatch verdict, the replay in none']
    extra = _with(GONE, group="dp", group_name="1")
    assert compare(want, [MISMATCH, extra]) == [
        'group "dp": the replay ended in a failure verdict the job did not have']


def test_a_gone_rank_seen_as_a_hang_or_a_failure_is_the_same_verdict_and_nothing_else_is():
    want = [summarize(GONE)]
    assert compare(want, [_with(GONE, kind="hang")]) == []
    assert compare(want, [_with(GONE, kind="hang", gone=[], not_arrived=[1])]) != []
    absent = _with(GONE, kind="hang", gone=[], not_arrived=[1])
    assert compare([summarize(absent)], [_with(absent, kind="failure")]) != []
    # DDP's buckets pending together when the rank died: the verdict may name either, in the job as in a replay.
    pending = {**summarize(GONE), "pending": [[11, "all_reduce(float32[68], SUM)"], [12, "all_reduce(...)"]]}
    assert compare([pending], [_with(GONE, seq=3, op="all_reduce(float32[68], SUM)")], {"0": 8}) == []
    assert compare([pending], [_with(GONE, seq=5, op="all_reduce(float32[68], SUM)")], {"0": 8}) != []


def test_a_lost_store_must_be_lost_the_same_way_with_the_same_host():
    lost = _with(GONE, gone=[0], store_lost_host=0, store_health="lost")
    want = [summarize(lost)]
    assert compare(want, [lost]) == []
    # Rank 0 killed, but the store was the launcher's: the same culprit, not the job's failure.
    assert compare(want, [_with(GONE, gone=[0])]) == [
        'group "default_pg": store_lost_host: the job 0, the replay None',
        'group "default_pg": store_health: the job \'lost\', the replay None']
    assert compare(want, [_with(lost, store_health="not answering")]) == [
        'group "default_pg": store_health: the job \'lost\', the replay \'not answering\'']


def _rank0_reduce(rank: int, world: int) -> None:
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 0:
        dist.reduce(torch.ones(1), dst=0)
    dist.all_reduce(t)


@pytest.fixture(scope="module")
def mismatch_dumps(tmp_path_factory):
    dumps = tmp_path_factory.mktemp("mismatch") / "dumps"
    res = run_ranks(_rank0_reduce, 3, timeout=90, check=False, env={"TORCH_EXT_DUMP_DIR": str(dumps)})
    assert all(r.error_type == "CollectiveMismatchError" for r in res), res
    return dumps


@pytest.mark.timeout(300)
def test_repro_test_writes_a_pytest_case_that_passes_and_a_changed_replay_fails(tmp_path, mismatch_dumps):
    proc = run_script(["-m", "torch_ext.diagnose", str(mismatch_dumps), "--repro", "repro.py",
                       "--repro-test", "repro_test.py"], tmp_path, 60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"wrote repro\.py \(\d+ lines: 6 operation\(s\) of 3 ranks\); run it: python repro\.py",
                     proc.stdout), proc.stdout
    assert "run it: python -m pytest repro_test.py" in proc.stdout, proc.stdout
    text = (tmp_path / "repro.py").read_text()
    assert "test_repro.py" in text and "in _rank0_reduce" in text, text  # the job's call sites, as comments
    case = run_script(["-m", "pytest", "-q", "-p", "no:cacheprovider", "repro_test.py"], tmp_path, 240)
    assert case.returncode == 0 and "1 passed" in case.stdout, case.stdout[-6000:] + case.stderr[-3000:]
    # Rank 0 no longer calls the reduce: the others wait for it in #2; the replay says that is not the job's verdict.
    changed = re.sub(r"\{'group': '0', 'op': 'reduce'[^\n]*\n", "", text, count=1)
    assert changed != text
    (tmp_path / "changed.py").write_text(changed)
    run = run_script(["changed.py"], tmp_path, 240)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-6000:]
    assert "torch_ext replay: NOT the job's verdict" in out, out[-6000:]
    assert "group \"default_pg\": kind: the job 'mismatch', the replay 'hang'" in out, out[-6000:]
    assert "group \"default_pg\": culprits: the job {'0': 'differs: reduce(float32[1], SUM, dst=0)'}, the replay " \
           "{'0': 'has not arrived'}" in out, out[-6000:]


def _rank0_reduce_synced(rank: int, world: int) -> None:
    from torch_ext.testing import nccl_sim

    _rank0_reduce(rank, world)
    nccl_sim.synchronize()  # where a GPU program would read a result


@pytest.mark.timeout(300)
def test_an_nccl_jobs_dumps_replay_on_nccl_sim_on_a_machine_without_gpus(tmp_path):
    # An NCCL job's dumps, made on nccl_sim: the same ledger, with the device and the inner backend
    # an NCCL job's dumps carry (a GPU run, where one is lent, writes them for real: scripts/gpu.sh).
    dumps = tmp_path / "dumps"
    res = run_ranks(_rank0_reduce_synced, 3, timeout=90, check=False,
                    env={"TORCH_EXT_DUMP_DIR": str(dumps), "TORCH_EXT_INNER": "cpu:nccl_sim"})
    assert all(r.error_type == "CollectiveMismatchError" for r in res), res
    for path in dumps.glob("rank*.json"):
        data = json.loads(path.read_text())
        assert data["software"].startswith(f"torch {torch.__version__}, torch_ext {torch_ext.__version__}, Python ")
        data["config"] = data["config"].replace("inner=cpu:nccl_sim", "inner=cpu:gloo,cuda:nccl")
        for g in data["groups"]:
            for e in g["entries"]:
                assert e["device"] == "cpu"
                e["device"] = "cuda"
        path.write_text(json.dumps(data))
    job, ranks = build(analyze_dir(dumps), str(dumps))
    assert job["backend"] == "nccl_sim", job
    outcome = replay.run(job, ranks, keep=tmp_path / "replay")
    assert outcome.same, outcome.describe()


def _dump_only(rank: int, world: int, dump_dir: str) -> None:
    dist.all_reduce(torch.ones(2))
    torch_ext.dump(dump_dir)


@pytest.mark.timeout(120)
def test_dumps_without_a_verdict_are_refused_with_why(tmp_path):
    dumps = tmp_path / "dumps"
    run_ranks(_dump_only, 2, str(dumps), timeout=60)
    with pytest.raises(ReproError, match="hold no verdict"):
        build(analyze_dir(dumps), str(dumps))
    proc = run_script(["-m", "torch_ext.diagnose", str(dumps), "--repro", "repro.py"], tmp_path, 60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "error: --repro: the dumps hold no verdict" in proc.stderr, proc.stderr
    assert not os.path.exists(tmp_path / "repro.py")
