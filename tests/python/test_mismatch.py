"""Collective mismatch detection, strict and async, across real processes.

Every kind of disagreement the issue lists is issued by real ranks; each must
raise torch_ext.CollectiveMismatchError on every rank, naming the group, the
sequence number and, per distinct fingerprint, the ranks and their call sites.
A soak of matching random collectives must raise nothing.
"""
from __future__ import annotations

import random
import time

import pytest
import torch
import torch.distributed as dist

import torch_ext
from harness import assert_all_ok, report, run_ranks

# The store is not what these tests are about: a generous store timeout keeps a
# loaded CI machine (two tests at a time) from turning a slow reply into StoreLostError.
MODES = {
    "strict": {"TORCH_EXT_CHECK": "strict", "TORCH_EXT_STORE_TIMEOUT": "15"},
    "verify": {"TORCH_EXT_CHECK": "verify", "TORCH_EXT_STORE_TIMEOUT": "15"},
    "async": {"TORCH_EXT_CHECK": "async", "TORCH_EXT_INTERVAL": "0.1", "TORCH_EXT_STORE_TIMEOUT": "15"},
}


def _issue(kind: str, rank: int, world: int) -> None:
    """Issues the collective(s) of mismatch `kind`; rank 1 is the odd one out."""
    odd = rank == 1
    if kind == "op":
        t = torch.ones(4)
        if odd:
            dist.broadcast(t, src=0)
        else:
            dist.all_reduce(t)
    elif kind == "count":
        dist.all_reduce(torch.ones(5 if odd else 4))
    elif kind == "dtype":
        # Same element size on purpose: gloo aborts the process (std::terminate in its
        # I/O thread) when byte counts differ, before any check can run; strict mode
        # prevents that case.
        dist.all_reduce(torch.ones(4, dtype=torch.int32 if odd else torch.float32))
    elif kind == "shape":
        dist.all_reduce(torch.ones((4, 1) if odd else (2, 2)))
    elif kind == "reduce_op":
        dist.all_reduce(torch.ones(4), op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)
    elif kind == "root":
        dist.broadcast(torch.ones(4), src=1 if odd else 0)
    elif kind == "only_some_ranks":
        if rank == 0:
            dist.reduce(torch.ones(4), dst=0)  # the classic `if rank == 0: dist.reduce(...)`
        dist.all_reduce(torch.ones(3))
    elif kind == "order":
        a, b = torch.ones(2), torch.ones(3)
        if odd:
            dist.all_reduce(b)
            dist.all_reduce(a)
        else:
            dist.all_reduce(a)
            dist.all_reduce(b)
    elif kind == "coalesced":
        ts = [torch.ones(2), torch.ones(3 if odd else 4)]
        with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t)
        cm.wait()
    elif kind == "all_to_all_splits":
        # Rank 1 expects 2 rows from rank 0, which sends it 1: splits do not pair.
        send = [1] * world
        recv = [1] * world
        if odd:
            recv[0] = 2
        out = torch.empty(sum(recv))
        dist.all_to_all_single(out, torch.ones(sum(send)), output_split_sizes=recv, input_split_sizes=send)
    else:
        raise ValueError(kind)
    # Whatever ran (or silently corrupted data) above: strict mode raised before
    # it; async mode fails the collectives that follow, within about a second.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        dist.all_reduce(torch.ones(1))
        # At a training loop's pace, not thousands a second: the async check
        # reports from each rank's last 100 collectives, and under CI load a
        # tight loop once ran 100 past the mismatch before the check's tick.
        # (Pacing only; nothing waits on it.)
        time.sleep(0.005)


def _mismatch(rank: int, world: int, kind: str) -> str:
    try:
        _issue(kind, rank, world)
    except torch_ext.CollectiveMismatchError as e:
        assert isinstance(e, dist.DistBackendError)
        return str(e)
    return "no error"


EXPECT = {
    "op": ("all_reduce(float32[4], SUM)", "broadcast(float32[4], src=0)"),
    "count": ("all_reduce(float32[4], SUM)", "all_reduce(float32[5], SUM)"),
    "dtype": ("all_reduce(float32[4], SUM)", "all_reduce(int32[4], SUM)"),
    "shape": ("all_reduce(float32[2, 2], SUM)", "all_reduce(float32[4, 1], SUM)"),
    "reduce_op": ("all_reduce(float32[4], SUM)", "all_reduce(float32[4], MAX)"),
    "root": ("broadcast(float32[4], src=0)", "broadcast(float32[4], src=1)"),
    "only_some_ranks": ("reduce(float32[4], SUM, dst=0)", "all_reduce(float32[3], SUM)"),
    "order": ("all_reduce(float32[2], SUM)", "all_reduce(float32[3], SUM)"),
    "coalesced": ("all_reduce_coalesced(2 tensors: float32[2], float32[4], SUM)",
                  "all_reduce_coalesced(2 tensors: float32[2], float32[3], SUM)"),
    "all_to_all_splits": ("all_to_all_single", "splits do not pair"),
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("kind", sorted(EXPECT))
def test_mismatch_raises_on_every_rank_naming_ranks_and_call_sites(mode, kind):
    world = 3
    results = run_ranks(_mismatch, world, kind, env=MODES[mode], timeout=60)
    texts = assert_all_ok(results)
    a, b = EXPECT[kind]
    for rank, text in enumerate(texts):
        where = f"{mode}/{kind} rank {rank}:\n{text}\n{report(results)}"
        assert "differs across ranks" in text and 'group "default_pg" (3 ranks)' in text, where
        assert a in text and b in text, where
        assert "test_mismatch.py:" in text and "in _issue" in text, where  # call sites
        if kind not in ("all_to_all_splits", "only_some_ranks"):
            # The odd rank is named on its own line, the others together.
            assert "ranks 0,2:" in text and "rank 1:" in text, where
        # Logged once (by the lowest rank), though the mismatch also comes back as
        # the failure of every collective it aborted.
        # (An all-to-all report says both "differs across ranks" and "splits do not pair".)
        log = results[rank].log
        logged = max(log.count("differs across ranks"), log.count("splits do not pair"))
        assert logged <= 1, where


def _p2p_unpaired(rank: int, world: int, kind: str) -> str:
    try:
        if kind == "size":
            # 8 floats sent where 4 are expected. gloo aborts the receiving process
            # (std::terminate in its I/O thread) on this, so only strict mode, which
            # compares before the receive is posted, can turn it into an error.
            if rank == 0:
                dist.send(torch.ones(8), 1)
            elif rank == 1:
                dist.recv(torch.empty(4), 0)
        elif kind == "peers":
            # 0 sends to 1, 1 receives from 2, 2 receives from 0: nobody can complete.
            if rank == 0:
                dist.send(torch.ones(2), 1)
            elif rank == 1:
                dist.recv(torch.empty(2), 2)
            else:
                dist.recv(torch.empty(2), 0)
        dist.barrier()
    except (torch_ext.CollectiveMismatchError, torch_ext.CollectiveFailureError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


@pytest.mark.parametrize("kind,mode", [("size", "strict"), ("peers", "async"), ("peers", "strict")])
def test_send_recv_that_do_not_pair_are_reported(kind, mode):
    results = run_ranks(_p2p_unpaired, 3, kind, env=MODES[mode], timeout=60)
    texts = assert_all_ok(results)
    blocked = [texts[r] for r in ((0, 1) if kind == "size" else (0, 1, 2))]
    for text in blocked:
        assert text.startswith("CollectiveMismatchError"), report(results)
        assert "do not pair" in text, text
        assert "send(float32" in text and "recv(float" in text, text


def _both_receive(rank: int, world: int) -> str:
    buf = torch.zeros(4)
    try:
        dist.recv(buf, src=1 - rank)  # both wait for the other to send first
    except torch_ext.CollectiveMismatchError as e:
        return f"recv raised: {e}"
    return f"recv returned {buf.tolist()}"


def test_a_recv_whose_send_never_comes_raises_from_the_recv_itself():
    # The watchdog finds the pair that cannot complete and fails the group, which
    # aborts gloo's pending receive; its wait() then returns false. That must raise,
    # not return zeros as if data had arrived.
    for text in assert_all_ok(run_ranks(_both_receive, 2, env=MODES["async"], timeout=60)):
        assert text.startswith("recv raised: send/recv on group") and "do not pair" in text, text


# --- no false positives --------------------------------------------------------------

def _soak(rank: int, world: int, steps: int, seed: int) -> int:
    rng = random.Random(seed)  # same stream on every rank: the same program
    sub = dist.new_group([0, 1], backend="guard")
    pending = []
    done = 0
    for step in range(steps):
        kind = rng.randrange(9)
        n = rng.choice([0, 1, 7, 64])
        dtype = rng.choice([torch.float32, torch.int64])
        async_op = rng.random() < 0.3
        t = torch.ones(n, dtype=dtype)
        if kind == 0:
            w = dist.all_reduce(t, op=rng.choice([dist.ReduceOp.SUM, dist.ReduceOp.MAX]), async_op=async_op)
        elif kind == 1:
            w = dist.broadcast(t, src=rng.randrange(world), async_op=async_op)
        elif kind == 2:
            out = torch.empty(n * world, dtype=dtype)
            w = dist.all_gather_into_tensor(out, t, async_op=async_op)
        elif kind == 3:
            splits = [rng.randrange(3) for _ in range(world * world)]  # splits[src*world+dst]
            send = splits[rank * world:(rank + 1) * world]
            recv = [splits[j * world + rank] for j in range(world)]
            out = torch.empty(sum(recv), dtype=dtype)
            w = dist.all_to_all_single(out, torch.ones(sum(send), dtype=dtype), recv, send, async_op=async_op)
        elif kind == 4:
            w = dist.reduce(t, dst=rng.randrange(world), async_op=async_op)
        elif kind == 5:
            w = dist.barrier(async_op=async_op)
        elif kind == 6:
            w = None
            if rank in (0, 1):
                w = dist.all_reduce(t, group=sub, async_op=async_op)
        elif kind == 7:
            src, dst = rng.sample(range(world), 2)
            w = None
            if rank == src:
                w = dist.isend(t, dst)
            elif rank == dst:
                w = dist.irecv(torch.empty(n, dtype=dtype), src)
        else:
            out = [torch.empty(n, dtype=dtype) for _ in range(world)]
            w = dist.all_gather(out, t, async_op=async_op)
        if w is not None:
            pending.append(w)
        if len(pending) > 8 or not async_op:
            for p in pending:
                p.wait()
            done += len(pending)
            pending.clear()
    for p in pending:
        p.wait()
    dist.barrier()
    assert torch_ext.failure() is None
    return steps


@pytest.mark.slow  # a soak: started first under pytest -n (tests/python/conftest.py)
@pytest.mark.parametrize("mode", ["async", "strict"])
def test_soak_of_matching_random_collectives_raises_nothing(mode):
    steps = 10_000 if mode == "async" else 2_000
    env = dict(MODES[mode])
    results = run_ranks(_soak, 4, steps, 1234, env=env, timeout=600)
    assert assert_all_ok(results) == [steps] * 4


@pytest.mark.parametrize("kind", ["count", "reduce_op", "all_to_all_splits"])
def test_strict_two_ranks(kind):
    # Two ranks take the one-element check (v0 + v1 == 2 v); both must raise.
    results = run_ranks(_mismatch, 2, kind, env=MODES["strict"], timeout=60)
    for text in assert_all_ok(results):
        assert "differs across ranks" in text and 'group "default_pg" (2 ranks)' in text, report(results)
