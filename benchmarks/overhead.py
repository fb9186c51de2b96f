"""Latency overhead of the ``guard`` backend over the backend it wraps.

Runs ``world`` processes on gloo over loopback. Every rank creates two groups over
the same ranks, one plain ``gloo`` and one ``guard`` (wrapping gloo), and times
``all_reduce`` on both in the same run, interleaving the two so machine noise hits
both alike. Prints the median latency of each and the ratio guard/gloo.

    python benchmarks/overhead.py                       # worlds 2 and 4, 4 B / 4 KB / 4 MB
    python benchmarks/overhead.py --world 4 --check strict
    python benchmarks/overhead.py --baseline-detail     # also gloo under TORCH_DISTRIBUTED_DEBUG=DETAIL

Goal (issue 2): at most 1.05x at 4 B and 1.01x at 4 MB in the default (async) mode.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = {"4 B": 1, "4 KB": 1024, "4 MB": 1024 * 1024}


def _time_group(group: dist.ProcessGroup, numel: int, iters: int) -> float:
    t = torch.ones(numel)
    dist.all_reduce(t, group=group)  # warm the path
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    return (time.perf_counter() - start) / iters


def _iters_for(numel: int, budget_s: float) -> int:
    return max(5, min(2000, int(budget_s / (20e-6 + numel * 4 * 2e-9))))


def _worker(rank: int, world: int, port: int, check: str, rounds: int, budget: float, out: dict, names: list[str]):
    os.environ["TORCH_EXT_CHECK"] = check
    import torch_ext  # noqa: F401  (registers "guard")

    store = dist.TCPStore("127.0.0.1", port, world, is_master=(rank == 0), timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    groups = {name: dist.new_group(list(range(world)), backend=name.split("+")[0]) for name in names}
    results: dict[tuple[str, str], list[float]] = {}
    for label, numel in SIZES.items():
        iters = _iters_for(numel, budget)
        for name in names:  # warm-up round, discarded
            _time_group(groups[name], numel, max(3, iters // 10))
        for _ in range(rounds):
            for name in names:  # interleaved
                results.setdefault((name, label), []).append(_time_group(groups[name], numel, iters))
    if rank == 0:
        out[world] = {k: statistics.median(v) for k, v in results.items()}
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    s = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    port = s.port
    del s
    return port


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--check", default="async", choices=["off", "async", "strict"])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds per size (median taken)")
    ap.add_argument("--budget", type=float, default=0.15, help="seconds per timing round")
    args = ap.parse_args()

    names = ["gloo", "guard"]
    print(f"torch {torch.__version__}, guard check={args.check}, {os.cpu_count()} CPUs, gloo over loopback")
    print(f"{'world':>5} {'size':>6} {'gloo':>12} {'guard':>12} {'ratio':>7}")
    for world in args.world:
        manager = mp.Manager()
        out = manager.dict()
        mp.spawn(_worker, args=(world, _free_port(), args.check, args.rounds, args.budget, out, names),
                 nprocs=world, join=True)
        res = out[world]
        for label in SIZES:
            base = res[("gloo", label)]
            guard = res[("guard", label)]
            print(f"{world:>5} {label:>6} {base * 1e6:>10.1f}us {guard * 1e6:>10.1f}us {guard / base:>6.3f}x")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
