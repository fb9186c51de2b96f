"""Latency overhead of the ``guard`` backend over the backend it wraps.

Runs ``world`` processes on gloo over loopback. Every rank creates two groups over
the same ranks, one plain ``gloo`` and one ``guard`` (wrapping gloo), and times
``all_reduce`` on both in the same run, interleaving the two so machine noise hits
both alike. Prints the median latency of each and the ratio guard/gloo.

    python benchmarks/overhead.py                       # worlds 2 and 4, 4 B / 4 KB / 4 MB
    python benchmarks/overhead.py --world 4 --check strict
    python benchmarks/overhead.py --added               # the guard's own cost per collective (world 1)

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
        out[world] = {k: list(v) for k, v in results.items()}
    dist.barrier()
    dist.destroy_process_group()


def _added_cost(rounds: int, iters: int) -> dict[str, tuple[float, float]]:
    """Guard's own cost per collective, without the network: world 1, where gloo's
    all_reduce is a local copy, so the difference is what the guard adds (wall
    and CPU time of all threads, medians over interleaved rounds)."""
    import torch_ext

    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    groups = {"gloo": dist.new_group([0], backend="gloo"),
              "guard": dist.new_group([0], backend="guard"),
              "guard, no call sites": dist.new_group([0], backend="guard",
                                                     pg_options=torch_ext.GuardOptions(call_sites=False))}
    t = torch.ones(1)
    wall: dict[str, list[float]] = {k: [] for k in groups}
    cpu: dict[str, list[float]] = {k: [] for k in groups}
    for name, g in groups.items():
        for _ in range(200):
            dist.all_reduce(t, group=g)
    for _ in range(rounds):
        for name, g in groups.items():
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(iters):
                dist.all_reduce(t, group=g)
            wall[name].append((time.perf_counter() - w0) / iters)
            cpu[name].append((time.process_time() - c0) / iters)
    dist.destroy_process_group()
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in groups}


def _free_port() -> int:
    s = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    port = s.port
    del s
    return port


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--check", default="async", choices=["off", "async", "strict"])
    ap.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds per size (median taken)")
    ap.add_argument("--budget", type=float, default=0.25, help="seconds per timing round")
    ap.add_argument("--added", action="store_true",
                    help="measure only the guard's own added cost per collective at world 1 (no network)")
    args = ap.parse_args()

    names = ["gloo", "guard"]
    print(f"torch {torch.__version__}, guard check={args.check}, {os.cpu_count()} CPUs, gloo over loopback")
    if args.added:
        os.environ["TORCH_EXT_CHECK"] = args.check
        res = _added_cost(args.rounds, 4000)
        base_wall, base_cpu = res["gloo"]
        print("world 1 (no network): 4 B all_reduce, median of interleaved rounds x 4000")
        for name, (w, c) in res.items():
            print(f"  {name:<22} wall {w * 1e6:6.2f} us (+{(w - base_wall) * 1e6:5.2f})   "
                  f"CPU {c * 1e6:6.2f} us (+{(c - base_cpu) * 1e6:5.2f})")
        return
    print("median latency per backend; ratio = median of the per-round guard/gloo ratios (rounds interleave")
    print("the two backends, so each ratio compares measurements taken moments apart), with its quartiles")
    print(f"{'world':>5} {'size':>6} {'gloo':>12} {'guard':>12} {'ratio':>7} {'quartiles':>15}")
    for world in args.world:
        manager = mp.Manager()
        out = manager.dict()
        mp.spawn(_worker, args=(world, _free_port(), args.check, args.rounds, args.budget, out, names),
                 nprocs=world, join=True)
        res = out[world]
        for label in SIZES:
            base = res[("gloo", label)]
            guard = res[("guard", label)]
            ratios = sorted(g / b for g, b in zip(guard, base))
            q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
            print(f"{world:>5} {label:>6} {statistics.median(base) * 1e6:>10.1f}us "
                  f"{statistics.median(guard) * 1e6:>10.1f}us {statistics.median(ratios):>6.3f}x "
                  f"  [{q1:.3f}, {q3:.3f}]")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
