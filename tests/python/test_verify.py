"""check="verify", the default: a mismatch never reaches the user as data (issue 23).

In verify mode a collective's result is released (wait(), the synchronous call's
implicit wait, the future, then() callbacks, is_completed()) only once every rank
is known to have issued the same collectives up to it; on a difference every rank
raises torch_ext.CollectiveMismatchError naming each side's call site, and
destroy_process_group() / interpreter exit wait for the verdict on what was issued.

What user code could read is what is asserted:

- user scripts (tests/python/jobs/verify_user.py), 3 real processes per run,
  launched as torchrun does (the store in the launcher: harness.launch_script
  store="parent", which sets TORCHELASTIC_USE_AGENT_STORE like torchrun's agent)
  and as plain env:// does (rank 0's process hosts the TCPStore), with NO
  TORCH_EXT_CHECK set: no rank saves the result it read, every rank ends by
  itself with a non-zero status, and its output holds CollectiveMismatchError
  naming both call sites (file:line). All cases run under rank 0's store; the
  core cases under the launcher's store too (and the issue's case once under a
  real torchrun), to keep the file's runtime modest;
- a DDP loop whose rank 1 differs (tests/python/jobs/verify_ddp.py): every rank
  fails in the first step's backward and no rank applies an optimizer step;
- matching programs: results bit-equal to plain gloo, and every way of reading an
  async result sees the right value;
- irecv posted before isend (plain and batch_isend_irecv), 2 and 3 ranks, in
  every check mode: no false mismatch.
"""
from __future__ import annotations

import json
import os
import random
import re

import pytest
import torch
import torch.distributed as dist

import torch_ext
from harness import assert_all_ok, launch_script, report, run_ranks, run_script

JOBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs")
USER = os.path.join(JOBS, "verify_user.py")
DDP_JOB = os.path.join(JOBS, "verify_ddp.py")

# How the ranks are launched: harness.launch_script's `store`.
LAUNCH = {"torchrun": "parent", "env_rank0_store": "rank0"}
TIMEOUT = 90  # s for a whole launch; every case ends in a few seconds


@pytest.fixture(autouse=True)
def _default_settings(monkeypatch):
    # The default mode is under test: nothing in the caller's environment may choose another.
    # (The store timeout stays conftest.py's: these tests are not about the store.)
    monkeypatch.delenv("TORCH_EXT_CHECK", raising=False)


def _site(marker: str, side: str) -> str:
    """``verify_user.py:N``: the line of USER that carries ``# site:MARKER:SIDE``."""
    with open(USER) as f:
        for n, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# site:{marker}:{side}"):
                return f"verify_user.py:{n}"
    raise AssertionError(f"no '# site:{marker}:{side}' in {USER}")


# case: (call-site marker, what ranks 0 and 2 issued, what rank 1 issued)
CASES = {
    "size": ("size", "all_reduce(float32[8], SUM)", "all_reduce(float32[10], SUM)"),  # the issue's case
    "dtype": ("dtype", "all_reduce(float32[8], SUM)", "all_reduce(int32[8], SUM)"),
    "op": ("op", "all_reduce(float32[8], SUM)", "broadcast(float32[8], src=0)"),
    "all_gather": ("all_gather", "all_gather(float32[2, 3])", "all_gather(float32[3, 2])"),
    "last": ("size", "all_reduce(float32[8], SUM)", "all_reduce(float32[10], SUM)"),
    "unwaited": ("unwaited", "all_reduce(float32[8], SUM)", "all_reduce(float32[10], SUM)"),
    "unwaited_verdict_first": ("unwaited", "all_reduce(float32[8], SUM)", "all_reduce(float32[10], SUM)"),
    "unwaited_destroy": ("unwaited", "all_reduce(float32[8], SUM)", "all_reduce(float32[10], SUM)"),
    "future": ("async", "all_reduce(float32[8], SUM)", "all_reduce(float32[10], SUM)"),
    "then": ("async", "all_reduce(float32[8], SUM)", "all_reduce(float32[10], SUM)"),
    "poll": ("async", "all_reduce(float32[8], SUM)", "all_reduce(float32[10], SUM)"),
}
# Under both launch modes; the others under rank 0's store only.
CORE = ("size", "dtype", "op", "all_gather", "last", "unwaited", "unwaited_verdict_first")
MATRIX = [(case, launch) for case in CASES for launch in LAUNCH if case in CORE or launch == "env_rank0_store"]


def _launch_user(tmp_path, case: str, store: str):
    out = tmp_path / "saved"
    out.mkdir()
    procs = launch_script([USER, case, str(out)], 3, store=store, timeout=TIMEOUT)
    return procs, sorted(os.listdir(out)), "\n".join(p.describe() for p in procs)


def _assert_default_mode(procs, text):
    for p in procs:
        assert f"rank={p.rank}, size=3, inner=cpu:gloo, check=verify)" in p.output, text


@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.parametrize("case,launch", MATRIX)
def test_a_mismatch_never_reaches_user_code_as_data(tmp_path, case, launch):
    # Sizes, dtypes and shapes are chosen so gloo runs the differing op without
    # aborting the process (it std::terminates a process that receives more bytes
    # than it posted: see test_all_gather_whose_byte_counts_differ...): the
    # verdict under test is the guard's. float32[10] vs [8] (the issue's) is such
    # a pair; int32 vs float32 have the same element size; all_gather differs in
    # shape ([3, 2] vs [2, 3]) at equal byte counts, as any all_gather whose
    # element counts differ makes gloo abort a receiver.
    procs, saved, text = _launch_user(tmp_path, case, LAUNCH[launch])
    _assert_default_mode(procs, text)
    assert saved == [], f"a rank read and saved the result of a differing collective: {saved}\n{text}"
    marker, even, odd = CASES[case]
    sites = (_site(marker, "even"), _site(marker, "odd"))
    for p in procs:
        assert p.returncode is not None, f"rank {p.rank} did not end by itself\n{text}"
        assert p.returncode != 0, f"rank {p.rank} exited 0 over a mismatch\n{text}"
        assert "CollectiveMismatchError" in p.output, text
        assert 'collective #2 on group "default_pg" (3 ranks) differs across ranks' in p.output, text
        assert even in p.output and odd in p.output, text
        assert all(f"{site} in step" in p.output for site in sites), (sites, text)
        assert re.search(r"ranks 0,2: +" + re.escape(even), p.output), text
        assert re.search(r"rank 1: +" + re.escape(odd), p.output), text
    if case in ("unwaited", "unwaited_verdict_first"):
        # Nothing waited: the script ran to its end, and only the exit path could fail
        # it, whether the verdict came while the process was exiting or before.
        for p in procs:
            assert f"rank {p.rank} reached the end of its script" in p.output, text
            assert "torch_ext: CollectiveMismatchError at exit: collective #2" in p.output, text
            assert p.returncode == 1, text
    elif case == "unwaited_destroy":
        for p in procs:
            assert f"rank {p.rank} reached the end of its script" in p.output, text
            assert "destroy_process_group" in p.output.split("Traceback", 1)[-1], text
    elif case != "then":
        # Raised from the call that reads the result (then(): from the callback's future).
        for p in procs:
            assert "torch_ext.errors.CollectiveMismatchError: collective #2" in p.output, text


@pytest.mark.timeout(TIMEOUT + 30)
def test_all_gather_whose_byte_counts_differ_ends_typed_on_every_rank(tmp_path):
    # all_gather of float32[3] (rank 1) vs float32[2]: gloo's ring passes rank 1's
    # block to a rank that posted room for a smaller one, and gloo std::terminates
    # that process from its transport thread ("Received data size doesn't match
    # expected size") while the check runs. The guard stops that thread instead of
    # the process (watchdog/TerminateHandler.cpp), so every rank, rank 0 hosting
    # the store too, reads nothing, reports the difference with both call sites
    # and ends by itself, non-zero.
    procs, saved, text = _launch_user(tmp_path, "all_gather_bytes", LAUNCH["env_rank0_store"])
    _assert_default_mode(procs, text)
    assert saved == [], f"a rank read and saved the result of a differing collective: {saved}\n{text}"
    even, odd = _site("all_gather_bytes", "even"), _site("all_gather_bytes", "odd")
    assert "gloo's transport thread in this process" in text, text
    for p in procs:
        assert p.returncode is not None, f"rank {p.rank} did not end by itself\n{text}"
        assert p.returncode > 0, f"rank {p.rank} exited 0 or was killed over a mismatch\n{text}"
        assert "terminate called" not in p.output, text
        assert "CollectiveMismatchError" in p.output and "differs across ranks" in p.output, text
        assert "all_gather(float32[3])" in p.output and f"{odd} in step" in p.output, text
        assert "all_gather(float32[2])" in p.output and f"{even} in step" in p.output, text


@pytest.mark.timeout(150)
def test_the_issues_case_under_a_real_torchrun(tmp_path):
    # torchrun's agent stops the other workers once one fails, so how each worker
    # ended is not asserted here (launch_script's store="parent" runs above do);
    # what a user of torchrun sees is: nothing saved, a failed job, the report.
    out = tmp_path / "saved"
    out.mkdir()
    proc = run_script([USER, "size", str(out)], tmp_path, 120, nproc=3)
    text = f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert os.listdir(out) == [], text
    assert proc.returncode != 0, text
    assert "check=verify)" in text, text
    assert "CollectiveMismatchError" in text, text
    assert f"{_site('size', 'even')} in step" in text and f"{_site('size', 'odd')} in step" in text, text


# --- DDP --------------------------------------------------------------------------

DDP_TEXT = {
    "larger_param": ("all_reduce(float32[8], SUM)", "all_reduce(float32[10], SUM)"),
    "bucket_cap": ("all_reduce(float32[6], SUM)", "all_reduce(float32[2], SUM)"),
}


@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.parametrize("case,launch", [("larger_param", "env_rank0_store"), ("larger_param", "torchrun"),
                                         ("bucket_cap", "env_rank0_store")])
def test_ddp_whose_gradient_buckets_differ_fails_every_rank_before_any_step(tmp_path, case, launch):
    # DDP checks parameter shapes across ranks at construction (its own error, before
    # any step), so the cases are differences construction lets through; see
    # jobs/verify_ddp.py (init_sync=False with a larger layer on rank 1; the same
    # model with another bucketing on rank 1).
    out = tmp_path / "records"
    out.mkdir()
    procs = launch_script([DDP_JOB, case, str(out)], 3, store=LAUNCH[launch], timeout=TIMEOUT)
    text = "\n".join(p.describe() for p in procs)
    _assert_default_mode(procs, text)
    even, odd = DDP_TEXT[case]
    for p in procs:
        assert p.returncode is not None, f"rank {p.rank} did not end by itself\n{text}"
        assert p.returncode != 0, f"rank {p.rank} exited 0 over a mismatch\n{text}"
        path = out / f"ddp{p.rank}.json"
        assert path.exists(), f"rank {p.rank} wrote no record\n{text}"
        rec = json.loads(path.read_text())
        where = f"rank {p.rank}: {rec}\n{text}"
        assert rec["steps_applied"] == 0 and rec["step_failed"] == 0, where
        assert rec["params_unchanged"], where
        assert "differs across ranks" in rec["error"], where
        assert even in rec["error"] and odd in rec["error"], where
        assert "verify_ddp.py:" in rec["error"], where
        assert rec["dist_backend_error"], where
        # Raised inside DDP's backward, the error crosses torch's autograd engine,
        # which re-raises C++ errors as their torch base class: the type arrives as
        # torch.distributed.DistBackendError (the text is the guard's), and the
        # group's failure says it was a mismatch (documented in docs/diagnostics.md).
        assert rec["mismatch"] or rec["failure_kind"] == "mismatch", \
            f"raised {rec['error_type']}, not a mismatch\n{where}"


# --- matching programs -------------------------------------------------------------

def _random_program(rank: int, world: int, seed: int) -> dict:
    """20 random all_reduce/all_gather/broadcast ops, the same program on every rank,
    each rank's own data. Returns every result, the check mode and the guard's failure."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed * 100 + rank)
    results = []
    pending = []
    for _ in range(20):
        kind = rng.choice(["all_reduce", "all_gather", "broadcast"])
        n = rng.choice([1, 7, 64, 1000])
        dtype = rng.choice([torch.float32, torch.float64, torch.int64])
        async_op = rng.random() < 0.3
        t = (torch.randn(n, generator=gen) * 100).to(dtype)
        if kind == "all_reduce":
            op = rng.choice([dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT])
            w = dist.all_reduce(t, op=op, async_op=async_op)
            out = [t]
        elif kind == "all_gather":
            out = [torch.empty(n, dtype=dtype) for _ in range(world)]
            w = dist.all_gather(out, t, async_op=async_op)
        else:
            w = dist.broadcast(t, src=rng.randrange(world), async_op=async_op)
            out = [t]
        results.append(out)
        if w is not None:
            pending.append(w)
        if not async_op or len(pending) > 4:
            for p in pending:
                p.wait()
            pending.clear()
    for p in pending:
        p.wait()
    mode = torch_ext.describe() if dist.get_backend() == "guard" else "plain gloo"
    return {"results": results, "mode": mode,
            "failure": torch_ext.failure() if dist.get_backend() == "guard" else None}


def test_a_matching_program_raises_nothing_and_gives_plain_gloos_results_bit_for_bit():
    guarded = assert_all_ok(run_ranks(_random_program, 3, 23, timeout=90))
    plain = assert_all_ok(run_ranks(_random_program, 3, 23, backend="gloo", timeout=90))
    for rank in range(3):
        assert "check=verify)" in guarded[rank]["mode"], guarded[rank]["mode"]
        assert guarded[rank]["failure"] is None, guarded[rank]["failure"]
        for i, (g, p) in enumerate(zip(guarded[rank]["results"], plain[rank]["results"])):
            assert len(g) == len(p)
            for a, b in zip(g, p):
                assert a.dtype == b.dtype and torch.equal(a, b), f"rank {rank}, op {i}: {a} != {b}"


def _async_reads(rank: int, world: int) -> dict:
    expect = float(sum(range(1, world + 1)))
    seen = {}
    # wait()
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t, async_op=True).wait()
    seen["wait"] = t.tolist()
    # the synchronous call's implicit wait
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    seen["sync"] = t.tolist()
    # work.get_future(): wait() returns the value, value() afterwards too
    t = torch.full((5,), float(rank + 1))
    fut = dist.all_reduce(t, async_op=True).get_future()
    seen["future.wait"] = fut.wait()[0].tolist()
    seen["future.value"] = fut.value()[0].tolist()
    # a then() callback, and what it returns
    t = torch.full((5,), float(rank + 1))
    in_callback = []
    chained = dist.all_reduce(t, async_op=True).get_future().then(
        lambda f: in_callback.append(f.value()[0].clone()) or f.value()[0] * 2)
    seen["then.returned"] = chained.wait().tolist()
    seen["then.callback"] = in_callback[0].tolist()
    # is_completed(): polled until true, then read without wait()
    t = torch.full((5,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    while not work.is_completed():
        pass
    seen["is_completed"] = t.tolist()
    seen["is_success"] = work.is_success()
    work.wait()
    dist.barrier()
    return {"seen": seen, "expect": expect, "mode": torch_ext.describe(), "failure": torch_ext.failure()}


def test_every_way_of_reading_an_async_result_sees_the_right_value():
    for rank, got in enumerate(assert_all_ok(run_ranks(_async_reads, 3, timeout=60))):
        assert "check=verify)" in got["mode"], got["mode"]
        assert got["failure"] is None, got["failure"]
        e = got["expect"]
        seen = got["seen"]
        assert seen.pop("is_success") is True, (rank, got)
        assert seen.pop("then.returned") == [2 * e] * 5, (rank, got)
        for how, value in seen.items():
            assert value == [e] * 5, f"rank {rank}, {how}: {value} (expected {e})"


# --- irecv before isend ------------------------------------------------------------

MODES = {
    "off": {"TORCH_EXT_CHECK": "off"},
    "async": {"TORCH_EXT_CHECK": "async", "TORCH_EXT_INTERVAL": "0.1"},
    "verify": {"TORCH_EXT_CHECK": "verify"},
    "strict": {"TORCH_EXT_CHECK": "strict"},
}


def _recv_first(rank: int, world: int, style: str) -> dict:
    """Every rank posts its receives from both neighbours before its sends to them."""
    prev, nxt = (rank - 1) % world, (rank + 1) % world
    from_prev, from_next = torch.zeros(3), torch.zeros(3)
    to_next, to_prev = torch.full((3,), 100.0 * rank + 1), torch.full((3,), 100.0 * rank + 2)
    try:
        if style == "isend_irecv":
            works = [dist.irecv(from_prev, prev), dist.irecv(from_next, nxt),
                     dist.isend(to_next, nxt), dist.isend(to_prev, prev)]
        else:
            works = dist.batch_isend_irecv([
                dist.P2POp(dist.irecv, from_prev, prev), dist.P2POp(dist.irecv, from_next, nxt),
                dist.P2POp(dist.isend, to_next, nxt), dist.P2POp(dist.isend, to_prev, prev)])
        for w in works:
            w.wait()
        total = torch.ones(1)
        dist.all_reduce(total)
        dist.barrier()
    except torch_ext.GuardError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    # With 2 ranks prev == next: the two messages from the one peer arrive in the
    # order it sent them (to_next first), which is the order the receives were posted.
    return {"error": None, "from_prev": from_prev.tolist(), "from_next": from_next.tolist(),
            "expect_prev": [100.0 * prev + 1] * 3, "expect_next": [100.0 * nxt + 2] * 3,
            "total": total.item(), "mode": torch_ext.describe(), "failure": torch_ext.failure()}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("style", ["isend_irecv", "batch_isend_irecv"])
def test_irecv_posted_before_isend_passes_in_every_mode(style, world, mode):
    results = run_ranks(_recv_first, world, style, env=MODES[mode], timeout=60)
    got = assert_all_ok(results)
    for rank, g in enumerate(got):
        where = f"{mode}, {world} ranks, {style}, rank {rank}: {g}\n{report(results)}"
        assert g["error"] is None, where
        assert f"check={mode})" in g["mode"], where
        assert g["from_prev"] == g["expect_prev"] and g["from_next"] == g["expect_next"], where
        assert g["total"] == world and g["failure"] is None, where


# --- a send and a receive that do not pair (issue 40) -------------------------------

def _short_message(rank: int, world: int, style: str) -> dict:
    """Rank 0 sends 4 floats of 7; rank 1 receives into 6 zeros (gloo accepts the shorter message)."""
    try:
        if rank == 0:
            if style == "blocking":
                dist.send(torch.full((4,), 7.0), 1)
            else:
                dist.isend(torch.full((4,), 7.0), 1).wait()
            dist.barrier()  # rank 1 never comes: the published verdict ends the wait
            return {"error": None}
        buf = torch.zeros(6)
        if style == "blocking":
            dist.recv(buf, 0)
        else:
            work = dist.irecv(buf, 0)
            work.wait()
        return {"error": None, "read": buf.tolist()}
    except torch_ext.GuardError as e:
        return {"error": type(e).__name__, "text": str(e)}


@pytest.mark.parametrize("style", ["blocking", "async"])
def test_a_receive_that_does_not_pair_with_its_send_reaches_no_user_code(style):
    # Before: rank 1 read [7, 7, 7, 7, 0, 0] and both ranks went on (the async comparison excludes p2p).
    results = run_ranks(_short_message, 2, style, timeout=60)
    got = assert_all_ok(results)
    for rank, g in enumerate(got):
        where = f"{style}, rank {rank}: {g}\n{report(results)}"
        assert g["error"] == "CollectiveMismatchError", where  # rank 1 from its recv, rank 0 from the barrier
        assert "rank 0: send(float32[4], dst=1, tag=0) (#1) at a line only rank 0 ran" in g["text"], where
        assert re.search(r"but rank 1 has recv\(float32\[6\], src=0, tag=0\) \(#1\) at test_verify.py:\d+ in "
                         "_short_message", g["text"]), where
