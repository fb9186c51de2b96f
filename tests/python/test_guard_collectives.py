"""guard forwards every collective unchanged: results identical to plain gloo.

Each rank runs every collective twice with the same inputs, once on a plain gloo
group and once on the guard group (wrapping gloo), and compares the outputs
bit for bit in the rank. Where gloo itself refuses an op, guard must refuse it
too, with an error that names the inner backend and the op.
"""
from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import torch_ext
from harness import assert_all_ok, run_ranks
from torch_ext._compat import torch_release

SIZES = [0, 1, 1000, 1_000_000]


def _inputs(rank: int, numel: int, dtype=torch.float32) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.arange(numel, dtype=dtype) * 0.5 + rank + 1
    return (torch.arange(numel, dtype=dtype) * 7 + rank * 3 + 1) % 97


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


class _Compare:
    """Runs one collective on gloo and on guard; records equal / both-refused / different."""

    def __init__(self, gloo: dist.ProcessGroup, guard: dist.ProcessGroup):
        self.groups = {"gloo": gloo, "guard": guard}
        self.outcome: dict[str, str] = {}

    def __call__(self, name: str, fn) -> None:
        out = {}
        for tag, group in self.groups.items():
            try:
                out[tag] = ("ok", fn(group))
            except Exception as e:  # noqa: BLE001 - recorded and compared
                out[tag] = ("err", f"{type(e).__name__}: {e}")
        g, w = out["gloo"], out["guard"]
        if g[0] == "ok" and w[0] == "ok":
            self.outcome[name] = "equal" if _equal(g[1], w[1]) else f"DIFFERENT gloo={g[1]!r:.200} guard={w[1]!r:.200}"
        elif g[0] == "err" and w[0] == "err":
            self.outcome[name] = "both refused: " + w[1]
        else:
            self.outcome[name] = f"DIVERGED guard={w[0]}:{str(w[1])[:400]} gloo={g[0]}:{str(g[1])[:200]}"


def _all_collectives(rank: int, world: int, numel: int) -> dict[str, str]:
    guard = dist.group.WORLD
    gloo = dist.new_group(list(range(world)), backend="gloo")
    cmp = _Compare(gloo, guard)
    x = lambda dtype=torch.float32: _inputs(rank, numel, dtype)  # noqa: E731

    def all_reduce(op, dtype=torch.float32):
        def run(g):
            t = x(dtype)
            dist.all_reduce(t, op=op, group=g)
            return t
        return run

    for op in [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.AVG]:
        cmp(f"all_reduce_{op}", all_reduce(op))
    for op in [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]:
        cmp(f"all_reduce_{op}_int", all_reduce(op, torch.int32))
    cmp("all_reduce_PREMUL_SUM", all_reduce(dist._make_nccl_premul_sum(2.0)))

    def broadcast(g):
        t = x()
        dist.broadcast(t, src=world - 1, group=g)
        return t

    def reduce(g):
        t = x()
        dist.reduce(t, dst=0, op=dist.ReduceOp.MAX, group=g)
        return t if rank == 0 else None

    def all_gather(g):
        out = [torch.empty(numel) for _ in range(world)]
        dist.all_gather(out, x(), group=g)
        return out

    def all_gather_into_tensor(g):
        out = torch.empty(numel * world)
        dist.all_gather_into_tensor(out, x(), group=g)
        return out

    def gather(g):
        out = [torch.empty(numel) for _ in range(world)] if rank == 0 else None
        dist.gather(x(), out, dst=0, group=g)
        return out

    def scatter(g):
        ins = [_inputs(r, numel) * 3 for r in range(world)] if rank == 0 else None
        out = torch.empty(numel)
        dist.scatter(out, ins, src=0, group=g)
        return out

    def reduce_scatter(g):
        out = torch.empty(numel)
        dist.reduce_scatter(out, [_inputs(rank + r, numel) for r in range(world)], group=g)
        return out

    def reduce_scatter_tensor(g):
        out = torch.empty(numel)
        dist.reduce_scatter_tensor(out, torch.cat([_inputs(rank + r, numel) for r in range(world)]), group=g)
        return out

    def all_to_all(g):
        ins = [_inputs(rank * world + j, numel) for j in range(world)]
        out = [torch.empty(numel) for _ in range(world)]
        dist.all_to_all(out, ins, group=g)
        return out

    unit = numel // 1000 if numel >= 1000 else numel  # rows per split unit
    send = [((rank + 2 * j) % 3) * unit for j in range(world)]
    recv = [((j + 2 * rank) % 3) * unit for j in range(world)]

    def all_to_all_single_uneven(g):
        inp = torch.arange(sum(send) * 2, dtype=torch.float32).reshape(-1, 2) + 100 * rank
        out = torch.empty(sum(recv), 2)
        dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send, group=g)
        return out

    def all_to_all_single_even(g):
        inp = _inputs(rank, numel * world)
        out = torch.empty(numel * world)
        dist.all_to_all_single(out, inp, group=g)
        return out

    def barrier(g):
        dist.barrier(group=g)
        return "done"

    def barrier_device_ids(g):
        # gloo ignores device ids (Hugging Face Accelerate passes them on CPU too).
        dist.barrier(group=g, device_ids=[rank])
        return "done"

    def async_ops(g):
        t = x()
        work = dist.all_reduce(t, group=g, async_op=True)
        fut = work.get_future()
        work.wait()
        value = fut.wait()
        return [t, work.is_completed(), work.is_success(), value[0]]

    def coalesced(g):
        # gloo cannot coalesce ("does not implement startCoalescing"); guard emulates
        # it for such inner backends, so its result is compared with plain ops on gloo.
        a, b = x(), x() * 2
        if g is gloo:
            dist.all_reduce(a, group=g)
            dist.all_reduce(b, group=g)
            return [a, b]
        with dist._coalescing_manager(group=g, device=torch.device("cpu"), async_ops=True) as cm:
            dist.all_reduce(a, group=g)
            dist.all_reduce(b, group=g)
        cm.wait()
        return [a, b]

    def all_reduce_coalesced(g):
        a, b = x(), x() + 1
        work = g.allreduce_coalesced([a, b], dist.AllreduceCoalescedOptions())
        work.wait()
        return [a, b]

    def p2p_ring(g):
        if world == 1:
            return "n/a"
        out = torch.empty(numel)
        reqs = [dist.isend(x(), (rank + 1) % world, group=g), dist.irecv(out, (rank - 1) % world, group=g)]
        for r in reqs:
            r.wait()
        return out

    def batch_p2p(g):
        if world == 1:
            return "n/a"
        out = torch.empty(numel)
        ops = [dist.P2POp(dist.isend, x() * 2, (rank + 1) % world, group=g),
               dist.P2POp(dist.irecv, out, (rank - 1) % world, group=g)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()
        return out

    def recv_any_source(g):
        if world == 1:
            return "n/a"
        if rank == 0:
            got = {}
            for _ in range(world - 1):
                buf = torch.empty(numel + 1)
                src = dist.recv(buf, group=g)  # src=None: any source
                got[src] = buf
            return [got[r] for r in sorted(got)]
        payload = torch.cat([torch.tensor([float(rank)]), x()])
        dist.send(payload, 0, group=g)
        return "sent"

    def subgroup(g):
        if world < 2:
            return "n/a"
        members = list(range(0, world, 2))
        backend = "gloo" if g is gloo else "guard"
        sub = dist.new_group(members, backend=backend)
        if rank not in members:
            return "not a member"
        t = x()
        dist.all_reduce(t, group=sub)
        return t

    def monitored_barrier(g):
        # torch before 2.15 refuses any backend but "gloo" by name in Python, before
        # the backend is reached (docs/conformance.md, D2); 2.15 takes any group with
        # a CPU backend, and the guard forwards to gloo's.
        try:
            dist.monitored_barrier(group=g)
        except ValueError as e:
            return f"refused by torch: {e}" if g is guard else "gloo refused?"
        return "done"

    for fn in [broadcast, reduce, all_gather, all_gather_into_tensor, gather, scatter, reduce_scatter,
               reduce_scatter_tensor, all_to_all, all_to_all_single_uneven, all_to_all_single_even, barrier,
               barrier_device_ids,
               async_ops, coalesced, all_reduce_coalesced, p2p_ring, batch_p2p, recv_any_source, subgroup]:
        cmp(fn.__name__, fn)
    outcome = cmp.outcome
    outcome["monitored_barrier_guard"] = monitored_barrier(guard)
    torch_ext.monitored_barrier(guard, timeout=timedelta(seconds=30))  # the wrapper reaches gloo's
    outcome["monitored_barrier_wrapper"] = "done"
    # guard still works after an op the inner backend refused (PREMUL_SUM on gloo).
    t = x()
    dist.all_reduce(t, group=guard)
    outcome["after_refusal"] = "ok"
    return outcome


# dist.monitored_barrier accepts only the name "gloo" before torch 2.15 (D2 in docs/conformance.md).
MONITORED_BARRIER_NAME_GATE = torch_release() < (2, 15)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_collective_matches_gloo(world):
    results = run_ranks(_all_collectives, world, 0, timeout=120)
    # One launch per element count would be slow; run the counts in one launch each.
    outcomes = assert_all_ok(results)
    _check(outcomes, world, 0)
    for numel in SIZES[1:]:
        outcomes = assert_all_ok(run_ranks(_all_collectives, world, numel, timeout=180))
        _check(outcomes, world, numel)


def _check(outcomes: list[dict[str, str]], world: int, numel: int) -> None:
    for rank, per_op in enumerate(outcomes):
        for op, outcome in per_op.items():
            where = f"world={world} numel={numel} rank={rank} {op}"
            assert not outcome.startswith(("DIFFERENT", "DIVERGED")), f"{where}: {outcome}"
            if op == "monitored_barrier_guard":
                if MONITORED_BARRIER_NAME_GATE:
                    assert outcome.startswith("refused by torch") and "GLOO" in outcome, f"{where}: {outcome}"
                else:
                    assert outcome == "done", f"{where}: {outcome}"
                continue
            if outcome.startswith("both refused"):
                # guard's refusal names the inner backend and the op.
                assert "gloo" in outcome.lower(), f"{where}: {outcome}"
    # The ops gloo supports must actually have run (not refused) on guard too.
    for op in ["all_reduce_RedOpType.SUM", "broadcast", "all_gather", "all_to_all_single_uneven", "barrier",
               "barrier_device_ids",
               "p2p_ring", "batch_p2p", "recv_any_source", "async_ops", "coalesced"]:
        assert outcomes[0][op] == "equal", f"world={world} numel={numel} {op}: {outcomes[0][op]}"


def _outcomes(*calls) -> list[str]:
    """Each call's outcome: "no error", or "<ExceptionType>: <message>"."""
    msgs = []
    for run in calls:
        try:
            run()
            msgs.append("no error")
        except Exception as e:  # noqa: BLE001
            msgs.append(f"{type(e).__name__}: {e}")
    return msgs


def _unsupported_ops(rank: int, world: int) -> list[str]:
    # gloo rejects PREMUL_SUM inside the work (asynchronously), and coalesced
    # all_reduce of mixed dtypes when it is issued (synchronously).
    msgs = _outcomes(lambda: dist.all_reduce(torch.ones(3), op=dist._make_nccl_premul_sum(2.0)),
                     lambda: dist.group.WORLD.allreduce_coalesced(
                         [torch.ones(1), torch.ones(1, dtype=torch.float64)], dist.AllreduceCoalescedOptions()).wait())
    t = torch.ones(2)
    dist.all_reduce(t)  # the group still works
    msgs.append(str(t.tolist()))
    return msgs


def test_op_the_inner_backend_lacks_names_backend_and_op():
    for msgs in assert_all_ok(run_ranks(_unsupported_ops, 2, timeout=60)):
        premul, coalesced, after = msgs
        assert "all_reduce" in premul and "PREMUL_SUM" in premul and "Gloo" in premul, premul
        assert premul.startswith("CollectiveFailureError"), premul
        assert "guard: inner backend 'cpu:gloo' failed all_reduce_coalesced" in coalesced, coalesced
        assert after == "[2.0, 2.0]"


FORMER_TAG = 0x7E570000  # the tag the two-rank exchanges reserved until issue 56


def _former_tag(rank: int, world: int) -> list:
    # A user's p2p under any tag, the one the guard's exchanges used included, between small
    # all_reduces (each an exchange between the two ranks): each pairs with its own peer.
    peer, read = 1 - rank, []
    for i in range(20):
        got = torch.zeros(2)
        reqs = [dist.isend(torch.full((2,), float(10 * rank + i)), peer, tag=FORMER_TAG),
                dist.irecv(got, peer, tag=FORMER_TAG)]
        t = torch.tensor([float(rank + i)])
        dist.all_reduce(t)
        for r in reqs:
            r.wait()
        read.append(got.tolist() + t.tolist())
    return read


def test_every_p2p_tag_is_the_users_beside_the_two_rank_exchanges():
    for rank, read in enumerate(assert_all_ok(run_ranks(_former_tag, 2, timeout=60))):
        want = [[float(10 * (1 - rank) + i)] * 2 + [float(1 + 2 * i)] for i in range(20)]
        assert read == want, (rank, read)
