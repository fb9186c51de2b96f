"""The default's cost at every world size, at a glance (issue 70): one command, one table.

    python benchmarks/cost.py                          # worlds 2, 3, 4; quiet and with one busy process
    python benchmarks/cost.py --worlds 3 --no-busy     # one world, quiet only
    python benchmarks/cost.py --svg docs/cost.svg      # and the plot
    python benchmarks/cost.py --inner nccl_sim         # the device path on CPU: NCCL's host semantics

The syncs a training loop waits for at once, each a loop of synchronous all_reduces: a loss
(float32[1] SUM), a metric vector (float32[16] SUM), a count (int64[1] SUM) and an early-stop flag
(float32[1] MAX); and an FSDP2 layer's two collectives at FSDP2's sizes, synchronous too: the
all_gather_into_tensor of its parameters (1 MiB of float32 gathered from a shard per rank) and the
reduce_scatter_tensor of its gradients (1 MiB, AVG), each a tenth of ``--iters`` calls. Every
rank creates a plain ``gloo`` group and ``guard`` groups in ``verify`` (the default) and
``async``; a round times ``--iters`` calls on each group in turn (shuffled order, after a
barrier), and the ratio to gloo is taken per round. Each world runs quiet, then with one more
process keeping a core busy beside the ranks (``--no-busy`` leaves that out). Prints, per world
and sync, gloo's microseconds per call and each mode's ratio, median [quartiles] over rounds.

``--inner nccl_sim``: the baseline is plain ``nccl_sim`` (NCCL's host semantics on CPU: an
all_reduce returns at once, the result is there after ``nccl_sim.synchronize()``), the modes
wrap it; each timed call is the all_reduce and the sync that reads its result (the stream gate
holds the stream until the verdict in verify), and a second figure, ``issue``, is the host time
of the all_reduce call alone (NCCL's launch cost: what the host pays before it goes on).

On a machine with fewer cores than ranks, the ranks share cores: compare the ratios, not the times
(say so beside a figure). Goal (issue 70): verify at most 1.10x gloo at worlds 2-4, quiet and busy.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import _modes  # noqa: E402
import _ranks  # noqa: E402
from waited import _busy  # noqa: E402

SYNCS = {  # name: (dtype, elements, op, collective); the FSDP2 rows: elements of the whole layer (1 MiB)
    "loss float32[1] SUM": (torch.float32, 1, "sum", "all_reduce"),
    "metrics float32[16] SUM": (torch.float32, 16, "sum", "all_reduce"),
    "count int64[1] SUM": (torch.int64, 1, "sum", "all_reduce"),
    "flag float32[1] MAX": (torch.float32, 1, "max", "all_reduce"),
    "FSDP2 gather float32[1 MiB]": (torch.float32, 1 << 18, "", "all_gather"),
    "FSDP2 grads float32[1 MiB] AVG": (torch.float32, 1 << 18, "avg", "reduce_scatter"),
}
MODES = ("gloo", "verify", "async")
OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}
BIG = 10  # the FSDP2 rows run a tenth of --iters (each call moves a megabyte)


def _call(name: str, world: int):
    """The timed call of sync `name` on a group: an all_reduce of a loop's sync, or an FSDP2 layer's
    all_gather_into_tensor (its parameters, a shard per rank) or reduce_scatter_tensor (its gradients)."""
    dtype, n, op, collective = SYNCS[name]
    if collective == "all_reduce":
        t = torch.ones(n, dtype=dtype)
        return lambda g: dist.all_reduce(t, op=OPS[op], group=g)
    shard = n // world
    whole, part = torch.ones(shard * world, dtype=dtype), torch.ones(shard, dtype=dtype)
    if collective == "all_gather":
        return lambda g: dist.all_gather_into_tensor(whole, part, group=g)
    return lambda g: dist.reduce_scatter_tensor(part, whole, op=OPS[op], group=g)


def _groups(inner: str) -> dict:
    """The baseline ("gloo": the plain inner backend, whichever it is) and a guard group per mode."""
    import torch_ext

    if inner == "gloo":
        return {m: g for m, g in _modes.groups().items() if m in MODES}
    import torch_ext.testing.nccl_sim  # noqa: F401  (registers "nccl_sim")

    out = {"gloo": dist.new_group(backend="nccl_sim")}
    for mode in MODES[1:]:
        out[mode] = dist.new_group(backend="guard",
                                   pg_options=torch_ext.GuardOptions(check=mode, inner="cpu:nccl_sim"))
    return out


def _no_sync(group) -> None:
    """gloo: a waited all_reduce's result is there when it returns."""


def _body(rank: int, world: int, store, syncs: list[str], iters: int, rounds: int, inner: str) -> dict:
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    groups = _groups(inner)
    sync = _no_sync
    if inner == "nccl_sim":
        from torch_ext.testing import nccl_sim
        sync = nccl_sim.synchronize
    rng = random.Random(1234)  # the same order on every rank
    times: dict[str, list[float]] = {}
    for name in syncs:
        call = _call(name, world)
        n = iters if SYNCS[name][3] == "all_reduce" else max(1, iters // BIG)
        for g in groups.values():
            for _ in range(50 if n == iters else 5):
                call(g)
                sync(g)
        for _ in range(rounds):
            order = list(MODES)
            rng.shuffle(order)
            for mode in order:
                dist.barrier()
                issue = 0.0
                t0 = time.perf_counter()
                for _ in range(n):
                    i0 = time.perf_counter()
                    call(groups[mode])
                    issue += time.perf_counter() - i0
                    sync(groups[mode])  # where NCCL code reads the result (.item()): nccl_sim's sync point
                times.setdefault(f"{name}/{mode}", []).append((time.perf_counter() - t0) / n * 1e6)
                times.setdefault(f"issue:{name}/{mode}", []).append(issue / n * 1e6)
    dist.destroy_process_group()
    return times


def _cells(times: dict[str, list[float]], name: str, kind: str = "") -> list[str]:
    base = times[f"{kind}{name}/gloo"]
    med, lo, hi = _modes.median_quartiles(base)
    cells = [f"{med:6.{1 if kind else 0}f} us [{lo:.{1 if kind else 0}f}, {hi:.{1 if kind else 0}f}]"]
    for mode in MODES[1:]:
        r = _modes.median_quartiles([a / b for a, b in zip(times[f"{kind}{name}/{mode}"], base)])
        cells.append(f"{r[0]:5.2f}x [{r[1]:.2f}, {r[2]:.2f}]")
    return cells


def _svg(path: str, rows: list[tuple[int, str, str, float]]) -> None:
    """A bar per (world, sync, column) of verify's median ratio, with the 1.10x goal drawn across."""
    width, height, left, top, bar = 760, 60 + 22 * len(rows), 300, 30, 18
    scale = 400 / max(2.0, max(r[3] for r in rows))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" '
           'font-size="12">', f'<text x="{left}" y="18">verify / gloo (median ratio; benchmarks/cost.py)</text>']
    for i, (world, name, column, ratio) in enumerate(rows):
        y = top + 22 * i
        out.append(f'<text x="4" y="{y + 13}">world {world} {name} ({column})</text>')
        colour = "#4a8" if ratio <= 1.10 else "#d84"
        out.append(f'<rect x="{left}" y="{y}" width="{ratio * scale:.1f}" height="{bar}" fill="{colour}"/>')
        out.append(f'<text x="{left + ratio * scale + 4:.1f}" y="{y + 13}">{ratio:.2f}x</text>')
    goal = left + 1.10 * scale
    out.append(f'<line x1="{goal:.1f}" y1="{top - 4}" x2="{goal:.1f}" y2="{height - 20}" stroke="#000" '
               'stroke-dasharray="4"/>')
    out.append(f'<text x="{goal + 2:.1f}" y="{height - 6}">1.10x</text></svg>')
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--syncs", nargs="+", choices=sorted(SYNCS), default=list(SYNCS), metavar="SYNC")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-busy", action="store_true", help="quiet only")
    ap.add_argument("--svg", help="also write a plot of verify's ratios here")
    ap.add_argument("--inner", choices=["gloo", "nccl_sim"], default="gloo",
                    help="the backend the guard wraps and the baseline is (default gloo)")
    args = ap.parse_args()
    import os
    cores = os.cpu_count() or 1
    columns = ["quiet"] + ([] if args.no_busy else ["busy"])
    print(f"inner {args.inner}" + (" (the baseline column is plain nccl_sim; each call: all_reduce, then "
                                     "nccl_sim.synchronize(); issue: the all_reduce call alone)"
                                     if args.inner == "nccl_sim" else "") + "; "
          f"{args.rounds} rounds of {args.iters} synchronous all_reduces (FSDP2 rows: {max(1, args.iters // BIG)} "
          f"calls) per mode and sync, interleaved; "
          f"median [quartiles] over rounds; {cores} cores" +
          ("" if args.no_busy else "; busy: one more process keeps a core busy beside the ranks"))
    head = f"{'world':>5} | {'sync':<30} | {'column':<6} | " + " | ".join(f"{m:>20}" for m in MODES)
    print(head + "\n" + "-" * len(head))
    plotted = []
    for world in args.worlds:
        for column in columns:
            with _busy(1 if column == "busy" else 0):
                times = _ranks.run(_body, world, args.syncs, args.iters, args.rounds, args.inner)[0]
            for name in args.syncs:
                cells = _cells(times, name)
                note = "" if world <= cores else "  (ranks share cores)"
                print(f"{world:>5} | {name:<30} | {column:<6} | " + " | ".join(f"{c:>20}" for c in cells) + note)
                if args.inner != "gloo":
                    cells = _cells(times, name, kind="issue:")
                    print(f"{'':>5} | {'  issue':<30} | {column:<6} | " + " | ".join(f"{c:>20}" for c in cells))
                ratio = _modes.median_quartiles([a / b for a, b in zip(times[f"{name}/verify"],
                                                                        times[f"{name}/gloo"])])[0]
                plotted.append((world, name, column, ratio))
    if args.svg:
        _svg(args.svg, plotted)
        print(f"plot: {args.svg}")


if __name__ == "__main__":
    main()
