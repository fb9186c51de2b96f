"""torch_ext.even_batches: uneven per-rank data ends on every rank at the same step."""
from __future__ import annotations

import random
import textwrap

import pytest
import torch
import torch.distributed as dist

from harness import assert_all_ok, report, run_ranks, run_script


def _lengths(seed: int, world: int) -> list[int]:
    rng = random.Random(seed)
    lengths = [rng.randint(0, 6) for _ in range(world)]
    if seed % 2 == 0:
        lengths[rng.randrange(world)] = 0  # a rank without any data
    return lengths


# ---------------------------------------------------------------------------
# The hang this fixes
# ---------------------------------------------------------------------------

def _plain_uneven_loop(rank: int, world: int, lengths: list[int]) -> int:
    steps = 0
    for step in range(lengths[rank]):
        print(f"rank {rank} enters step {step}", flush=True)
        grad = torch.ones(2)
        dist.all_reduce(grad)
        steps += 1
    print(f"rank {rank} left the loop after {steps} steps", flush=True)
    dist.barrier()
    return steps


def _even_loop(rank: int, world: int, lengths: list[int], policy: str, overlap: bool | None) -> tuple:
    import torch_ext

    loop = torch_ext.even_batches(range(lengths[rank]), policy=policy, overlap=overlap)
    seen = []
    for batch in loop:
        seen.append(batch)
        grad = torch.ones(2)
        dist.all_reduce(grad)  # a training collective inside the loop
    dist.barrier()  # would hang if the ranks had left at different steps
    return seen, loop.steps, loop.reason


def test_uneven_data_hangs_a_plain_loop():
    # The hang is waited out to the deadline: 4 s is ample for 2 steps (they take well under 1 s).
    results = run_ranks(_plain_uneven_loop, 2, [2, 4], backend="gloo", timeout=4)
    # Rank 0 ran out after 2 steps; rank 1 waits in step 2's all_reduce for good.
    assert results[1].timed_out, report(results)
    assert "rank 0 left the loop after 2 steps" in results[0].log, report(results)
    assert "rank 1 enters step 2" in results[1].log and "left the loop" not in results[1].log, report(results)


@pytest.mark.parametrize("seed,overlap", [(0, True), (1, False), (2, False), (3, True)])
def test_policy_stop_ends_all_ranks_when_the_first_runs_out(seed, overlap):
    world = 3
    lengths = _lengths(seed, world)
    values = assert_all_ok(run_ranks(_even_loop, world, lengths, "stop", overlap, timeout=60))
    n = min(lengths)
    for seen, steps, reason in values:
        assert seen == list(range(n)) and steps == n, (lengths, values)
        assert reason == ("exhausted" if max(lengths) == n else "data")


def _join_without_joinables(rank: int, world: int, lengths: list[int]) -> tuple:
    import torch_ext

    loop = torch_ext.even_batches(range(lengths[rank]), policy="join")
    seen = list(loop)  # no collectives in the body: nothing to shadow
    dist.barrier()
    return seen, loop.reason


@pytest.mark.parametrize("seed", [0, 1])
def test_policy_join_lets_every_rank_finish_its_data(seed):
    world = 3
    lengths = _lengths(seed, world)
    values = assert_all_ok(run_ranks(_join_without_joinables, world, lengths, timeout=60))
    for rank, (seen, reason) in enumerate(values):
        assert seen == list(range(lengths[rank])) and reason == "exhausted"


def _epochs(rank: int, world: int, lengths: list[int], epochs: int) -> list[tuple[int, str]]:
    import torch_ext

    loop = torch_ext.even_batches(range(lengths[rank]))  # built once, iterated once per epoch
    out = []
    for _ in range(epochs):
        n = sum(1 for _ in loop)
        out.append((n, loop.reason))
    return out


def _budget(rank: int, world: int, lengths: list[int], budget: int) -> list[int]:
    import torch_ext

    loop = torch_ext.even_batches(range(lengths[rank]), overlap=True)
    seen = []
    for batch in loop:
        seen.append(batch)
        if len(seen) == budget:  # the same step on every rank
            break
    loop.close()  # waits for the next step's sync, already started on every rank
    from torch._C._distributed_c10d import _get_work_registry_size

    in_flight = _get_work_registry_size()  # 0: nothing left unwaited
    second = list(loop)  # a new pass starts cleanly
    dist.barrier()
    return [len(seen), in_flight, len(second)]


def test_break_on_every_rank_then_close():
    values = assert_all_ok(run_ranks(_budget, 2, [5, 9], 2, timeout=60))
    assert values == [[2, 0, 5], [2, 0, 5]]


def test_iterable_once_per_epoch_like_a_dataloader():
    values = assert_all_ok(run_ranks(_epochs, 2, [2, 5], 3, timeout=60))
    assert values == [[(2, "data")] * 3] * 2


# ---------------------------------------------------------------------------
# Stop flags at random steps and ranks
# ---------------------------------------------------------------------------

def _stop_loop(rank: int, world: int, stop_at: list[int | None], kind: str, overlap: bool) -> tuple:
    import threading

    import torch_ext

    state = {"step": -1}
    event = threading.Event()
    flag = torch.zeros(())

    def wants_stop() -> bool:
        return stop_at[rank] is not None and state["step"] >= stop_at[rank]

    stop = {"callable": wants_stop, "event": event, "tensor": flag}[kind]
    loop = torch_ext.even_batches(range(100), stop=stop, overlap=overlap)
    for batch in loop:
        state["step"] = batch
        if wants_stop():  # the step where this rank decides (e.g. after validation)
            event.set()
            flag.fill_(1)
    dist.barrier()
    return loop.steps, loop.reason


@pytest.mark.parametrize("seed,kind,overlap", [(0, "callable", False), (1, "event", True), (2, "tensor", False),
                                               (3, "callable", True), (4, "tensor", True)])
def test_stop_flag_ends_every_rank_at_the_same_step(seed, kind, overlap):
    world = 3
    rng = random.Random(seed)
    stop_at = [rng.choice([None, None, *range(8)]) for _ in range(world)]
    if all(s is None for s in stop_at):
        stop_at[rng.randrange(world)] = rng.randrange(8)
    values = assert_all_ok(run_ranks(_stop_loop, world, stop_at, kind, overlap, timeout=60))
    first = min(s for s in stop_at if s is not None)
    # Without overlap the stop requested during step s ends the loop after it;
    # with overlap the sync was already on its way, so one more step runs.
    expected = first + 1 + (1 if overlap else 0)
    assert values == [(expected, "stop")] * world, (stop_at, values)


# ---------------------------------------------------------------------------
# policy="join" with DDP: exact gradients against a single-process reference
# ---------------------------------------------------------------------------

def _sample(rank: int, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + i)
    # Small integers: every gradient is exact in float64.
    x = torch.randint(-3, 4, (4, 3), generator=g).to(torch.float64)
    y = torch.randint(-3, 4, (4, 1), generator=g).to(torch.float64)
    return x, y


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 1, bias=False, dtype=torch.float64)
        with torch.no_grad():
            self.lin.weight.copy_(torch.tensor([[0.5, -0.25, 1.0]], dtype=torch.float64))
        self.register_buffer("calls", torch.zeros((), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x)


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((out - y) ** 2).sum()


def _ddp_join(rank: int, world: int, lengths: list[int], lr: float, overlap: bool) -> tuple:
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_ext

    model = DDP(_Model())
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    data = [_sample(rank, i) for i in range(lengths[rank])]
    grads = []
    loop = torch_ext.even_batches(data, policy="join", joinables=[model], overlap=overlap)
    for x, y in loop:
        opt.zero_grad()
        _loss(model(x), y).backward()
        grads.append(model.module.lin.weight.grad.clone())
        opt.step()
    # After the loop DDP divides by the full world size again.
    x, y = _sample(rank, 99)
    opt.zero_grad()
    _loss(model(x), y).backward()
    after = model.module.lin.weight.grad.clone()
    # Plain lists: tensors would travel through shared memory, gone once the rank exits.
    return [g.tolist() for g in grads], model.module.lin.weight.tolist(), after.tolist(), loop.reason


def _reference(lengths: list[int], lr: float, world: int) -> tuple:
    """Single process: at each step, average the gradients of the ranks that have data."""
    w = torch.tensor([[0.5, -0.25, 1.0]], dtype=torch.float64)
    step_grads = []
    for step in range(max(lengths)):
        active = [r for r in range(world) if step < lengths[r]]
        per_rank = []
        for r in active:
            wr = w.clone().requires_grad_(True)
            x, y = _sample(r, step)
            _loss(x @ wr.t(), y).backward()
            per_rank.append(wr.grad)
        g = torch.stack(per_rank).sum(0) / len(active)
        step_grads.append(g)
        w = w - lr * g
    gs = []
    for r in range(world):
        wr = w.clone().requires_grad_(True)
        x, y = _sample(r, 99)
        _loss(x @ wr.t(), y).backward()
        gs.append(wr.grad)
    after = torch.stack(gs).sum(0) / world
    return step_grads, w, after


@pytest.mark.parametrize("lengths,overlap", [([3, 1], True), ([1, 3, 0], False)])
def test_policy_join_with_ddp_averages_over_ranks_with_data(lengths, overlap):
    # Ranks with data per step stay a power of two (1 or 2), so DDP's division
    # is exact and the comparison can be exact too.
    world = len(lengths)
    lr = 0.125
    values = assert_all_ok(run_ranks(_ddp_join, world, lengths, lr, overlap, backend="gloo", timeout=90))
    ref_grads, ref_w, ref_after = _reference(lengths, lr, world)
    for rank, (grads, w, after, reason) in enumerate(values):
        assert reason == "exhausted"
        assert len(grads) == lengths[rank]
        for step, g in enumerate(grads):
            assert g == ref_grads[step].tolist(), (rank, step, g, ref_grads[step])
        # Every rank ends with the model of the ranks that trained last.
        assert w == ref_w.tolist(), (rank, w, ref_w)
        assert torch.allclose(torch.tensor(after, dtype=torch.float64), ref_after, rtol=0, atol=1e-12), \
            (rank, after, ref_after)


def _ddp_join_random(rank: int, world: int, lengths: list[int]) -> tuple:
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_ext

    model = DDP(_Model())
    opt = torch.optim.SGD(model.parameters(), lr=0.125)
    loop = torch_ext.even_batches([_sample(rank, i) for i in range(lengths[rank])], policy="join", joinables=[model])
    for x, y in loop:
        opt.zero_grad()
        _loss(model(x), y).backward()
        opt.step()
    dist.barrier()
    return model.module.lin.weight.tolist(), loop.steps


@pytest.mark.parametrize("seed", [0])
def test_policy_join_with_ddp_random_lengths(seed):
    world = 3
    lengths = _lengths(seed + 10, world)
    values = assert_all_ok(run_ranks(_ddp_join_random, world, lengths, backend="guard", timeout=90))
    _, ref_w, _ = _reference(lengths, 0.125, world) if max(lengths) else (None, values[0][0], None)
    for rank, (w, steps) in enumerate(values):
        assert steps == lengths[rank]
        assert torch.allclose(torch.tensor(w, dtype=torch.float64), torch.as_tensor(ref_w), rtol=0, atol=1e-12), \
            (lengths, rank, w, ref_w)


# ---------------------------------------------------------------------------
# DataLoader workers shut down cleanly (real torchrun processes)
# ---------------------------------------------------------------------------

_WORKERS_SCRIPT = textwrap.dedent(
    """
    import multiprocessing, os, sys
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset
    import torch_ext

    class Uneven(Dataset):
        def __init__(self, n): self.n = n
        def __len__(self): return self.n
        def __getitem__(self, i): return torch.tensor([i])

    dist.init_process_group("guard")
    rank = dist.get_rank()
    n = [3, 11][rank]                       # rank 0 runs out long before rank 1
    loader = DataLoader(Uneven(n), batch_size=1, num_workers=2, prefetch_factor=2)
    loop = torch_ext.even_batches(loader, policy=sys.argv[1])
    steps = 0
    pids = set()
    held = None
    for batch in loop:
        if held is None:
            held = loop._it                 # as a framework might: the iterator outlives the loop
            pids = {w.pid for w in held._workers}
        if sys.argv[1] == "stop":           # under "join" a ran-out rank would not shadow it
            grad = torch.ones(1)
            dist.all_reduce(grad)
        steps += 1
    alive = [c.pid for c in multiprocessing.active_children()]
    zombies = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                zombies.append((pid, f.read().split()[2]))
        except FileNotFoundError:
            pass                            # reaped: good
    # One file per rank: torchrun's ranks share one stdout pipe, where lines can interleave.
    with open(f"result_{rank}.txt", "w") as f:
        f.write(f"rank={rank} steps={steps} workers={len(pids)} alive={alive} procs={zombies}")
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.mark.parametrize("policy", ["stop", "join"])
def test_dataloader_workers_shut_down_cleanly(tmp_path, policy):
    script = tmp_path / "workers.py"
    script.write_text(_WORKERS_SCRIPT)
    # PYTHONFAULTHANDLER: should it hang (twice under "join" in 2026-12-07's local full passes: one rank's
    # second DataLoader worker alone in a futex from its start), the timeout shows every process's stack.
    proc = run_script([str(script), policy], tmp_path, timeout=120, nproc=2, PYTHONFAULTHANDLER="1")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "exited unexpectedly" not in out, out
    results = [(tmp_path / f"result_{r}.txt").read_text() for r in range(2)]
    steps = [3, 3] if policy == "stop" else [3, 11]
    assert results == [f"rank={r} steps={steps[r]} workers=2 alive=[] procs=[]" for r in range(2)], out


# ---------------------------------------------------------------------------
# Bad arguments
# ---------------------------------------------------------------------------

def test_bad_arguments_are_rejected_before_any_collective():
    import torch_ext

    with pytest.raises(ValueError, match="policy must be one of"):
        torch_ext.even_batches([1], policy="pad")
    with pytest.raises(ValueError, match="joinables=... only applies to policy='join'"):
        torch_ext.even_batches([1], joinables=[object()])
