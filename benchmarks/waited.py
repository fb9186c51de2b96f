"""A loop of synchronous small collectives under each check mode, against plain gloo (issue 40).

    python benchmarks/waited.py                    # worlds 2 and 4; 1, 16 and 1024 float32
    python benchmarks/waited.py --world 2 --sizes 1 --iters 1000 --rounds 7
    python benchmarks/waited.py --world 2 --sizes 1 --op max    # an early-stop flag
    python benchmarks/waited.py --world 2 --sizes 1 --after 100000  # each after a larger all_reduce
    python benchmarks/waited.py --world 2 --sizes 1 --spin-us 1000  # each after 1 ms of work on the CPU
    python benchmarks/waited.py --world 2 --sizes 1 --busy 1     # a second process busy on the machine

What a training loop does once a step, and what the default check used to pay
most for: a loss or metric ``all_reduce`` whose result is waited for at once
(``async_op=False``). Every rank creates a plain ``gloo`` group and ``guard``
groups wrapping gloo in ``verify`` (the default), ``async`` and ``strict``; a
round times ``--iters`` all_reduces on each group in turn (shuffled order,
after a barrier), and the ratio to gloo is taken per round. Prints, per world
and size, the median [quartiles] over rounds of microseconds per all_reduce and
of each mode's ratio.

Goal (issue 40): verify at most 1.10x gloo, as async. verify carries its check
inside the collective (modes/verify/InBandCheck): between two ranks a pair
exchange, among more one word beside a one-element sum, or 64 bit-words in front
of the data (docs/performance.md has the figures).
"""
from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import _modes  # noqa: E402
import _ranks  # noqa: E402

MODES = _modes.MODES


OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
SPINNER = "while True: pass  # benchmarks/waited.py --busy"


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _body(rank: int, world: int, store, sizes: list[int], iters: int, rounds: int, op: str, after: int,
          spin_us: int) -> dict:
    import torch_ext

    before = torch.ones(after)

    def all_reduces(t: torch.Tensor, group, n: int) -> None:
        for _ in range(n):
            if spin_us:  # a step's work on the CPU (the ranks share the cores with gloo's threads)
                _spin(spin_us * 1e-6)
            if after:  # as a loss sync after DDP's buckets: the pair is timed
                dist.all_reduce(before, group=group)
            dist.all_reduce(t, op=OPS[op], group=group)

    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    groups = _modes.groups()
    times = _modes.time_modes(groups, sizes, iters, rounds, all_reduces)
    be = groups["verify"]._get_backend(torch.device("cpu"))
    stats = torch_ext._C._verifier_stats(be)
    dist.destroy_process_group()
    return {"times": times, "rounds": stats["rounds"], "issued": stats["issued_seq"]}


@contextlib.contextmanager
def _busy(n: int):
    """``n`` processes that keep a core busy each (a busy loop in Python) for as long as the block runs:
    the "busy machine" of issue 56's figures, where the ranks' threads compete with other work for the
    cores (on the 2-core CI kind of machine, two ranks and one spinner are three runnable processes)."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPINNER], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
                for _ in range(n)]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--world", type=int, help="one world only")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 1024], help="float32 elements")
    ap.add_argument("--iters", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--op", choices=sorted(OPS), default="sum")
    ap.add_argument("--spin-us", type=int, default=0,
                    help="before each timed all_reduce, this long a busy loop on the CPU (timed with it)")
    ap.add_argument("--after", type=int, default=0,
                    help="before each timed all_reduce, a SUM all_reduce of this many float32 (timed with it)")
    ap.add_argument("--busy", type=int, default=0,
                    help="this many more processes, each a busy loop, run beside the ranks while they are timed")
    args = ap.parse_args()
    worlds = [args.world] if args.world else args.worlds
    for world in worlds:
        with _busy(args.busy):
            res = _ranks.run(_body, world, args.sizes, args.iters, args.rounds, args.op, args.after,
                             args.spin_us)[0]
        times = res["times"]
        after = f", each after one of {args.after} float32" if args.after else ""
        after += f", each after {args.spin_us} us of CPU work" if args.spin_us else ""
        after += f", {args.busy} busy process(es) beside the ranks" if args.busy else ""
        print(f"world {world}: {args.rounds} rounds of {args.iters} synchronous {args.op.upper()} all_reduces{after} "
              f"per mode (median [quartiles] over rounds); verify's check rounds: {res['rounds']} "
              f"for {res['issued']} collectives")
        _modes.print_table(times, args.sizes, MODES)
        print(f"world {world}: CPU time per all_reduce, all threads of rank 0's process, in the same rounds (with a "
              "core busy elsewhere, the ranks' time follows what they spend)")
        _modes.print_table(times, args.sizes, MODES, kind="cpu:")


if __name__ == "__main__":
    main()
