"""The table waited.py and p2p.py print: per size, plain gloo's time and each guard mode's ratio to it."""
from __future__ import annotations

import statistics


def median_quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return statistics.median(xs), q[0], q[2]


def print_table(times: dict[str, list[float]], sizes: list[int], modes: tuple[str, ...]) -> None:
    """``times["<size>/<mode>"]``: microseconds per round; ``modes[0]`` is the baseline. The ratio is
    taken per round, then its median [quartiles]."""
    print(f"  {'float32':>8} | " + " | ".join(f"{m:>22}" for m in modes))
    for size in sizes:
        base = times[f"{size}/{modes[0]}"]
        cells = []
        for mode in modes:
            if mode == modes[0]:
                us = median_quartiles(base)
                cells.append(f"{us[0]:7.0f} us [{us[1]:.0f}, {us[2]:.0f}]")
            else:
                r = median_quartiles([a / b for a, b in zip(times[f"{size}/{mode}"], base)])
                cells.append(f"{r[0]:5.2f}x [{r[1]:.2f}, {r[2]:.2f}]")
        print(f"  {size:>8} | " + " | ".join(f"{c:>22}" for c in cells))
