"""Per-step cost of the fused step sync against the usual ways of answering the same questions.

Each step answers "does any rank want to stop?" and averages 3 metrics across
ranks. Measured in one run, on the same process group, interleaved round by
round so machine noise hits every variant alike:

  plain_4B      one 4-byte all_reduce of the stop flag + reading it (the floor)
  plain_32B     one all_reduce of 4 float64 (the size fused_3m sends) + reading
                it: on gloo the cost of a small all_reduce grows with its element
                count (its ring sends one message per non-empty segment, and
                makes at least 2 x world size segments)
  fused_flags   torch_ext.StepSync without metrics: stop + has-data in one
                all_reduce (what even_batches and the EarlyStopping decision do)
  fused_3m      torch_ext.StepSync: ONE all_reduce of [flags, 3 metrics] + means
  fused_3m_async  the same, started now and read one step later (overlapped)
  a_bcast+3ar   broadcast of the flag + one all_reduce per metric
  b_lightning   Lightning's reduce_boolean_decision + 3 x sync_dist (its own
                _sync_ddp_if_available: barrier + all_reduce each)
  c_accel       Accelerate-style set/check trigger (SUM all_reduce of a flag,
                read) + one all_reduce per metric
  c0_trigger    the Accelerate-style trigger alone (no metrics)

Usage:
    python benchmarks/step_sync.py                  # 2 and 4 ranks, gloo
    python benchmarks/step_sync.py --world-sizes 2 --steps 500 --rounds 4

Prints per-step medians (microseconds) and ratios against plain_4B and against
fused_3m. Goals (issue 4): the fused sync <= 1.1x plain_4B; fused_3m >= 3x
faster than a_bcast+3ar.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

VARIANTS = ["plain_4B", "plain_32B", "fused_flags", "fused_3m", "fused_3m_async", "a_bcast+3ar", "b_lightning",
            "c_accel", "c0_trigger"]
KEYS = ("loss", "acc", "grad_norm")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metrics(step: int) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(float(step % 7) + i, dtype=torch.float32) for i, k in enumerate(KEYS)}


def _make_variants(world: int):
    import torch_ext

    flag_sync = torch_ext.StepSync()
    sync = torch_ext.StepSync(metrics=KEYS)
    async_sync = torch_ext.StepSync(metrics=KEYS)
    state: dict = {"pending": None, "trigger": None}
    try:
        from lightning.fabric.utilities.distributed import _sync_ddp_if_available
    except ImportError:  # Lightning not installed: skip (b)
        _sync_ddp_if_available = None

    def plain(stop: bool, m: dict) -> bool:
        t = torch.tensor([int(stop)], dtype=torch.int32)
        dist.all_reduce(t)
        return bool(t.item())

    def plain32(stop: bool, m: dict) -> bool:
        t = torch.tensor([float(stop), 0.0, 0.0, 0.0], dtype=torch.float64)
        dist.all_reduce(t)
        return bool(t[0].item())

    def fused_flags(stop: bool, m: dict) -> bool:
        return flag_sync(stop=stop).stop

    def fused(stop: bool, m: dict) -> bool:
        out = sync(stop=stop, metrics=m)
        out.metrics  # the means, as the baselines compute them
        return out.stop

    def fused_async(stop: bool, m: dict) -> bool:
        prev = state["pending"]
        state["pending"] = async_sync.start(stop=stop, metrics=m)
        if prev is None:
            return False
        out = prev.wait()
        out.metrics
        return out.stop

    def bcast_and_allreduces(stop: bool, m: dict) -> bool:
        flag = torch.tensor([int(stop)], dtype=torch.int32)
        dist.broadcast(flag, src=0)
        for v in m.values():
            r = v.clone()
            dist.all_reduce(r)
            r.div_(world)
        return bool(flag.item())

    def lightning(stop: bool, m: dict) -> bool:
        # DDPStrategy.reduce_boolean_decision(all=False) and self.log(..., sync_dist=True),
        # both through Lightning's own _sync_ddp_if_available.
        decision = torch.tensor(int(stop))
        decision = _sync_ddp_if_available(decision, None, reduce_op=dist.ReduceOp.SUM)
        out = bool(decision)
        for v in m.values():
            _sync_ddp_if_available(v.clone(), None, reduce_op="mean")
        return out

    def trigger(stop: bool) -> bool:
        # set_trigger() on the deciding rank; check_trigger() on every rank.
        if stop:
            state["trigger"] = torch.tensor(1)
        flag = state["trigger"] if state["trigger"] is not None else torch.tensor(0)
        dist.all_reduce(flag)
        if flag.item() >= 1:
            state["trigger"] = None
            return True
        return False

    def accelerate(stop: bool, m: dict) -> bool:
        out = trigger(stop)
        for v in m.values():
            r = v.clone()
            dist.all_reduce(r)
            r.div_(world)
        return out

    def trigger_only(stop: bool, m: dict) -> bool:
        return trigger(stop)

    fns = {"plain_4B": plain, "plain_32B": plain32, "fused_flags": fused_flags, "fused_3m": fused,
           "fused_3m_async": fused_async, "a_bcast+3ar": bcast_and_allreduces,
           "b_lightning": lightning, "c_accel": accelerate, "c0_trigger": trigger_only}
    if _sync_ddp_if_available is None:
        del fns["b_lightning"]

    def drain() -> None:
        if state["pending"] is not None:
            state["pending"].wait()
            state["pending"] = None

    return fns, drain


def _rank(rank: int, world: int, port: int, backend: str, steps: int, rounds: int, warmup: int, out: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import torch_ext  # noqa: F401  (registers "guard" and the ops)

    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=120))
    fns, drain = _make_variants(world)
    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    inputs = [(_metrics(s)) for s in range(steps)]
    for name in names:  # warm up every path (allocators, gloo pairs, lazy imports)
        for s in range(warmup):
            fns[name](False, inputs[s % steps])
        drain()
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]  # rotate, so no variant always goes first
        for name in order:
            fn = fns[name]
            dist.barrier()
            for s in range(steps):
                m = inputs[s]
                t0 = time.perf_counter()
                fn(False, m)
                samples[name].append(time.perf_counter() - t0)
            drain()
    # Sanity: does the variant stop every rank when rank 0 asks, and when the last rank asks?
    checks = {}
    for name in names:
        got = []
        for decider in (0, world - 1):
            stop = fns[name](rank == decider, inputs[0])
            if name == "fused_3m_async":
                stop = fns[name](False, inputs[0])  # read one step later
            drain()
            got.append(bool(stop))
        checks[name] = got
    dist.barrier()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"samples": samples, "checks": checks}, f)
    dist.destroy_process_group()


def _measure(world: int, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.json")
        mp.start_processes(_rank, args=(world, _free_port(), args.backend, args.steps, args.rounds, args.warmup, out),
                           nprocs=world, join=True, start_method="spawn")
        with open(out) as f:
            return json.load(f)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    p.add_argument("--backend", default="gloo", help="process group backend (gloo, guard, ...)")
    p.add_argument("--steps", type=int, default=200, help="steps per variant per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--json", help="also write the summary here")
    args = p.parse_args()

    summary = {}
    ok = True
    print(f"torch {torch.__version__}, backend {args.backend}, {os.cpu_count()} CPUs; "
          f"{args.rounds} rounds x {args.steps} steps per variant; per-step medians in microseconds")
    for world in args.world_sizes:
        res = _measure(world, args)
        samples, checks = res["samples"], res["checks"]
        med = {n: statistics.median(v) * 1e6 for n, v in samples.items()}
        p90 = {n: statistics.quantiles(v, n=10)[-1] * 1e6 for n, v in samples.items()}
        base, fused = med["plain_4B"], med["fused_3m"]
        print(f"\nworld size {world}")
        print(f"  {'variant':<15}{'median':>9}{'p90':>10}{'x plain_4B':>12}{'x fused_3m':>12}   "
              "stops everyone when rank 0 / the last rank asks")
        for n in samples:
            c = " / ".join("yes" if x else "NO" for x in checks[n])
            print(f"  {n:<15}{med[n]:>9.1f}{p90[n]:>10.1f}{med[n] / base:>12.2f}{med[n] / fused:>12.2f}   {c}")
        flags_ratio = med["fused_flags"] / base
        goal_floor = flags_ratio <= 1.1
        goal_a = med["a_bcast+3ar"] / fused >= 3.0
        ok &= goal_floor and goal_a and all(all(checks[n]) for n in ("fused_flags", "fused_3m", "fused_3m_async"))
        print(f"  goal fused sync <= 1.1x plain_4B: fused_flags {flags_ratio:.2f}x -> "
              f"{'met' if goal_floor else 'MISSED'}; fused_3m {fused / base:.2f}x")
        print(f"  goal fused_3m >= 3x faster than a_bcast+3ar: {med['a_bcast+3ar'] / fused:.2f}x -> "
              f"{'met' if goal_a else 'MISSED'}")
        print(f"  fused_3m against a plain all_reduce of the same 4 elements: {fused / med['plain_32B']:.2f}x")
        summary[world] = {"median_us": med, "p90_us": p90, "checks": checks}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
