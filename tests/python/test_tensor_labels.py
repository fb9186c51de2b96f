"""The tensor behind a collective (issue 68): where torch issues the collective for the user (FSDP2's
parameter groups, DDP's broadcast of the module's state and buffers), a mismatch report names the module,
the parameters or the buffers, each with its shape on that rank: the rank whose shape differs shows which.

Real ranks (tests/python/harness.py run_ranks, the store in rank 0's process and in the parent), at the
guard's default settings; every rank ends by itself with CollectiveMismatchError, and no rank reads data.
"""
from __future__ import annotations

import functools

import pytest
import torch

import torch_ext
from harness import report, run_ranks

STORES = ["rank0", "parent"]


def _mismatch_rows(results, world: int) -> dict[int, str]:
    """Every rank raised CollectiveMismatchError by itself; the report's rows as values: rank -> call site."""
    sites = {}
    for r in results:
        assert not r.timed_out and r.ok, report(results)  # each rank returned the error it caught
        kind, rows, text = r.value
        assert kind == "CollectiveMismatchError", report(results)
        sites = rows
    assert sorted(sites) == list(range(world)), sites
    return sites


def _outcome(job):
    """``job``, returning the guard error it raised as (type name, its report's rows: rank -> site, its text),
    else ("no error", {}, "")."""
    @functools.wraps(job)
    def run(rank: int, world: int):
        try:
            job(rank, world)
        except torch_ext.GuardError as e:
            rows = {row.rank: row.site for row in (e.report.rows if e.report else ())}
            return type(e).__name__, rows, str(e)
        return "no error", {}, ""
    return run


@_outcome
def _fsdp2_layer_wider_on_rank_1(rank: int, world: int) -> None:
    from torch.distributed.fsdp import fully_shard

    width = 16 if rank == 1 else 8  # the bug: a model built from rank-local settings
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, width), torch.nn.Linear(width, 4))
    for layer in net:
        fully_shard(layer)
    fully_shard(net)
    net(torch.ones(2, 8)).sum().backward()


# nccl_sim: the device path's stream backend on CPU (its results held by the gate until the verdict).
INNERS = {"gloo": {}, "nccl_sim": {"TORCH_EXT_INNER": "cpu:nccl_sim", "TORCH_EXT_NCCL_SIM_WAIT": "data"}}
CELLS = [(2, "rank0", "gloo"), (2, "parent", "gloo"), (3, "rank0", "gloo"), (3, "parent", "gloo"),
         (2, "rank0", "nccl_sim"), (3, "parent", "nccl_sim")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world,store,inner", CELLS, ids=[f"{w}-{s}-{i}" for w, s, i in CELLS])
def test_an_fsdp2_unshard_that_differs_names_the_module_and_each_ranks_parameter_shapes(world, store, inner):
    results = run_ranks(_fsdp2_layer_wider_on_rank_1, world, store=store, timeout=90, env=INNERS[inner])
    rows = _mismatch_rows(results, world)
    for rank, site in rows.items():
        assert "for FSDP2 unshard: all_gather of module '1' (2 parameters: " in site, rows
        shape = "16x8" if rank == 1 else "8x8"
        assert f"1.weight[{shape}]" in site, rows
    text = results[0].value[2]
    assert "hint: FSDP2 issues these collectives for each fully_shard module" in text, text


class _Tower(torch.nn.Module):
    def __init__(self, skip: int | None) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))  # one shape: look-alike gathers
        self.skip = skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            if i != self.skip:  # the bug: a module skipped on one rank (a text-only batch skipping a vision tower)
                x = layer(x)
        return x


@_outcome
def _fsdp2_module_skipped_on_rank_1(rank: int, world: int) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    net = _Tower(skip=1 if rank == 1 else None)
    for layer in net.layers:
        fully_shard(layer)
    fully_shard(net)
    net(torch.ones(2, 8)).sum().backward()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("inner", list(INNERS))
def test_fsdp2_gathers_of_two_modules_of_one_shape_differ_by_module_before_any_data_is_read(store, inner):
    # Same op, dtype and size on both ranks: only the module FSDP2 gathers for tells them apart. Without
    # it, rank 1 would compute layer 2 with layer 1's weights and go on.
    results = run_ranks(_fsdp2_module_skipped_on_rank_1, 2, store=store, timeout=90, env=INNERS[inner])
    rows = _mismatch_rows(results, 2)
    assert "all_gather of module 'layers.1' " in rows[0] and "all_gather of module 'layers.2' " in rows[1], rows


class _Net(torch.nn.Module):
    def __init__(self, counts: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.register_buffer("counts", torch.zeros(counts))
        self.resize_at: int | None = None
        self.steps = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.steps == self.resize_at:
            self.counts = torch.zeros(6)  # the bug: a buffer replaced, sized by rank-local data
        self.steps += 1
        return self.bn(self.lin(x))


@_outcome
def _ddp_buffer_sized_by_rank(rank: int, world: int) -> None:
    net = _Net(5 if rank == 1 else 3)
    torch.nn.parallel.DistributedDataParallel(net)


@_outcome
def _ddp_buffer_replaced_on_rank_1(rank: int, world: int) -> None:
    net = _Net(3)
    net.resize_at = 1 if rank == 1 else None
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    for _ in range(3):
        ddp(torch.ones(3, 4)).sum().backward()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store", STORES)
def test_ddps_construction_broadcast_that_differs_names_the_buffers_with_each_ranks_shapes(store):
    results = run_ranks(_ddp_buffer_sized_by_rank, 2, store=store, timeout=90)
    rows = _mismatch_rows(results, 2)
    for rank, site in rows.items():
        assert "for DDP's broadcast of the module's state at construction (buffers: " in site, rows
        assert f"counts[{5 if rank == 1 else 3}]" in site and "bn.running_mean[4]" in site, rows


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store", STORES)
def test_ddps_buffer_broadcast_before_a_forward_names_the_buffer_as_it_is_now(store):
    results = run_ranks(_ddp_buffer_replaced_on_rank_1, 2, store=store, timeout=90)
    rows = _mismatch_rows(results, 2)
    for rank, site in rows.items():
        assert "for DDP's broadcast of the module's buffers (4: " in site, rows
        assert f"counts[{6 if rank == 1 else 3}]" in site, rows
    assert "hint: DDP broadcasts the module's buffers (broadcast_buffers=True) before each forward" in \
        results[0].value[2]


def _fsdp2_and_ddp_train(rank: int, world: int):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    for _ in range(2):
        ddp(torch.full((4, 8), float(rank + 1))).sum().backward()
    sharded = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    for layer in sharded:
        fully_shard(layer)
    fully_shard(sharded)
    sharded(torch.full((4, 8), float(rank + 1))).sum().backward()
    grads = [p.grad.full_tensor() for p in sharded.parameters()]
    # Nothing of the guard's in the objects users pickle or deepcopy (torch.save(model), EMA callbacks).
    groups = [s._fsdp_param_group for m in sharded.modules() if (s := getattr(m, "_get_fsdp_state", None))
              and (s := s()) and s._fsdp_param_group is not None]
    assert groups and not any(k.startswith("_torch_ext") for o in [ddp, *groups] for k in vars(o))
    return [p.grad.clone() for p in net.parameters()] + grads + [b.clone() for b in net.buffers()]


@pytest.mark.timeout(120)
def test_the_labels_change_no_result():
    guarded = run_ranks(_fsdp2_and_ddp_train, 2, timeout=90)
    plain = run_ranks(_fsdp2_and_ddp_train, 2, backend="gloo", timeout=90)
    for g, p in zip(guarded, plain):
        assert g.ok and p.ok, report(guarded) + report(plain)
        assert len(g.value) == len(p.value)
        for a, b in zip(g.value, p.value):
            assert torch.equal(a, b)  # bit for bit
