"""Latency overhead of the ``guard`` backend over the backend it wraps.

Runs ``world`` processes on gloo over loopback. Every rank creates two groups over
the same ranks, one plain ``gloo`` and one ``guard`` (wrapping gloo), and times
``all_reduce`` on both in the same run, interleaving the two so machine noise hits
both alike. Prints the median latency of each and the ratio guard/gloo.

    python benchmarks/overhead.py                       # worlds 2 and 4, 4 B / 4 KB / 4 MB
    python benchmarks/overhead.py --world 4 --check strict
    python benchmarks/overhead.py --added --rounds 31   # the guard's own cost per collective (world 1)
    python benchmarks/overhead.py --added --label       # ... and with a torch_ext.label active
    python benchmarks/overhead.py --added --busy-thread --iters 200  # ... beside a busy Python thread (wall time)
    python benchmarks/overhead.py --device cuda --rounds 31  # host cost per collective over NCCL (one GPU, world 1)

With ``--device cuda`` (a GPU machine; ``scripts/gpu.sh`` runs it) it measures the
host cost per collective instead: guard over ``nccl`` against plain ``nccl``, 4 B and
4 MB all_reduce, one process on one GPU (world 1), see ``_cuda_cost``.

Goals: at most 1.05x at 4 B and 1.01x at 4 MB in the default (async) mode (issue 2);
the guard's own cost at most 0.5 us over torch's no-op ``fake`` backend, and at most
1.03x over gloo at world 1 (issue 11).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import sys
import threading
import time
from datetime import timedelta
from typing import NamedTuple

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


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


class Added(NamedTuple):
    cpu: dict[str, list[float]]       # CPU time of all threads per call, per round
    main: dict[str, list[float]]      # CPU time of the calling thread per call, per round
    switches: dict[str, list[float]]  # voluntary context switches (all threads) per call, per round


LABELLED = "guard(fake), label active"


def _added_cost(rounds: int, iters: int, with_label: bool = False, busy_thread: bool = False) -> Added:
    """The guard's own cost per collective, in one process (world 1).

    Against torch's no-op ``fake`` backend the guard's work is the whole
    difference (fingerprint, ledger, call site, wrapped work, completion); against
    gloo at world 1 (a local copy on gloo's worker thread) it includes the
    completion path across threads. Each round times every group once, in a
    shuffled order, as CPU time of all threads per call; returns the per-round
    figures of each group. ``with_label``: one more guard(fake) group, timed
    inside ``torch_ext.label(...)`` (a label with an origin), in the same rounds.
    ``busy_thread``: another Python thread spins beside the loop (a data or logging
    thread), so every GIL hand-off waits for it; the figures are then wall time per
    call (the process's CPU time counts the spinner)."""
    import random
    import threading

    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")

    import torch_ext

    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    groups = {
        "fake": dist.new_group([0], backend="fake"),
        "guard(fake)": dist.new_group([0], backend="guard", pg_options=torch_ext.GuardOptions(inner="cpu:fake")),
        "guard(fake), no call sites": dist.new_group(
            [0], backend="guard", pg_options=torch_ext.GuardOptions(inner="cpu:fake", call_sites=False)),
        **({LABELLED: dist.new_group([0], backend="guard", pg_options=torch_ext.GuardOptions(inner="cpu:fake"))}
           if with_label else {}),
        "gloo": dist.new_group([0], backend="gloo"),
        "guard(gloo)": dist.new_group([0], backend="guard", pg_options=torch_ext.GuardOptions(inner="cpu:gloo")),
    }
    t = torch.ones(1)
    cpu: dict[str, list[float]] = {k: [] for k in groups}
    main: dict[str, list[float]] = {k: [] for k in groups}
    switches: dict[str, list[float]] = {k: [] for k in groups}
    for g in groups.values():
        for _ in range(500):
            dist.all_reduce(t, group=g)
    rng = random.Random(0)
    origin = torch_ext.here()
    clock = time.perf_counter if busy_thread else time.process_time
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: _spin(stop), daemon=True)
    if busy_thread:
        spinner.start()
    for _ in range(rounds):
        order = list(groups.items())
        rng.shuffle(order)
        for name, g in order:
            s0 = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
            with torch_ext.label("metric 'loss'", origin=origin) if name == LABELLED else contextlib.nullcontext():
                c0, m0 = clock(), time.thread_time()
                for _ in range(iters):
                    dist.all_reduce(t, group=g)
                c1, m1 = clock(), time.thread_time()
            cpu[name].append((c1 - c0) / iters)
            main[name].append((m1 - m0) / iters)
            switches[name].append((resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - s0) / iters)
    stop.set()
    if busy_thread:
        spinner.join()
    dist.destroy_process_group()
    return Added(cpu, main, switches)


def _spin(stop: threading.Event) -> None:
    while not stop.is_set():  # pure Python: holds the GIL but for the switch interval
        pass


def _print_added(added: Added, rounds: int, iters: int, busy_thread: bool = False) -> None:
    cpu = added.cpu
    what = ("wall time per call, a Python thread spinning beside the loop" if busy_thread
            else "CPU time of all threads per call")
    print(f"world 1, all_reduce of 1 float, {what}: {rounds} shuffled rounds x {iters} calls;")
    print("median [quartiles] over rounds; 'added' is per round, against the baseline timed in the same round")
    for name, xs in cpu.items():
        q1, m, q3 = _quartiles(xs)
        print(f"  {name:<28} {m * 1e6:6.2f} us  [{q1 * 1e6:.2f}, {q3 * 1e6:.2f}]")
    fake = cpu["fake"]
    for name, goal in (("guard(fake)", 0.5), ("guard(fake), no call sites", 0.5)):
        q1, m, q3 = _quartiles([(g - f) * 1e6 for g, f in zip(cpu[name], fake)])
        verdict = "met" if q3 <= goal else ("not met" if q1 > goal else "not resolved by this run's noise")
        goal_text = "" if busy_thread else f"   goal <= {goal} us: {verdict}"  # the goals are CPU time, alone
        print(f"  {name} adds {m:+.2f} us [{q1:+.2f}, {q3:+.2f}] over fake{goal_text}")
    if LABELLED in cpu:
        q1, m, q3 = _quartiles([(g - f) * 1e6 for g, f in zip(cpu[LABELLED], cpu["guard(fake)"])])
        print(f"  a torch_ext.label active adds {m:+.2f} us [{q1:+.2f}, {q3:+.2f}] over guard(fake)")
    q1, m, q3 = _quartiles([g / b for g, b in zip(cpu["guard(gloo)"], cpu["gloo"])])
    verdict = "met" if q3 <= 1.03 else ("not met" if q1 > 1.03 else "not resolved by this run's noise")
    goal_text = "" if busy_thread else f"   goal <= 1.03x: {verdict}"
    print(f"  guard(gloo) / gloo = {m:.3f}x [{q1:.3f}, {q3:.3f}]{goal_text}")
    # Where the gloo difference is spent: on the calling thread or on gloo's worker
    # (the completion callback), and whether the guard adds a thread hand-off. Beside a
    # busy thread the figures are wall time, which no thread's CPU time splits.
    for label, series in () if busy_thread else (("calling thread", added.main),
                          ("other threads", {k: [c - m for c, m in zip(cpu[k], added.main[k])] for k in cpu})):
        q1, m, q3 = _quartiles([(g - b) * 1e6 for g, b in zip(series["guard(gloo)"], series["gloo"])])
        print(f"    of which on the {label}: {m:+.2f} us [{q1:+.2f}, {q3:+.2f}]")
    sw = {k: statistics.median(added.switches[k]) for k in ("gloo", "guard(gloo)")}
    print(f"    voluntary context switches per call: gloo {sw['gloo']:.2f}, guard(gloo) {sw['guard(gloo)']:.2f}")


CUDA_SIZES = {"4 B": 1, "4 MB": 1024 * 1024}
CUDA_METRICS = {  # name -> heading
    "issue": "host wall",    # the calling thread's wall time to issue one call (what the training loop waits)
    "main": "host CPU",      # the calling thread's CPU time per call
    "cpu": "all threads",    # CPU time of every thread of the process per call (watchdogs, NCCL's threads)
    "done": "to completion",  # wall time per call up to torch.cuda.synchronize() at the end of the round
}


def _cuda_cost(rounds: int, iters: int) -> dict[tuple[str, str, str], list[float]]:
    """Host cost per all_reduce over NCCL, guard against plain ``nccl``, one process on GPU 0 (world 1).

    NCCL returns as soon as the collective is enqueued on its stream, so what the
    guard adds on the host (fingerprint, ledger, call site, its work object, the
    watchdog's polling) is not hidden behind the data's movement as it is on gloo.
    Each round times ``iters`` calls of every (size, group), in a shuffled order,
    with the GPU idle at the start (``torch.cuda.synchronize()``); returns the
    per-round figures keyed by (group, size, metric), in seconds per call."""
    import random

    import torch_ext

    torch.cuda.set_device(0)
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    groups = {
        "nccl": dist.new_group([0], backend="nccl"),
        "guard(nccl)": dist.new_group([0], backend="guard", pg_options=torch_ext.GuardOptions(inner="cuda:nccl")),
    }
    tensors = {label: torch.ones(numel, device="cuda") for label, numel in CUDA_SIZES.items()}
    for g in groups.values():  # NCCL's communicator is created by the first collective
        for t in tensors.values():
            for _ in range(max(50, iters // 4)):
                dist.all_reduce(t, group=g)
    torch.cuda.synchronize()
    out: dict[tuple[str, str, str], list[float]] = {}
    rng = random.Random(0)
    for _ in range(rounds):
        order = [(name, label) for name in groups for label in CUDA_SIZES]
        rng.shuffle(order)
        for name, label in order:
            g, t = groups[name], tensors[label]
            torch.cuda.synchronize()
            w0, m0, c0 = time.perf_counter(), time.thread_time(), time.process_time()
            for _ in range(iters):
                dist.all_reduce(t, group=g)
            w1, m1, c1 = time.perf_counter(), time.thread_time(), time.process_time()
            torch.cuda.synchronize()
            w2 = time.perf_counter()
            for metric, value in (("issue", w1 - w0), ("main", m1 - m0), ("cpu", c1 - c0), ("done", w2 - w0)):
                out.setdefault((name, label, metric), []).append(value / iters)
    dist.destroy_process_group()
    return out


def _print_cuda(res: dict[tuple[str, str, str], list[float]], rounds: int, iters: int) -> None:
    print(f"world 1, all_reduce (SUM, float32) over NCCL on GPU 0: {rounds} shuffled rounds x {iters} calls per "
          "group and size;")
    print("median [quartiles] over rounds, per call. host wall / host CPU: the calling thread's wall and CPU time "
          "to issue")
    print("a call (NCCL returns once the collective is enqueued); all threads: CPU time of the whole process;")
    print("to completion: wall time up to torch.cuda.synchronize() at the end of the round. The ratio is taken per")
    print("round, against nccl in the same round, then its median [quartiles] over rounds")
    print(f"{'size':>5} {'group':<12}" + "".join(f" {h:>24}" for h in CUDA_METRICS.values()))
    for label in CUDA_SIZES:
        for name in ("nccl", "guard(nccl)"):
            cells = []
            for metric in CUDA_METRICS:
                q1, m, q3 = _quartiles(res[(name, label, metric)])
                cells.append(f"{m * 1e6:.2f} us [{q1 * 1e6:.2f}, {q3 * 1e6:.2f}]")
            print(f"{label:>5} {name:<12}" + "".join(f" {c:>24}" for c in cells))
        cells = []
        for metric in CUDA_METRICS:
            q1, m, q3 = _quartiles([g / b for g, b in zip(res[("guard(nccl)", label, metric)],
                                                          res[("nccl", label, metric)])])
            cells.append(f"{m:.3f}x [{q1:.3f}, {q3:.3f}]")
        print(f"{label:>5} {'guard/nccl':<12}" + "".join(f" {c:>24}" for c in cells))
        q1, m, q3 = _quartiles([(g - b) * 1e6 for g, b in zip(res[("guard(nccl)", label, "issue")],
                                                             res[("nccl", label, "issue")])])
        print(f"{label:>5} guard adds {m:+.2f} us [{q1:+.2f}, {q3:+.2f}] of host wall time per collective")


def _free_port() -> int:
    s = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    port = s.port
    del s
    return port


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, nargs="+", default=None, help="worlds to measure (default 2 4)")
    ap.add_argument("--check", default="async", choices=["off", "async", "strict"])
    ap.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds per size (median taken)")
    ap.add_argument("--budget", type=float, default=0.25, help="seconds per timing round")
    ap.add_argument("--added", action="store_true",
                    help="measure only the guard's own added cost per collective at world 1 (no network)")
    ap.add_argument("--label", action="store_true",
                    help="--added: also time guard(fake) with a torch_ext.label active, in the same rounds")
    ap.add_argument("--busy-thread", action="store_true",
                    help="--added: another Python thread spins beside the loop (wall time per call); each GIL "
                         "hand-off waits for it")
    ap.add_argument("--iters", type=int, default=None,
                    help="--added: calls per group per round (default 4000); --device cuda: per group and size "
                         "(default 500)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: the host cost per collective of guard over nccl against plain nccl, 4 B and 4 MB, "
                         "world 1 on GPU 0 (needs a GPU and a CUDA build of torch)")
    args = ap.parse_args()

    names = ["gloo", "guard"]
    if args.device == "cuda":
        if args.added:
            ap.error("--added measures on CPU; --device cuda measures the host cost over NCCL: pick one")
        if args.world not in (None, [1]):
            ap.error("--device cuda measures world 1 (one process, one GPU)")
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import _cuda

        _cuda.require("--device cuda")
        os.environ["TORCH_EXT_CHECK"] = args.check
        print(f"{_cuda.banner()}, guard check={args.check}, {os.cpu_count()} CPUs")
        iters = args.iters or 500
        _print_cuda(_cuda_cost(args.rounds, iters), args.rounds, iters)
        return
    print(f"torch {torch.__version__}, guard check={args.check}, {os.cpu_count()} CPUs, gloo over loopback")
    if args.added:
        os.environ["TORCH_EXT_CHECK"] = args.check
        iters = args.iters or 4000
        _print_added(_added_cost(args.rounds, iters, args.label, args.busy_thread), args.rounds, iters,
                     args.busy_thread)
        return
    print("median latency per backend; ratio = median of the per-round guard/gloo ratios (rounds interleave")
    print("the two backends, so each ratio compares measurements taken moments apart), with its quartiles")
    print(f"{'world':>5} {'size':>6} {'gloo':>12} {'guard':>12} {'ratio':>7} {'quartiles':>15}")
    for world in args.world or [2, 4]:
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
