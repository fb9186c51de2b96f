"""A wrapper changes no result: through guard, every check mode's results equal the inner backend's bit for bit.

A generated sweep (issue 56): for each world size, reduce op, dtype, length
(around the in-band carry's bounds and gloo's segment bounds) and data pattern
(values spread over many magnitudes, where the order of additions shows in the
last bits; and NaN with distinct payloads, -0 and +0, infinities, where the
order of a MAX, a MIN or a NaN sum shows), every rank runs the collective on a
plain inner group and on a guard group per check mode, and compares the
results' bits. The collectives: ``all_reduce`` (waited, and read through its
future), ``reduce_scatter_tensor`` and ``all_gather_into_tensor`` (FSDP2's), on
gloo and on nccl_sim.

The fast slice runs in CI; the whole sweep is ``pytest -m sweep
tests/python/test_exactness.py`` (its last result is in docs/conformance.md, "Exactness").
"""
from __future__ import annotations

import itertools
import time

import pytest
import torch
import torch.distributed as dist

import torch_ext
from harness import assert_all_ok, run_ranks

MODES = ("verify", "strict", "async", "off")
OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
       "product": dist.ReduceOp.PRODUCT, "avg": dist.ReduceOp.AVG}
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8}
# The integer type of each dtype's width: results are compared as bits.
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def lengths(world: int, full: bool) -> list[int]:
    """Element counts around what decides a collective's path and layout.

    The carry's bounds (one element: the one-word carry; fewer elements than
    ranks; kWordSlots = 128 and the carried lengths 256, 512...; 64 KiB of
    data: 16384 float32), gloo's ring segments and chunks (a multiple of the
    world size and one either side; 2W - 2 and 2W, 4(W - 1), 4W: the last
    chunk holding data full, where RingCarry widens the segments of the chunks
    in use, takes the next chunk, or widens every segment).
    """
    n = {1, 2, 3, world - 1, world, world + 1, 2 * world - 2, 2 * world, 2 * world + 1, 127, 128, 129, 255, 256, 257}
    if full:
        n |= {7, 31, 33, 4 * (world - 1), 4 * world - 1, 4 * world, 4 * world + 2, 6 * world, 8 * world,
              64 * world - 1, 64 * world + 1, 1000, 4095, 4097, 8191, 8193, 16383, 16384, 16385, 32769}
    return sorted(k for k in n if k >= 1)


def _data(seed: int, rank: int, dtype: torch.dtype, n: int, pattern: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        # The whole range: sums wrap, as the inner backend's do.
        return torch.randint(info.min, info.max, (n,), generator=g, dtype=torch.int64).to(dtype)
    x = torch.randn(n, generator=g, dtype=torch.float64) * torch.pow(10.0, torch.randint(-3, 4, (n,), generator=g))
    x = x.to(dtype)
    if pattern == "special":
        pick = torch.randint(0, 6, (n,), generator=g)
        x = torch.where(pick == 1, torch.zeros_like(x), x)
        x = torch.where(pick == 2, -torch.zeros_like(x), x)
        x = torch.where(pick == 3, torch.full_like(x, float("inf")), x)
        x = torch.where(pick == 4, torch.full_like(x, float("-inf")), x)
        # NaNs whose payloads differ by rank and element: which operand a sum or a max keeps shows.
        bits = x.view(BITS[x.element_size()]).clone()
        nan = torch.full_like(x, float("nan")).view(BITS[x.element_size()])
        payload = (torch.arange(n) * 7 + rank + 1) % 5 + 1
        bits = torch.where(pick == 5, nan + payload.to(bits.dtype), bits)
        x = bits.view(dtype)
    return x


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(BITS[t.element_size()])


def _sweep(rank: int, world: int, inner: str, full: bool, modes: tuple[str, ...]) -> dict:
    sim = inner == "nccl_sim"
    if sim:
        import torch_ext.testing.nccl_sim as nccl_sim
    plain = dist.new_group(backend=inner)
    guards = {m: dist.new_group(backend="guard", pg_options=torch_ext.GuardOptions(check=m, inner=f"cpu:{inner}"))
              for m in modes}

    def settle():
        if sim:
            nccl_sim.synchronize()

    def run(fn, group):
        """The result, or the error the backend raised (both backends must refuse the same)."""
        try:
            out = fn(group)
            settle()
            return out
        except (RuntimeError, ValueError) as e:
            settle()
            return type(e).__name__

    differ: list[str] = []
    cases = 0

    def compare(what: str, fn) -> None:
        nonlocal cases
        cases += 1
        want = run(fn, plain)
        for m, g in guards.items():
            got = run(fn, g)
            if isinstance(want, str) or isinstance(got, str):
                same = isinstance(want, str) and isinstance(got, str)
            else:
                same = want.dtype == got.dtype and torch.equal(_bits(want), _bits(got))
            if not same:
                where = "" if isinstance(got, str) or isinstance(want, str) else \
                    f" (elements {(_bits(want) != _bits(got)).nonzero().flatten()[:5].tolist()})"
                differ.append(f"{what} mode={m}: inner {_show(want)} guard {_show(got)}{where}")

    seed = 0
    start = time.monotonic()
    for (op_name, op), (dt_name, dtype) in itertools.product(OPS.items(), DTYPES.items()):
        if op_name == "avg" and (not full or dtype not in (torch.float32, torch.float64)):
            continue  # gloo's AVG: a sum divided in place (a loss averaged over ranks); the whole sweep's
        patterns = ("spread", "special") if dtype.is_floating_point else ("spread",)
        for n, pattern in itertools.product(lengths(world, full), patterns):
            seed += 1
            data = _data(seed, rank, dtype, n, pattern)
            what = f"world={world} {inner} {op_name} {dt_name}[{n}] {pattern}"

            def all_reduce(g, data=data, op=op):
                t = data.clone()
                dist.all_reduce(t, op=op, group=g)
                return t
            compare(f"all_reduce {what}", all_reduce)
            if n <= 257:
                def through_future(g, data=data, op=op):
                    t = data.clone()
                    return dist.all_reduce(t, op=op, group=g, async_op=True).get_future().wait()[0]
                compare(f"all_reduce future {what}", through_future)
            if op_name == "product":
                continue

            chunks = _data(seed + 10**6, rank, dtype, n * world, pattern)

            def reduce_scatter(g, chunks=chunks, op=op, n=n):
                out = torch.empty(n, dtype=chunks.dtype)
                dist.reduce_scatter_tensor(out, chunks.clone(), op=op, group=g)
                return out
            compare(f"reduce_scatter_tensor {what}", reduce_scatter)
        if op_name == "sum":
            for n in lengths(world, full):
                data = _data(seed, rank, dtype, n, "special" if dtype.is_floating_point else "spread")

                def all_gather(g, data=data, n=n):
                    out = torch.empty(n * world, dtype=data.dtype)
                    dist.all_gather_into_tensor(out, data.clone(), group=g)
                    return out
                compare(f"all_gather_into_tensor world={world} {inner} {dt_name}[{n}]", all_gather)
    return {"cases": cases, "differ": differ, "seconds": time.monotonic() - start}


def _show(x) -> str:
    return x if isinstance(x, str) else f"{str(x.dtype).split('.')[-1]}[{x.numel()}]"


def _check(world: int, inner: str, full: bool, timeout: float) -> None:
    env = {"TORCH_EXT_NCCL_SIM_WAIT": "data"} if inner == "nccl_sim" else None
    values = assert_all_ok(run_ranks(_sweep, world, inner, full, MODES, backend="gloo", timeout=timeout, env=env))
    for rank, v in enumerate(values):
        assert v["cases"] > 0
        assert not v["differ"], f"rank {rank}: {len(v['differ'])} of {v['cases']} cases differ:\n" + \
            "\n".join(v["differ"][:40])
    print(f"world {world} {inner}: {values[0]['cases']} cases x {len(MODES)} modes, bit-identical, "
          f"{max(v['seconds'] for v in values):.0f} s")


# The fast slice (CI): gloo at worlds 2 and 3 (where the carry's layout changed float sums), nccl_sim at 2,
# the carry's and the ring's bounds.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [2, 3])
def test_every_mode_gives_gloos_bits(world):
    _check(world, "gloo", full=False, timeout=540)


@pytest.mark.timeout(600)
def test_every_mode_gives_nccl_sims_bits():
    _check(2, "nccl_sim", full=False, timeout=540)


# The whole sweep: worlds 2-6, more lengths, gloo and nccl_sim (pytest -m sweep; left out otherwise).
@pytest.mark.sweep
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("inner", ["gloo", "nccl_sim"])
@pytest.mark.parametrize("world", [2, 3, 4, 5, 6])
def test_the_whole_sweep(world, inner):
    _check(world, inner, full=True, timeout=3500)


def _on_both(x: torch.Tensor, op, plain, guard) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """`x` all_reduced on the plain group and through guard: both results, and whether their bits are equal."""
    a, b = x.clone(), x.clone()
    dist.all_reduce(a, op=op, group=plain)
    dist.all_reduce(b, op=op, group=guard)
    return a, b, torch.equal(_bits(a), _bits(b))


def _one_element_sums(rank: int, world: int, inner: str, count: int) -> dict:
    plain = dist.new_group(backend=inner)
    guard = dist.new_group(backend="guard", pg_options=torch_ext.GuardOptions(inner=f"cpu:{inner}", check="verify"))
    differ, carried, issued = [], torch_ext.group_state(guard)["verifier"]["in_band"], 0
    cases = [("float32", op) for op in ("sum", "max", "min")] + [("float64", "sum"), ("int32", "sum")]
    for dt_name, op_name in cases:
        dtype, op = DTYPES[dt_name], OPS[op_name]
        values = torch.cat([_data(91 + rank, rank, dtype, count, "spread"), _data(92, rank, dtype, count, "special")])
        for i in range(values.numel()):
            a, b, same = _on_both(values[i:i + 1], op, plain, guard)
            issued += 1
            if not same:
                differ.append(f"{dt_name} {op_name} #{i}: {values[i].item()!r} -> gloo {a.item()!r}, "
                              f"guard {b.item()!r}")
    return {"differ": differ, "issued": issued,
            "carried": torch_ext.group_state(guard)["verifier"]["in_band"] - carried}


@pytest.mark.timeout(300)
def test_a_one_element_reduction_between_two_ranks_carried_in_a_word_is_gloos():
    # Between two ranks a 4-byte element under SUM, MAX or MIN is packed with its check into one
    # summed int64 and reduced from the two operands in gloo's order (InBandCheck::packs); a float64
    # SUM travels beside its check word (InBandCheck::compact), and float64's sum is its own. Each
    # must be gloo's result for every value: spread magnitudes, +-0, infinities, NaNs with payloads.
    count = 400
    values = assert_all_ok(run_ranks(_one_element_sums, 2, "gloo", count, backend="gloo", timeout=240))
    for rank, v in enumerate(values):
        assert not v["differ"], f"rank {rank}: " + "\n".join(v["differ"][:20])
        assert v["carried"] >= v["issued"], v  # each was carried (verified in band), not sent to rounds


# One float32 operand per rank for the picks below: both zeros, NaNs of both signs with distinct payloads
# (a signalling one too), infinities, and numbers. Which operand gloo keeps shows in the bits.
_PICK_BITS = [0x00000000, 0x80000000, 0x7FC00001, 0xFFC00002, 0x7F800003, 0x3F800000, 0xBF800000, 0x7F800000,
              0xFF800000, 0x40200000]


def _one_element_picks(rank: int, world: int, combos: int) -> dict:
    """A one-element MAX and MIN of float32 and int32 on plain gloo and through guard, every combination of the
    operands above (or `combos` of them, drawn alike on every rank): bits, and how many carried their check."""
    import random

    plain = dist.new_group(backend="gloo")
    guard = dist.new_group(backend="guard", pg_options=torch_ext.GuardOptions(inner="cpu:gloo", check="verify"))
    before = torch_ext.group_state(guard)["verifier"]["in_band"]
    every = list(itertools.product(range(len(_PICK_BITS)), repeat=world))
    picked = every if combos >= len(every) else random.Random(world).sample(every, combos)
    differ, issued = [], 0
    for combo in picked:
        bits = _PICK_BITS[combo[rank]]
        for dtype, op_name in itertools.product((torch.float32, torch.int32), ("max", "min")):
            x = torch.tensor([bits - (1 << 32) if bits >= 1 << 31 else bits], dtype=torch.int32).view(dtype)
            a, b, same = _on_both(x, OPS[op_name], plain, guard)
            issued += 1
            if not same:
                differ.append(f"{dtype} {op_name} {[hex(_PICK_BITS[i]) for i in combo]}: gloo {hex(_bits(a).item())}, "
                              f"guard {hex(_bits(b).item())}")
    return {"differ": differ, "issued": issued,
            "carried": torch_ext.group_state(guard)["verifier"]["in_band"] - before}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world,combos", [(3, 1000), (4, 300)])
def test_a_one_element_max_or_min_among_more_ranks_carried_as_keys_is_gloos(world, combos):
    # Among three or more ranks a one-element MAX/MIN of float32 or int32 (an early-stop flag) travels as
    # keys inside two int64 words (KeyedPick): gloo keeps the lowest rank's of two equal operands (0 and -0)
    # and drops a NaN, and what follows it in the ring, unless rank 0 holds it. Every combination at
    # world 3 (NaNs ahead of the largest number too: there the ranks exchange their elements), a draw at 4.
    values = assert_all_ok(run_ranks(_one_element_picks, world, combos, backend="gloo", timeout=240))
    for rank, v in enumerate(values):
        assert not v["differ"], f"rank {rank}: {len(v['differ'])} of {v['issued']} differ:\n" + \
            "\n".join(v["differ"][:20])
        assert v["carried"] >= v["issued"], v  # each was carried (verified in band), not sent to rounds


def _fsdp2_steps(rank: int, world: int, steps: int) -> dict:
    """The same FSDP2 training on a plain gloo group and on a guard group (the default check), from the same
    weights and data: every parameter's bits after `steps` steps, and how many collectives carried their check."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    plain = dist.new_group(backend="gloo")
    guard = dist.new_group(backend="guard", pg_options=torch_ext.GuardOptions(inner="cpu:gloo"))
    state = torch_ext.group_state(guard)["verifier"]
    before, issued_before = state["in_band"], state["issued_seq"]
    weights = {}
    for name, group in (("gloo", plain), ("guard", guard)):
        torch.manual_seed(0)
        net = torch.nn.Sequential(*[torch.nn.Linear(37, 37) for _ in range(3)])  # 37: odd, chunks off rank bounds
        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in net:
            fully_shard(layer, mesh=mesh)
        fully_shard(net, mesh=mesh)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for step in range(steps):
            g = torch.Generator().manual_seed(100 * step + rank)  # each rank its own batch
            x = torch.randn(8, 37, generator=g) * torch.pow(10.0, torch.randint(-2, 3, (8, 37), generator=g))
            loss = net(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        weights[name] = [p.full_tensor().detach().clone() for p in net.parameters()]
    differ = [i for i, (a, b) in enumerate(zip(weights["gloo"], weights["guard"]))
              if not torch.equal(_bits(a), _bits(b))]
    state = torch_ext.group_state(guard)["verifier"]
    return {"differ": differ, "params": len(weights["gloo"]), "carried": state["in_band"] - before,
            "issued": state["issued_seq"] - issued_before}


@pytest.mark.timeout(240)
def test_fsdp2_training_through_guard_at_world_3_is_gloos_bit_for_bit():
    # FSDP2's gradient reduce_scatters (AVG of float32) and parameter all_gathers carry their check at
    # world 3 (RingCarry: gloo's reduce_scatter is an all_reduce of the input, carried in gloo's own chunks);
    # the weights after the steps must be plain gloo's, bit for bit, on every rank.
    values = assert_all_ok(run_ranks(_fsdp2_steps, 3, 3, backend="gloo", timeout=200))
    for rank, v in enumerate(values):
        assert v["params"] == 6 and not v["differ"], f"rank {rank}: parameters {v['differ']} differ from gloo's"
        # Every all_gather and reduce_scatter of the steps carried its check (full_tensor()'s gathers too).
        assert v["issued"] >= 3 * 6 and v["carried"] == v["issued"], v
