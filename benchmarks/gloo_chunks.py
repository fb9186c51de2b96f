"""What plain gloo's ring all_reduce pays for: the chunks that hold data, not the bytes (issue 70).

    python benchmarks/gloo_chunks.py                      # world 3, float32 of 1 to 16 elements
    python benchmarks/gloo_chunks.py --world 4 --sizes 1 2 3 8 9

gloo (gloo/allreduce.cc) cuts a buffer of n elements into 2W segments of ceil(n / 2W), two to a
chunk, and reduces each chunk along the ring. Prints, per element count, the chunks that hold
data and plain gloo's microseconds per synchronous SUM all_reduce (median [quartiles] over
rounds, sizes interleaved): the figure behind where RingCarry puts the check words
(modes/verify/RingCarry.h) and what one more element beside a one-element loss costs.
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


def chunks(n: int, world: int) -> int:
    per_chunk = 2 * -(-n // (2 * world))
    return -(-n // per_chunk)


def _body(rank: int, world: int, store, sizes: list[int], iters: int, rounds: int) -> dict:
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    rng = random.Random(7)  # the same order on every rank
    times: dict[int, list[float]] = {n: [] for n in sizes}
    tensors = {n: torch.ones(n) for n in sizes}
    for n in sizes:
        for _ in range(50):
            dist.all_reduce(tensors[n])
    for _ in range(rounds):
        order = list(sizes)
        rng.shuffle(order)
        for n in order:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(tensors[n])
            times[n].append((time.perf_counter() - t0) / iters * 1e6)
    dist.destroy_process_group()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=3)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 3, 4, 6, 7, 12, 16])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    times = _ranks.run(_body, args.world, args.sizes, args.iters, args.rounds)[0]
    print(f"world {args.world}: plain gloo, synchronous float32 SUM all_reduce, {args.rounds} rounds of "
          f"{args.iters} per size (interleaved)")
    print(f"  {'elements':>8} | {'chunks':>6} | {'us per all_reduce':>24}")
    for n in args.sizes:
        med, lo, hi = _modes.median_quartiles(times[n])
        print(f"  {n:>8} | {chunks(n, args.world):>6} | {med:9.0f} us [{lo:.0f}, {hi:.0f}]")


if __name__ == "__main__":
    main()
