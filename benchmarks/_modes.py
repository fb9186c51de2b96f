"""What waited.py and p2p.py share: the groups, the interleaved timing, and the table they print.

MODES: plain gloo (the baseline) and a guard group per check mode, over the same ranks.
"""
from __future__ import annotations

import random
import statistics
import time
from typing import Any, Callable

MODES = ("gloo", "verify", "async", "strict")


def groups() -> dict[str, Any]:
    """A plain gloo group and a guard group per check mode (the default group is initialised)."""
    import torch.distributed as dist

    import torch_ext

    out = {"gloo": dist.new_group(backend="gloo")}
    for mode in MODES[1:]:
        out[mode] = dist.new_group(backend="guard", pg_options=torch_ext.GuardOptions(check=mode))
    return out


def time_modes(pgs: dict[str, Any], sizes: list[int], iters: int, rounds: int,
               run: Callable[[Any, Any, int], None]) -> dict[str, list[float]]:
    """``run(tensor, group, n)`` does n operations; per size, 50 warm-up each, then ``rounds`` rounds
    timing ``iters`` on every group in a shuffled order (the same on every rank), after a barrier.
    Returns ``times["<size>/<mode>"]``: microseconds per operation, one per round, and
    ``times["cpu:<size>/<mode>"]``: this process's CPU time (all its threads) per operation, one per round."""
    import torch
    import torch.distributed as dist

    times: dict[str, list[float]] = {}
    rng = random.Random(1234)  # the same order on every rank
    for size in sizes:
        t = torch.ones(size)
        for g in pgs.values():
            run(t, g, 50)
        for _ in range(rounds):
            order = list(MODES)
            rng.shuffle(order)
            for mode in order:
                dist.barrier(group=pgs["gloo"])
                t0, c0 = time.perf_counter(), time.process_time()
                run(t, pgs[mode], iters)
                t1, c1 = time.perf_counter(), time.process_time()
                times.setdefault(f"{size}/{mode}", []).append((t1 - t0) / iters * 1e6)
                times.setdefault(f"cpu:{size}/{mode}", []).append((c1 - c0) / iters * 1e6)
    return times


def median_quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return statistics.median(xs), q[0], q[2]


def print_table(times: dict[str, list[float]], sizes: list[int], modes: tuple[str, ...], kind: str = "") -> None:
    """``times["<kind><size>/<mode>"]``: microseconds per round; ``modes[0]`` is the baseline. The ratio is
    taken per round, then its median [quartiles]."""
    print(f"  {'float32':>8} | " + " | ".join(f"{m:>22}" for m in modes))
    for size in sizes:
        base = times[f"{kind}{size}/{modes[0]}"]
        cells = []
        for mode in modes:
            if mode == modes[0]:
                us = median_quartiles(base)
                cells.append(f"{us[0]:7.0f} us [{us[1]:.0f}, {us[2]:.0f}]")
            else:
                r = median_quartiles([a / b for a, b in zip(times[f"{kind}{size}/{mode}"], base)])
                cells.append(f"{r[0]:5.2f}x [{r[1]:.2f}, {r[2]:.2f}]")
        print(f"  {size:>8} | " + " | ".join(f"{c:>22}" for c in cells))
