"""Cost of torch_ext's cross-rank checks (issue 3), each against its baseline in the same run.

    python benchmarks/checks.py traffic    # async mode: store ops per rank per tick at world 2, 8, 16
    python benchmarks/checks.py strict     # strict vs TORCH_DISTRIBUTED_DEBUG=DETAIL, both over plain gloo
    python benchmarks/checks.py scale      # a 32-rank hang: the report is correct and names the culprit
    python benchmarks/checks.py all

Goals: traffic per rank per tick constant as the world grows; strict's overhead over plain
gloo at most a third of DETAIL's; a correct report at 32 ranks.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import _ranks  # noqa: E402

# --- traffic -----------------------------------------------------------------------

def _traffic_rank(rank: int, world: int, store, seconds: float) -> dict:
    import torch_ext

    dist.init_process_group("guard", store=store, rank=rank, world_size=world)
    dist.barrier()
    before = torch_ext._C._watchdog_stats()
    steps = int(seconds / 0.01)  # the same count on every rank (a clock-based loop would not be)
    for _ in range(steps):  # a training loop: one small all_reduce per "step"
        dist.all_reduce(torch.ones(4))
        time.sleep(0.01)  # the step's compute
    after = torch_ext._C._watchdog_stats()
    dist.barrier()
    dist.destroy_process_group()
    ticks = after["ticks"] - before["ticks"]
    return {"ops": after["store_ops"] - before["store_ops"], "ticks": ticks, "steps": steps}


def traffic(worlds: list[int], seconds: float) -> None:
    print("async mode, watchdog store traffic per rank (TORCH_EXT_INTERVAL=0.2 s)")
    print(f"{'world':>5} {'ticks/rank':>10} {'store ops/rank/tick':>20} {'max over ranks':>15}")
    for world in worlds:
        res = _ranks.run(_traffic_rank, world, seconds)
        per_tick = [r["ops"] / max(1, r["ticks"]) for r in res]
        print(f"{world:>5} {statistics.mean(r['ticks'] for r in res):>10.1f} "
              f"{statistics.mean(per_tick):>20.2f} {max(per_tick):>15.2f}", flush=True)


# --- strict vs DETAIL ------------------------------------------------------------------

def _time(group, iters: int) -> float:
    t = torch.ones(1)
    for _ in range(20):
        dist.all_reduce(t, group=group)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    return (time.perf_counter() - start) / iters


def _strict_rank(rank: int, world: int, store, rounds: int, iters: int) -> dict:
    import torch_ext

    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    ranks = list(range(world))
    groups = {
        "gloo": dist.new_group(ranks, backend="gloo"),
        "guard async": dist.new_group(ranks, backend="guard", pg_options=torch_ext.GuardOptions(check="async")),
        "guard strict": dist.new_group(ranks, backend="guard", pg_options=torch_ext.GuardOptions(check="strict")),
    }
    # TORCH_DISTRIBUTED_DEBUG=DETAIL wraps groups created after it is set (ProcessGroupWrapper).
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    groups["gloo DETAIL"] = dist.new_group(ranks, backend="gloo")
    dist.set_debug_level(dist.DebugLevel.OFF)
    times: dict[str, list[float]] = {k: [] for k in groups}
    for _ in range(rounds):
        for name, g in groups.items():  # interleaved
            times[name].append(_time(g, iters))
    dist.barrier()
    dist.destroy_process_group()
    return {k: statistics.median(v) for k, v in times.items()}


def strict(world: int, rounds: int, iters: int) -> None:
    res = _ranks.run(_strict_rank, world, rounds, iters)[0]
    base = res["gloo"]
    print(f"4 B all_reduce latency, world {world}, median of {rounds} interleaved rounds x {iters}")
    for name, t in res.items():
        print(f"  {name:<14} {t * 1e6:8.1f} us  {t / base:5.2f}x  overhead {max(0.0, t - base) * 1e6:7.1f} us")
    detail_over = res["gloo DETAIL"] - base
    strict_over = res["guard strict"] - base
    print(f"strict overhead / DETAIL overhead = {strict_over / detail_over:.2f} (goal <= 0.33)")


# --- scale ---------------------------------------------------------------------------

class _Catch(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _scale_rank(rank: int, world: int, store) -> dict:
    import torch_ext  # noqa: F401

    catch = _Catch()
    logging.getLogger("torch_ext").addHandler(catch)
    dist.init_process_group("guard", store=store, rank=rank, world_size=world)
    dist.all_reduce(torch.ones(1))
    start = time.monotonic()
    if rank == world - 1:
        time.sleep(6)  # the culprit
    dist.all_reduce(torch.ones(1))
    elapsed = time.monotonic() - start
    dist.barrier()
    dist.destroy_process_group()
    return {"messages": catch.messages, "elapsed": elapsed}


def scale(world: int) -> None:
    env = {"TORCH_EXT_WARN_AFTER": "3"}
    t0 = time.monotonic()
    res = _ranks.run(_scale_rank, world, env=env)
    reports = [m for r in res for m in r["messages"] if "has waited" in m]
    print(f"{world} ranks on {torch.get_num_threads()} threads/{__import__('os').cpu_count()} CPUs, "
          f"run took {time.monotonic() - t0:.1f} s; reports logged: {len(reports)}")
    print(reports[0] if reports else "NO REPORT")
    ok = (len(reports) == 1 and f"ranks 0-{world - 2}" in reports[0]
          and f"rank {world - 1} has not arrived" in reports[0] and "in _scale_rank" in reports[0])
    print("report correct:", ok)
    if not ok:
        sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["traffic", "strict", "scale", "all"])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 8, 16])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--scale-world", type=int, default=32)
    args = ap.parse_args()
    if args.what in ("traffic", "all"):
        traffic(args.worlds, args.seconds)
    if args.what in ("strict", "all"):
        strict(args.world, args.rounds, args.iters)
    if args.what in ("scale", "all"):
        scale(args.scale_world)


if __name__ == "__main__":
    main()
