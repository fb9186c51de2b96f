"""CUDA / NCCL behaviour of the guard backend (runs on multi-GPU runners only).

Skipped without GPUs; on a GPU runner (TORCH_EXT_GPU_RUNNER=1) a missing GPU is a
failure, not a skip (see conftest.py).
"""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import torch_ext
from harness import assert_all_ok, run_ranks

pytestmark = pytest.mark.gpu(count=2)


def _nccl_matches(rank: int, world: int) -> dict:
    torch.cuda.set_device(rank)
    nccl = dist.new_group(list(range(world)), backend="nccl")
    out = {}
    for name, group in (("guard", dist.group.WORLD), ("nccl", nccl)):
        t = torch.arange(1000, device="cuda", dtype=torch.float32) + rank
        dist.all_reduce(t, group=group)
        g = [torch.empty(10, device="cuda") for _ in range(world)]
        dist.all_gather(g, torch.full((10,), float(rank), device="cuda"), group=group)
        b = torch.full((5,), float(rank), device="cuda")
        dist.broadcast(b, src=world - 1, group=group)
        out[name] = [t.cpu(), torch.stack(g).cpu(), b.cpu()]
    cpu = torch.ones(3)
    dist.all_reduce(cpu)  # the same guard group, CPU tensors: gloo inside
    return {
        "same": all(torch.equal(a, b) for a, b in zip(out["guard"], out["nccl"])),
        "inner": torch_ext._C._inner_names(dist.group.WORLD._get_backend(torch.device("cpu"))),
        "cpu": cpu.tolist(),
    }


@pytest.mark.world(2, device="cuda", timeout=180)  # torch_ext's pytest plugin: rank r on GPU r
def test_guard_over_nccl_matches_nccl_and_serves_cpu_on_gloo(rank, world_size):
    v = _nccl_matches(rank, world_size)
    assert v["same"]
    assert v["inner"] == {"cpu": "gloo", "cuda": "nccl"}
    assert v["cpu"] == [2.0, 2.0, 2.0]


def _nccl_abort(rank: int, world: int) -> str:
    torch.cuda.set_device(rank)
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    if rank == world - 1:
        time.sleep(8)
    try:
        dist.all_reduce(t)
        torch.cuda.synchronize()
    except torch_ext.GuardError as e:
        return f"{type(e).__name__}: {e}"
    except RuntimeError as e:  # NCCL's own error after our abort
        return f"RuntimeError: {e} | guard: {torch_ext.failure()}"
    return "no error"


def test_nccl_hang_is_aborted_with_a_report():
    env = {"TORCH_EXT_WARN_AFTER": "1", "TORCH_EXT_ABORT_AFTER": "3", "TORCH_EXT_INTERVAL": "0.1"}
    values = assert_all_ok(run_ranks(_nccl_abort, 2, env=env, timeout=180))
    assert "CollectiveTimeoutError" in values[0] or "timeout" in values[0], values[0]
    assert "rank 1 has not arrived" in values[0], values[0]


def _nccl_mismatch(rank: int, world: int) -> str:
    torch.cuda.set_device(rank)
    t = torch.ones(4 if rank == 0 else 8, device="cuda")
    try:
        dist.all_reduce(t)
        torch.cuda.synchronize()
    except torch_ext.CollectiveMismatchError as e:
        return str(e)
    return "no error"


def test_nccl_mismatch_strict_raises_before_the_collective():
    values = assert_all_ok(run_ranks(_nccl_mismatch, 2, env={"TORCH_EXT_CHECK": "strict"}, timeout=180))
    for v in values:
        assert "all_reduce(float32[4], SUM)" in v and "all_reduce(float32[8], SUM)" in v, v


def _step_sync_cuda(rank: int, world: int) -> list:
    torch.cuda.set_device(rank)
    sync = torch_ext.StepSync()
    out = sync(stop=rank == 1, has_data=True, metrics={"loss": torch.tensor(float(rank), device="cuda")})
    return [out.stop, out.all_have_data, float(out.metrics["loss"])]


def test_step_sync_on_cuda_tensors():
    for v in assert_all_ok(run_ranks(_step_sync_cuda, 2, timeout=180)):
        assert v == [True, True, 0.5]
