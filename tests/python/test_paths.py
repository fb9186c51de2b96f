"""The promises hold on the paths training takes (issue 36).

A path x fault x inner matrix: the same small training loop run through direct
calls, DDP (gradient all_reduces in the reducer, inside ``loss.backward()``),
FSDP2, Lightning's ``ddp_guard`` and Accelerate, on gloo and on nccl_sim, with
rank 1 at step 3 issuing a different collective (an extra barrier), staying
away, dying (SIGKILL), or (nccl_sim) its stream stalling while every host is
inside the collective. Every surviving rank must end by itself with the
guard's typed error (``except torch_ext.GuardError`` catches it, whatever torch
code it crossed), naming rank 1, and (mismatch, absence) the user's own
file:line; ``torch_ext.failure()`` must say the group failed. Each cell's dumps
then go through ``--repro`` (issue 58): the replay, on CPU, must end in the
same verdict (kind, culprit, differing collectives, seq) at the same lines.

The mismatch and the dead rank run at the default settings (nothing set); the
absence and the stall need ``abort_after`` shorter than the test (the default
is 30 min).
The matrix's ranks are forked with torch preloaded and find the store in the
test process (as under torchrun); real programs launched as plain env:// does
(rank 0's process hosts the TCPStore) and as torchrun does are covered for DDP
below, with the user's own exit status.
"""
from __future__ import annotations

import json
import os
import re

import pytest

from harness import launch_script, needs, report, run_ranks
from jobs import paths_job
from torch_ext.diagnose import analyze_dir
from torch_ext.diagnose.repro import build
from torch_ext.testing import replay

PATHS = ["direct", "hooks", "ddp", "fsdp2", "lightning", "accelerate"]
FAULTS = {"mismatch": "CollectiveMismatchError", "absent": "CollectiveTimeoutError",
          "dead": "CollectiveFailureError", "stall": "CollectiveTimeoutError"}
# stall (nccl_sim only): rank 1's stream stops at the step's first collective
# (its position on the stream is its seq), while every host goes on into it.
STALL_AT = {"direct": 13, "hooks": 13, "ddp": 9, "fsdp2": 19, "lightning": 24, "accelerate": 9}
# nccl_sim with the host waiting for the data: on CPU the host is the compute
# stream, so a result is read only once the simulated stream produced it
# (docs/testing.md); what real NCCL does for a program that syncs.
INNERS = {"gloo": {}, "nccl_sim": {"TORCH_EXT_INNER": "cpu:nccl_sim", "TORCH_EXT_NCCL_SIM_WAIT": "data"}}
DEFAULTS = {"TORCH_EXT_WARN_AFTER": "", "TORCH_EXT_ABORT_AFTER": ""}  # "": the guard's defaults
SHORT = {"TORCH_EXT_WARN_AFTER": "1", "TORCH_EXT_ABORT_AFTER": "2"}
USER_LINE = os.path.basename(paths_job.__file__) + ":"


def _env(inner: str, fault: str, path: str) -> dict[str, str]:
    env = {**INNERS[inner], **(SHORT if fault in ("absent", "stall") else DEFAULTS)}
    if fault == "stall":
        env["TORCH_EXT_NCCL_SIM_STALL"] = f"1:{STALL_AT[path]}"
    return env


def _check_survivors(results, fault: str, expected: str, culprit: int = 1) -> None:
    for r in results:
        if fault == "dead" and r.rank == culprit:
            assert r.exitcode == -9, report(results)
            continue
        assert not r.timed_out and r.exitcode == 0 and r.reported, report(results)
        out = r.value
        assert out["ended"] == "raised", (r.rank, out, report(results))
        assert out["guard"], f"rank {r.rank} got {out['type']}, not a torch_ext.GuardError:\n{out['traceback']}"
        assert out["type"] == f"torch_ext.errors.{expected}", (r.rank, out["type"], out["message"])
        assert f"rank {culprit}" in out["message"], (r.rank, out["message"])
        if fault == "stall":  # every rank is in the collective: the report says whose stream is not
            assert f"rank {culprit}: issued #" in out["message"], (r.rank, out["message"])
            assert "stream has not begun it" in out["message"], (r.rank, out["message"])
        if fault != "dead":
            assert USER_LINE in out["message"], (r.rank, out["message"])
        assert out["failure"], (r.rank, "torch_ext.failure() is None after the error")


# A stalled stream is a stream backend's fault (nccl_sim's switch): not on gloo.
CELLS = [(p, f, i) for p in PATHS for f in FAULTS for i in INNERS if not (f == "stall" and i == "gloo")]


@pytest.mark.parametrize("path,fault,inner", CELLS, ids=["-".join(c) for c in CELLS])
def test_every_path_raises_the_typed_error_naming_the_rank_and_replays_from_its_dumps(tmp_path, path, fault, inner):
    if path in ("lightning", "accelerate"):
        needs(path)
    # The store in this process, as in torchrun's agent: run_ranks' ranks end
    # with os._exit, so a rank 0 hosting it would not linger for its peers
    # the way a program's exit does (the tests below launch real programs).
    dumps = tmp_path / "dumps"
    results = run_ranks(paths_job.run_rank, 2, path, fault, backend=None, store="parent", timeout=90,
                        env={**_env(inner, fault, path), "TORCH_EXT_DUMP_DIR": str(dumps)})
    _check_survivors(results, fault, FAULTS[fault])
    job, ranks = build(analyze_dir(dumps), str(dumps))
    assert job["backend"] == inner, job
    outcome = replay.run(job, ranks, keep=tmp_path / "replay")
    assert outcome.same, outcome.describe()
    # Each rank that left a dump raises in the replay what it raised in the job.
    raised = {int(r): kind for r, kind in re.findall(r"\[rank(\d+)\] raised (\w+):", outcome.output)}
    dumped = {int(m) for m in re.findall(r"rank(\d+)\.json", " ".join(os.listdir(dumps)))}
    job_raised = {r.rank: r.value["type"].rsplit(".", 1)[-1] for r in results if r.rank in dumped and r.value}
    assert {r: raised.get(r) for r in job_raised} == job_raised, outcome.describe()
    assert USER_LINE in "".join(v["text"] for v in outcome.verdicts) or fault == "dead", outcome.describe()


def _launch(tmp_path, store: str, **env: str):
    results = launch_script(["tests/python/jobs/paths_job.py"], 2, store=store, timeout=90,
                            env={"OUT": str(tmp_path), **DEFAULTS, **env})
    records = {}
    for r in results:
        f = tmp_path / f"rank{r.rank}.json"
        records[r.rank] = json.loads(f.read_text()) if f.exists() else None
    return results, records


def _outputs(results) -> str:
    return "\n".join(f"--- rank {r.rank} (exit {r.returncode})\n{r.output[-4000:]}" for r in results)


@pytest.mark.parametrize("store", ["rank0", "parent"])
def test_ddp_keeps_the_users_exit_status_after_a_mismatch_in_backward(tmp_path, store):
    # Both ranks catch the typed error and exit 3: the guard's exit path must
    # not turn a verdict the program saw into status 1 (it did: the error
    # reached user code untyped, so the guard thought nobody had seen it).
    results, records = _launch(tmp_path, store, TRAIN_PATH="ddp", FAULT="mismatch", CATCH_EXIT="3")
    for r in results:
        assert r.returncode == 3, _outputs(results)
        assert records[r.rank]["type"] == "torch_ext.errors.CollectiveMismatchError", _outputs(results)
        # The gradient all_reduce's line names DDP's bucket and its parameters.
        assert re.search(r"all_reduce\(float32\[\d+\], SUM\) +at paths_job.py:\d+ in \w+\n"
                         r" +DDP gradient bucket 1 of 1: ",
                         records[r.rank]["message"]), records[r.rank]["message"]
        assert "torch_ext: CollectiveMismatchError at exit" not in r.output, _outputs(results)


@pytest.mark.parametrize("store", ["rank0", "parent"])
def test_ddp_survivor_of_a_killed_peer_gets_collective_failure_naming_it(tmp_path, store):
    # gloo's own words are "Connection closed by peer", naming nobody; the
    # future DDP's reducer waits on must carry the guard's report instead.
    results, records = _launch(tmp_path, store, TRAIN_PATH="ddp", FAULT="dead")
    assert results[1].returncode == -9, _outputs(results)
    rec = records[0]
    assert results[0].returncode == 1 and rec is not None, _outputs(results)
    assert rec["type"] == "torch_ext.errors.CollectiveFailureError", _outputs(results)
    assert "rank 1" in rec["message"] and rec["failure"], rec["message"]


@pytest.mark.parametrize("store", ["rank0", "parent"])
def test_a_size_mismatch_that_gloo_would_terminate_a_rank_for_ends_typed_on_every_rank(tmp_path, store):
    # gloo std::terminates, from its transport thread, the rank that receives
    # more bytes than it expects, before any check of the default mode could
    # run. The guard stops that thread instead of the process
    # (watchdog/TerminateHandler.cpp): every rank, the store's host too, gets
    # CollectiveMismatchError describing every rank's call and ends by itself.
    results = launch_script(["tests/python/jobs/size_mismatch_job.py"], 3, store=store, timeout=90,
                            env={"OUT": str(tmp_path), **DEFAULTS})
    stopped = [r for r in results if "gloo's transport thread in this process" in r.output]
    assert stopped, _outputs(results)
    for r in stopped:
        assert "(a collective mismatch: [enforce fail at" in r.output, _outputs(results)
        assert "terminate called" not in r.output, _outputs(results)
    for r in results:
        assert r.returncode == 1, _outputs(results)  # the job's own exit status, after the error it caught
        rec = json.loads((tmp_path / f"rank{r.rank}.json").read_text())
        assert rec["type"] == "CollectiveMismatchError", _outputs(results)
        assert "did not answer" not in rec["message"], rec["message"]
        for n in (4, 6):
            assert f"all_gather_into_tensor(float32[{n}])  at size_mismatch_job.py:26" in rec["message"], rec["message"]


def _terminate_without_an_exception(rank: int, world: int) -> dict:
    import ctypes

    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1))
    if rank == 1:  # as a std::thread destroyed while joinable does: std::terminate with nothing in flight
        ctypes.CDLL("libstdc++.so.6")._ZSt9terminatev()
    return {}


def test_a_terminate_with_no_exception_says_on_which_thread_and_where():
    # Nothing names the cause of such an end (the C++ runtime says only "terminate called without an
    # active exception"), so the guard's words carry the thread and its native stack.
    results = run_ranks(_terminate_without_an_exception, 2, store="parent", timeout=60, check=False, env=DEFAULTS)
    out = results[1].log
    assert results[1].exitcode == -6, out  # SIGABRT: the handler hands over to the runtime's, which aborts
    assert "is being terminated by an exception nobody caught" in out, out
    assert 'std::terminate was called with no exception in flight (a std::thread destroyed while still joinable, ' \
           'or a direct call), on thread "' in out, out
    stack = out.split("names a frame):", 1)[1].split(" Pending here:")[0].splitlines()
    assert "/_C." in stack[1] and "libstdc++" in stack[2], out  # the handler, then std::terminate
    assert any("_ctypes" in line for line in stack), out  # the caller: the job's ctypes call


def test_with_the_check_off_the_rank_gloo_terminates_says_why(tmp_path):
    # No check could report it, so the process ends as gloo has it, after
    # torch_ext's words on its stderr: a collective mismatch, and which one.
    results = launch_script(["tests/python/jobs/size_mismatch_job.py"], 2, store="parent", timeout=90,
                            env={"OUT": str(tmp_path), **DEFAULTS, "TORCH_EXT_CHECK": "off"})
    killed = [r for r in results if r.returncode == -6]  # SIGABRT: std::terminate
    assert [r.rank for r in killed] == [0], _outputs(results)  # rank 0 receives rank 1's 6 elements into room for 4
    ours = killed[0].output.find("torch_ext: this process")
    assert ours >= 0 and "a collective mismatch" in killed[0].output, _outputs(results)
    assert "collective #4 all_gather_into_tensor(float32[4])" in killed[0].output[ours:], _outputs(results)
    theirs = killed[0].output.find("terminate called")  # the C++ runtime's words, then gloo's
    assert theirs < 0 or ours < theirs, _outputs(results)
    assert results[1].returncode == 1, _outputs(results)  # the survivor ends by itself, typed
    assert json.loads((tmp_path / "rank1.json").read_text())["type"] == "CollectiveFailureError", _outputs(results)


@pytest.mark.parametrize("inner", ["gloo", "nccl_sim"])
def test_a_size_mismatch_on_the_store_host_gives_every_rank_the_verdict(tmp_path, inner):
    # Two ranks, plain env://: rank 0 hosts the store and is the rank gloo
    # would terminate (it receives rank 1's 6 elements into room for 4).
    # Ending it took the store with it, and rank 1 raised StoreLostError:
    # nobody learnt it was a mismatch. Now no rank ends early (on nccl_sim
    # nothing is terminated either: its stream hangs, as NCCL's would).
    env = {"OUT": str(tmp_path), **DEFAULTS, **(INNERS[inner] if inner == "nccl_sim" else {})}
    results = launch_script(["tests/python/jobs/size_mismatch_job.py"], 2, store="rank0", timeout=90, env=env)
    for r in results:
        assert r.returncode == 1, _outputs(results)  # raised, and ended by itself
        rec = json.loads((tmp_path / f"rank{r.rank}.json").read_text())
        assert rec["type"] == "CollectiveMismatchError", _outputs(results)
        assert "did not answer" not in rec["message"], rec["message"]
        for n in (4, 6):
            assert f"all_gather_into_tensor(float32[{n}])  at size_mismatch_job.py:26" in rec["message"], rec["message"]


def test_ddps_unfinished_reduction_is_followed_by_the_bucket_held_back_and_the_peer_names_it():
    # find_unused_parameters=False and a parameter without a gradient on rank 1:
    # DDP's own RuntimeError on rank 1 says which parameter indices, not which
    # collectives are missing, and rank 0 waits in a gradient all_reduce. Plain
    # env:// (rank 0 hosts the store); the launcher-hosted store is
    # test_examples.py's run of examples/bugs/ddp_unused_parameter.py.
    results = launch_script(["tests/python/jobs/ddp_unused_job.py"], 2, store="rank0", timeout=90, env=DEFAULTS)
    r0, r1 = results
    assert r1.returncode == 1, _outputs(results)
    ddp_error = r1.output.find("Expected to have finished reduction in the prior iteration")
    note = r1.output.find("torch_ext: after DDP's error above, rank 1")
    assert 0 <= ddp_error < note, _outputs(results)
    assert "issued none of the 2 gradient buckets of its last backward" in r1.output[note:], _outputs(results)
    assert "DDP gradient bucket 1 of 2: b.bias, b.weight" in r1.output[note:], _outputs(results)
    assert re.search(r"wait for this rank from collective #\d+ on", r1.output[note:]), _outputs(results)
    # Rank 0 ends by itself with the typed error, naming rank 1 and what it raised; its
    # gradient all_reduce lines name their bucket.
    assert r0.returncode == 1 and "torch_ext.errors.CollectiveFailureError" in r0.output, _outputs(results)
    assert "rank 1: exited" in r0.output and "raising RuntimeError: Expected to have finished" in r0.output
    assert re.search(r"#\d+ all_reduce\(float32\[36\], SUM\) at ddp_unused_job.py:36 in <module>\n(\[rank0\]:)? +"
                     r"DDP gradient bucket 1 of 2: b.bias, b.weight", r0.output), _outputs(results)


def test_ddp_survivor_of_a_killed_store_host_gets_store_lost_naming_it(tmp_path):
    # Plain env://: rank 0's process hosts the TCPStore, and SIGKILL takes it
    # away during DDP's step; the survivor, inside loss.backward(), must get
    # the typed StoreLostError naming the store and its host, not gloo's words.
    results, records = _launch(tmp_path, "rank0", TRAIN_PATH="ddp", FAULT="dead", FAULT_RANK="0")
    assert results[0].returncode == -9, _outputs(results)
    rec = records[1]
    assert results[1].returncode == 1 and rec is not None, _outputs(results)
    assert rec["type"] == "torch_ext.errors.StoreLostError", _outputs(results)
    assert "hosted by rank 0's process" in rec["message"], rec["message"]
