"""torch.ops.torch_ext.step_sync and torch_ext.StepSync across real processes.

Every multi-process test runs ranks through the harness with a deadline; a
rank that hangs is killed and reported as timed out.
"""
from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist

from harness import assert_all_ok, report, run_ranks

WORLD = 3


# ---------------------------------------------------------------------------
# The classic failure, and the fix
# ---------------------------------------------------------------------------

def _classic_broadcast_and_break(rank: int, world: int, stop_at: int) -> int:
    steps = 0
    for step in range(1000):
        print(f"rank {rank} enters step {step}", flush=True)
        grad = torch.ones(4)
        dist.all_reduce(grad)  # the gradient sync every rank runs each step
        steps += 1
        if rank == 0 and step == stop_at:  # rank 0 validates and decides to stop
            dist.broadcast(torch.ones(1), src=0)
            break
    print(f"rank {rank} left the loop after {steps} steps", flush=True)
    dist.barrier()  # e.g. "everyone, save the checkpoint"
    return steps


def _step_sync_stop(rank: int, world: int, stop_at: int) -> int:
    import torch_ext

    sync = torch_ext.StepSync()
    steps = 0
    for step in range(1000):
        grad = torch.ones(4)
        dist.all_reduce(grad)
        steps += 1
        if sync(stop=rank == 0 and step == stop_at).stop:
            break
    dist.barrier()
    return steps


def test_classic_broadcast_and_break_hangs_plain_gloo():
    # The hang is waited out to the deadline: 4 s is ample for 4 steps (they take well under 1 s).
    results = run_ranks(_classic_broadcast_and_break, 2, 3, backend="gloo", timeout=4)
    # Rank 0 broadcasts its decision at step 3 and would break; rank 1 is not in
    # that broadcast but already in step 4's all_reduce. Neither ever leaves.
    assert all(r.timed_out for r in results), report(results)
    assert "rank 0 enters step 3" in results[0].log and "rank 0 enters step 4" not in results[0].log
    assert "rank 1 enters step 4" in results[1].log
    assert all("left the loop" not in r.log for r in results), report(results)


@pytest.mark.parametrize("backend", ["gloo", "guard"])
def test_step_sync_version_ends_every_rank_at_the_same_step(backend):
    results = run_ranks(_step_sync_stop, 2, 3, backend=backend, timeout=30)
    assert assert_all_ok(results) == [4, 4]


# ---------------------------------------------------------------------------
# Random stop steps and ranks
# ---------------------------------------------------------------------------

def _random_stops(rank: int, world: int, plan: list[int | None], max_steps: int) -> tuple[int, list[int]]:
    import torch_ext

    sync = torch_ext.StepSync()
    stopping = []
    step = 0
    for step in range(max_steps):
        out = sync(stop=plan[rank] == step)
        stopping.append(out.ranks_stopping)
        if out.stop:
            break
    dist.barrier()  # would hang if a rank had left at another step
    return step, stopping


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_stop_steps_and_ranks(seed):
    rng = random.Random(seed)
    max_steps = 12
    # Each rank wants to stop at a random step, or never (None).
    plan = [rng.choice([None, *range(max_steps)]) for _ in range(WORLD)]
    values = assert_all_ok(run_ranks(_random_stops, WORLD, plan, max_steps, timeout=60))
    wanted = [s for s in plan if s is not None]
    expected_last = min(wanted) if wanted else max_steps - 1
    for last, stopping in values:
        assert last == expected_last, (plan, values)
        if wanted:
            assert stopping[-1] == plan.count(expected_last)
            assert all(n == 0 for n in stopping[:-1])


# ---------------------------------------------------------------------------
# Metric means, exact against a reference
# ---------------------------------------------------------------------------

def _metric_values(seed: int, rank: int, step: int, keys: list[str]) -> dict[str, float]:
    rng = random.Random(seed * 1000003 + rank * 1009 + step)
    # Multiples of 1/64 in a small range: every partial sum is exact in float64,
    # whatever order the backend adds the ranks' values in.
    return {k: rng.randint(-4096, 4096) / 64 for k in keys}


def _has_data(seed: int, rank: int, step: int) -> bool:
    return random.Random(seed * 7919 + rank * 31 + step).random() < 0.7


def _metric_means(rank: int, world: int, seed: int, steps: int, keys: list[str], dtype: str) -> list:
    import torch_ext

    sync = torch_ext.StepSync(metrics=keys)
    out = []
    for step in range(steps):
        have = _has_data(seed, rank, step)
        values = _metric_values(seed, rank, step, keys)
        metrics = {k: torch.tensor(v, dtype=getattr(torch, dtype)) for k, v in values.items()} if have else None
        res = sync(has_data=have, metrics=metrics)
        out.append((res.ranks_with_data, res.all_have_data, {k: v.item() for k, v in res.metrics.items()},
                    all(v.dtype == torch.float64 for v in res.metrics.values())))
    return out


@pytest.mark.parametrize("seed,dtype", [(0, "float32"), (1, "float64"), (2, "bfloat16")])
def test_metric_means_exact_against_reference(seed, dtype):
    keys = ["loss", "acc", "grad_norm"]
    steps = 6
    values = assert_all_ok(run_ranks(_metric_means, WORLD, seed, steps, keys, dtype, backend="gloo", timeout=60))
    for step in range(steps):
        have = [r for r in range(WORLD) if _has_data(seed, r, step)]
        for k in keys:
            if dtype == "bfloat16":  # the input itself is rounded to bf16 on each rank
                vals = [float(torch.tensor(_metric_values(seed, r, step, keys)[k], dtype=torch.bfloat16))
                        for r in have]
            else:
                vals = [_metric_values(seed, r, step, keys)[k] for r in have]
            ref = sum(vals) / len(have) if have else float("nan")
            for r in range(WORLD):
                n, all_have, means, f64 = values[r][step]
                assert n == len(have) and all_have == (len(have) == WORLD) and f64
                got = means[k]
                assert (got == ref) or (ref != ref and got != got), (step, k, got, ref)


def _accumulates_in_float64(rank: int, world: int) -> float:
    import torch_ext

    # 40000 is exact in fp16, but 3 x 40000 overflows fp16 (max 65504).
    res = torch_ext.StepSync()(metrics={"x": torch.tensor(40000.0, dtype=torch.float16)})
    return res.metric("x") * world


def test_metrics_accumulate_in_float64():
    assert assert_all_ok(run_ranks(_accumulates_in_float64, WORLD, backend="gloo", timeout=30)) == [120000.0] * WORLD


# ---------------------------------------------------------------------------
# The op itself: opcheck, reference, torch.compile, non-blocking form
# ---------------------------------------------------------------------------

def _opcheck(rank: int, world: int) -> list[str]:
    import torch_ext  # noqa: F401

    name = dist.group.WORLD.group_name
    samples = [
        (torch.tensor([0.0, 1.0]), torch.randn(3)),
        (torch.tensor([True, False]), torch.empty(0)),
        (torch.tensor([1, 1], dtype=torch.int32), torch.randn(5, dtype=torch.float16)),
        (torch.tensor([0.0, 1.0]), torch.randn(2, requires_grad=True)),
    ]
    for flags, metrics in samples:
        torch.library.opcheck(torch.ops.torch_ext.step_sync.default, (flags, metrics, name))
    # The split form. opcheck copies its inputs, and a copy taken while the
    # collective still writes the buffer would race, so the first finish waits;
    # opcheck then checks finish on the completed buffer.
    packed = torch.ops.torch_ext.step_sync_start(torch.tensor([1.0, 1.0]), torch.randn(4), name)
    torch.ops.torch_ext.step_sync_finish(packed)
    torch.library.opcheck(torch.ops.torch_ext.step_sync_finish.default, (packed,))
    torch.library.opcheck(torch.ops.torch_ext.step_sync_start.default,
                          (torch.tensor([0.0, 1.0]), torch.randn(3), name),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    return ["ok"]


def test_opcheck_in_a_real_process_group():
    assert_all_ok(run_ranks(_opcheck, 2, backend="gloo", timeout=90))


def _reference_step_sync(flags_per_rank, metrics_per_rank):
    counts = torch.stack([(f != 0).to(torch.int64) for f in flags_per_rank]).sum(0)
    sums = torch.stack([m.to(torch.float64) for m in metrics_per_rank]).sum(0)
    return counts, sums


def _op_inputs(rank: int, k: int):
    g = torch.Generator().manual_seed(100 + rank)
    flags = torch.randint(0, 3, (2,), generator=g)  # 0, 1 or 2: non-zero counts once
    metrics = (torch.randint(-1000, 1000, (k,), generator=g) / 8).to(torch.float32)
    return flags, metrics


def _op_vs_reference(rank: int, world: int, k: int):
    import torch_ext

    flags, metrics = _op_inputs(rank, k)
    counts, sums = torch_ext.fused_step_sync(flags, metrics, dist.group.WORLD.group_name)
    packed = torch_ext.fused_step_sync_start(flags, metrics, dist.group.WORLD.group_name)
    counts2, sums2 = torch_ext.fused_step_sync_finish(packed)
    assert counts.dtype == counts2.dtype == torch.int64 and sums.dtype == sums2.dtype == torch.float64
    # Plain lists: tensors would travel through shared memory, gone once the rank exits.
    return counts.tolist(), sums.tolist(), counts2.tolist(), sums2.tolist()


@pytest.mark.parametrize("k", [0, 1, 1000])
def test_op_against_reference(k):
    values = assert_all_ok(run_ranks(_op_vs_reference, WORLD, k, timeout=60))
    inputs = [_op_inputs(r, k) for r in range(WORLD)]
    ref_counts, ref_sums = _reference_step_sync([i[0] for i in inputs], [i[1] for i in inputs])
    for counts, sums, counts2, sums2 in values:
        assert counts == counts2 == ref_counts.tolist()
        assert sums == sums2 == ref_sums.tolist()


def _compiled(rank: int, world: int) -> list[float]:
    name = dist.group.WORLD.group_name

    def step(x: torch.Tensor) -> torch.Tensor:
        loss = (x * x).mean()
        flags = torch.stack([loss > 10, torch.ones((), dtype=torch.bool)])
        counts, sums = torch.ops.torch_ext.step_sync(flags, loss.reshape(1), name)
        return sums / counts[1]

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    x = torch.full((4,), float(rank + 1))
    return [compiled(x).item(), step(x).item()]


def test_traces_under_torch_compile():
    values = assert_all_ok(run_ranks(_compiled, 2, backend="gloo", timeout=120))
    assert values == [[2.5, 2.5], [2.5, 2.5]]  # mean of 1 and 4


def _overlapped(rank: int, world: int, steps: int) -> list[tuple[bool, float]]:
    import torch_ext

    sync = torch_ext.StepSync()
    seen = []
    pending = None
    for step in range(steps):
        grad = torch.full((8,), float(rank))
        dist.all_reduce(grad)  # a "training step" collective while the sync is in flight
        if pending is not None:
            out = pending.wait()
            seen.append((out.stop, out.metric("loss")))
            if out.stop:
                break
        pending = sync.start(stop=(rank == 1 and step == 3), metrics={"loss": torch.tensor(float(step + rank))})
    else:
        if pending is not None:
            pending.wait()
    dist.barrier()
    return seen


@pytest.mark.parametrize("backend", ["gloo", "guard"])
def test_non_blocking_form_read_one_step_later(backend):
    values = assert_all_ok(run_ranks(_overlapped, WORLD, 10, backend=backend, timeout=60))
    # The stop requested at step 3 is read at step 4, on every rank.
    expected = [(s == 3, s + (0 + 1 + 2) / 3) for s in range(4)]
    assert values == [expected] * WORLD


def _subgroup(rank: int, world: int) -> tuple[int, int] | None:
    import torch_ext

    group = dist.new_group([0, 2])
    if rank not in (0, 2):
        return None
    out = torch_ext.StepSync(group)(stop=rank == 2, metrics={"r": float(rank)})
    return out.ranks_with_data, out.metric("r")


def test_works_on_a_subgroup():
    values = assert_all_ok(run_ranks(_subgroup, WORLD, timeout=60))
    assert values == [(2, 1.0), None, (2, 1.0)]


def _grad_metric(rank: int, world: int) -> tuple[bool, bool]:
    import torch_ext

    w = torch.ones(3, requires_grad=True)
    loss = (w * (rank + 1)).sum()
    out = torch_ext.StepSync()(metrics={"loss": loss})
    loss.backward()  # the sync did not take the loss out of autograd
    return out.metrics["loss"].requires_grad, bool(torch.equal(w.grad, torch.full((3,), rank + 1.0)))


def test_metrics_that_require_grad_are_accepted():
    assert assert_all_ok(run_ranks(_grad_metric, 2, backend="gloo", timeout=30)) == [(False, True)] * 2


# ---------------------------------------------------------------------------
# Bad input: clear errors, never a hang
# ---------------------------------------------------------------------------

def _bad_inputs(rank: int, world: int) -> dict[str, str]:
    import torch_ext

    name = dist.group.WORLD.group_name
    errors = {}

    def capture(key, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            errors[key] = f"{type(e).__name__}: {e}"

    capture("flags_shape", lambda: torch_ext.fused_step_sync(torch.ones(3), torch.ones(1), name))
    capture("metrics_2d", lambda: torch_ext.fused_step_sync(torch.ones(2), torch.ones(2, 2), name))
    capture("device", lambda: torch_ext.fused_step_sync(torch.ones(2), torch.ones(1, device="meta"), name))
    capture("complex", lambda: torch_ext.fused_step_sync(torch.ones(2), torch.ones(1, dtype=torch.cfloat), name))
    capture("group", lambda: torch_ext.fused_step_sync(torch.ones(2), torch.ones(1), "no_such_group"))
    capture("finish", lambda: torch_ext.fused_step_sync_finish(torch.ones(3, dtype=torch.float32)))
    sync = torch_ext.StepSync()
    capture("metric_shape", lambda: sync(metrics={"loss": torch.ones(2)}))
    sync2 = torch_ext.StepSync()
    sync2(metrics={"loss": 1.0})
    capture("renamed", lambda: sync2(metrics={"acc": 1.0}))
    capture("missing", lambda: sync2(has_data=True))
    capture("names_differ", lambda: torch_ext.StepSync()(metrics={"a" if rank == 0 else "b": 1.0}).stop)
    dist.barrier()  # every rank is still in step: nothing hung
    return errors


def test_bad_inputs_give_clear_errors_not_hangs():
    values = assert_all_ok(run_ranks(_bad_inputs, 2, backend="gloo", timeout=30))
    for rank, errors in enumerate(values):
        where = f"rank {rank} of 2"
        assert "flags must be a 1-D tensor [stop, has_data] of 2 elements, got shape [3]" in errors["flags_shape"]
        assert where in errors["flags_shape"]
        assert "metrics must be a 1-D tensor" in errors["metrics_2d"] and where in errors["metrics_2d"]
        assert "same device" in errors["device"]
        assert "complex" in errors["complex"]
        assert "no process group named 'no_such_group'" in errors["group"]
        assert "dist.group.WORLD.group_name" in errors["group"]
        assert "step_sync_start" in errors["finish"]
        assert "metric 'loss' must be a single value" in errors["metric_shape"]
        assert "metric names changed from ['loss'] to ['acc']" in errors["renamed"]
        assert "no values for the metrics ['loss']" in errors["missing"]
        assert errors["names_differ"].startswith("ValueError")
        assert "different metric or decision names" in errors["names_differ"]


def _no_group(rank: int, world: int) -> str:
    import torch_ext

    try:
        torch_ext.StepSync()(stop=True)
    except RuntimeError as e:
        return str(e)
    return ""


def test_without_process_group_names_the_fix():
    values = assert_all_ok(run_ranks(_no_group, 1, backend=None, timeout=30))
    assert "init_process_group" in values[0]


# ---------------------------------------------------------------------------
# The device of the packed buffer: from the group's backends
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("backends, cuda_available, expected", [
    ({"cpu": "gloo", "cuda": "gloo"}, True, "cpu"),  # gloo serves CUDA tensors through the host
    ({"cpu": "gloo"}, True, "cpu"),
    ({"cpu": "gloo", "cuda": "nccl"}, True, "cuda"),
    ({"cpu": "gloo", "cuda": "nccl"}, False, "cpu"),
    ({"cuda": "nccl"}, True, "cuda"),
])
def test_device_rule(backends, cuda_available, expected):
    from torch_ext.step_sync import _device_for

    assert _device_for(backends, cuda_available) == expected


def _devices_of_groups(rank: int, world: int) -> dict:
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")

    import torch_ext
    from torch_ext.backend import _backends_by_device

    # A CUDA backend of its own, without a GPU: torch's "fake" backend for CUDA tensors.
    mixed = dist.new_group(backend="cpu:gloo,cuda:fake")
    cuda_only = dist.new_group(backend="cuda:fake")
    available = torch.cuda.is_available
    try:
        torch.cuda.is_available = lambda: True  # as on a GPU machine: the default group must still pack on CPU
        out = torch_ext.StepSync()(stop=rank == 0, metrics={"x": float(rank)})
        torch.cuda.is_available = lambda: False
        try:
            torch_ext.StepSync(cuda_only)()
            error = ""
        except RuntimeError as e:
            error = str(e)
    finally:
        torch.cuda.is_available = available
    return {"world": _backends_by_device(dist.group.WORLD), "mixed": _backends_by_device(mixed),
            "device": str(out.counts.device), "stop": out.stop, "x": out.metric("x"), "cuda_only": error}


@pytest.mark.parametrize("backend, inner, expected", [
    ("gloo", None, {"cpu": "gloo", "cuda": "gloo"}),  # gloo registers itself for CUDA too
    ("guard", "cpu:gloo", {"cpu": "gloo"}),  # the guard's inner backends decide
])
def test_group_without_a_cuda_backend_of_its_own_packs_on_cpu(backend, inner, expected):
    from torch_ext import GuardOptions

    options = GuardOptions(inner=inner) if inner else None
    values = assert_all_ok(run_ranks(_devices_of_groups, 2, backend=backend, pg_options=options, timeout=60))
    for v in values:
        assert v["world"] == expected
        assert v["mixed"] == {"cpu": "gloo", "cuda": "fake"}
        assert (v["device"], v["stop"], v["x"]) == ("cpu", True, 0.5)
        # CPU by the rule, but the group cannot reduce CPU tensors: said before any collective.
        assert "no backend for CPU tensors (it has cuda:fake)" in v["cuda_only"] and "device=" in v["cuda_only"]


# ---------------------------------------------------------------------------
# CUDA (skipped without GPUs)
# ---------------------------------------------------------------------------

def _cuda_sync(rank: int, world: int) -> list:
    import torch_ext

    torch.cuda.set_device(rank)
    name = dist.group.WORLD.group_name
    dev = torch.device("cuda", rank)
    flags = torch.tensor([rank == 0, True], device=dev)
    metrics = torch.tensor([rank + 1.0, 2.0], device=dev, dtype=torch.bfloat16)
    counts, sums = torch_ext.fused_step_sync(flags, metrics, name)
    assert counts.device == dev and sums.device == dev
    sync = torch_ext.StepSync()
    out = sync(stop=torch.tensor(rank == 1, device=dev), metrics={"loss": torch.tensor(float(rank), device=dev)})
    pending = sync.start(has_data=rank == 0, metrics={"loss": torch.tensor(5.0, device=dev)})
    late = pending.wait()
    return [counts.cpu().tolist(), sums.cpu().tolist(), out.stop, out.metric("loss"), late.ranks_with_data,
            late.metric("loss")]


@pytest.mark.gpu(count=2)
@pytest.mark.parametrize("backend", ["nccl", "guard"])
def test_cuda_step_sync(backend):
    values = assert_all_ok(run_ranks(_cuda_sync, 2, backend=backend, timeout=120))
    assert values == [[[1, 2], [3.0, 4.0], True, 0.5, 1, 5.0]] * 2
