"""torch_ext.agree: a decision every rank takes together (issue 68).

Real processes at worlds 2-4, over plain gloo and through the guard (its default check), at the
default settings: every rank gets the same answer, computed from every rank's value; a branch on
the agreed value issues the same collectives everywhere, where a branch on each rank's own value
is the mismatch the guard names.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import torch_ext
from harness import assert_all_ok, run_ranks


def _agree_all_ways(rank: int, world: int) -> dict:
    out = {
        # Python scalars: one rank differs from the others.
        "any": torch_ext.agree(rank == world - 1, "any"),
        "all": torch_ext.agree(rank != world - 1, "all"),
        "all_true": torch_ext.agree(True, "all"),
        "min_int": torch_ext.agree(10 - rank, "min"),
        "max_float": torch_ext.agree(0.5 * rank, "max"),
    }
    # Tensors: 1-d, per element; the input's dtype kept for min/max, bool for any/all.
    t = torch.tensor([rank, -rank, 7], dtype=torch.int32)
    mx = torch_ext.agree(t, "max")
    anyt = torch_ext.agree(torch.tensor([rank == 0, False, True]), "any")
    out["max_tensor"] = (str(mx.dtype), mx.tolist())
    out["any_tensor"] = (str(anyt.dtype), anyt.tolist())
    out["unchanged"] = t.tolist() == [rank, -rank, 7]  # the caller's tensor is not the wire
    # Branch on the agreed decision: the collective inside runs on every rank or on none.
    has_images = rank % 2 == 0
    x = torch.ones(3)
    if torch_ext.agree(has_images, "any"):
        dist.all_reduce(x)
    out["branch"] = x.tolist()
    return out


@pytest.mark.parametrize("backend", ["gloo", "guard"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_rank_gets_the_same_agreed_value(world, backend):
    values = assert_all_ok(run_ranks(_agree_all_ways, world, backend=backend, timeout=60))
    for v in values:
        assert v["any"] is True and v["all"] is False and v["all_true"] is True
        assert v["min_int"] == 10 - (world - 1) and isinstance(v["min_int"], int)
        assert v["max_float"] == 0.5 * (world - 1) and isinstance(v["max_float"], float)
        assert v["max_tensor"] == ("torch.int32", [world - 1, 0, 7])
        assert v["any_tensor"] == ("torch.bool", [True, False, True])
        assert v["unchanged"] is True
        assert v["branch"] == [float(world)] * 3
    assert len({str(v) for v in values}) == 1  # every rank holds the same answers


def _bad_input(rank: int, world: int) -> list[str]:
    errors = []
    for call in (lambda: torch_ext.agree(True, "most"), lambda: torch_ext.agree("yes"),
                 lambda: torch_ext.agree(torch.ones(2, 2), "max")):
        try:
            call()
        except (ValueError, TypeError, RuntimeError) as e:
            errors.append(f"{type(e).__name__}: {str(e).splitlines()[0]}")
    dist.barrier()  # nothing was issued by the refused calls: the ranks are still in step
    return errors


def test_bad_input_is_refused_before_any_collective():
    values = assert_all_ok(run_ranks(_bad_input, 2, backend="guard", timeout=60))
    for errors in values:
        assert errors[0].startswith("ValueError: torch_ext.agree: how must be one of 'any', 'all', 'min', 'max'")
        assert errors[1].startswith("TypeError: torch_ext.agree: value must be a bool, int, float or tensor")
        assert errors[2].startswith("RuntimeError: torch.ops.torch_ext.agree: value must be 0-d or 1-d"), errors


def _on_a_stream(rank: int, world: int) -> str:
    try:
        torch_ext.agree(True, "any")
    except RuntimeError as e:
        said = str(e).splitlines()[0]
    else:
        said = "no error"
    # The refusal comes before any collective: a rank could end (and close its transport) while the other
    # still finishes the group's rendezvous (gloo: "connectFullMesh failed ... Connection closed by peer",
    # seen once in CI). Both meet in a gloo barrier first.
    dist.barrier(group=dist.new_group(backend="gloo"))
    return said


def test_a_cpu_backend_that_runs_on_a_stream_is_refused_not_answered_wrong():
    # nccl_sim returns from wait() before its stream ran the collective: a host-made answer would be
    # this rank's own value. Every rank gets the error naming the fix instead.
    values = assert_all_ok(run_ranks(_on_a_stream, 2, backend="nccl_sim", timeout=60))
    # ... and through the guard over nccl_sim (its wait() does not block the host either).
    values += assert_all_ok(run_ranks(_on_a_stream, 2, backend="guard", env={"TORCH_EXT_INNER": "cpu:nccl_sim"},
                                      timeout=60))
    for v in values:
        assert "runs collectives on a stream (nccl_sim)" in v and "agree on a gloo or guard-over-gloo group" in v, v
