"""What a second small gloo collective costs, one after the other and overlapping (issue 40).

    python benchmarks/gloo_overlap.py              # 2 ranks, 5 rounds of 400 each
    python benchmarks/gloo_overlap.py --world 4 --rounds 7

verify's check is one more collective per waited collective, on the guard's
helper group; by default it starts when the user's collective is issued, so that
the two overlap. This times, on plain gloo groups, the user's 4-byte all_reduce
alone, the check's shapes alone (verify's 13-int64 gather, strict's 2-word MAX
all_reduce, a 5-word one), the user's then a check, one after the other, and the all_reduce overlapping a
5-word all_reduce on a second group (both issued, then both waited: what an
overlapping check does). Median [quartiles] over rounds, microseconds per call.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import _ranks  # noqa: E402


def _body(rank: int, world: int, store, iters: int, rounds: int) -> dict:
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    user, check = dist.new_group(backend="gloo"), dist.new_group(backend="gloo")
    x = torch.ones(1)
    words13, gathered = torch.zeros(13, dtype=torch.long), torch.zeros(13 * world, dtype=torch.long)
    words2, words5 = torch.zeros(2, dtype=torch.long), torch.zeros(5, dtype=torch.long)
    MAX = dist.ReduceOp.MAX

    def overlapping() -> None:
        a = dist.all_reduce(x, group=user, async_op=True)
        b = dist.all_reduce(words5, op=MAX, group=check, async_op=True)
        a.wait()
        b.wait()

    cases = {
        "all_reduce float32[1] (the user's)": lambda: dist.all_reduce(x, group=user),
        "all_gather int64[13] (verify's round)": lambda: dist.all_gather_into_tensor(gathered, words13, group=check),
        "all_reduce MAX int64[2] (strict's check)": lambda: dist.all_reduce(words2, op=MAX, group=check),
        "all_reduce MAX int64[5]": lambda: dist.all_reduce(words5, op=MAX, group=check),
        "the user's, then verify's round": lambda: (dist.all_reduce(x, group=user),
                                                    dist.all_gather_into_tensor(gathered, words13, group=check)),
        "the user's, then MAX int64[5]": lambda: (dist.all_reduce(x, group=user),
                                                  dist.all_reduce(words5, op=MAX, group=check)),
        "the user's overlapping MAX int64[5]": overlapping,
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            for _ in range(20):
                fn()
            dist.barrier(user)
            start = time.perf_counter()
            for _ in range(iters):
                fn()
            times[name].append((time.perf_counter() - start) / iters * 1e6)
    dist.destroy_process_group()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    times = _ranks.run(_body, args.world, args.iters, args.rounds)[0]
    print(f"world {args.world}, {args.rounds} rounds of {args.iters}: us per call, median [quartiles] over rounds")
    for name, values in times.items():
        q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
        print(f"  {name:42s} {statistics.median(values):7.0f} [{q[0]:.0f}, {q[2]:.0f}]")


if __name__ == "__main__":
    main()
