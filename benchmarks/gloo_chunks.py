"""What plain gloo's ring all_reduce pays for: the chunks that hold data, not the bytes (issue 70).

    python benchmarks/gloo_chunks.py                      # world 3, float32 of 1 to 16 elements
    python benchmarks/gloo_chunks.py --world 4 --sizes 1 2 3 8 9
    python benchmarks/gloo_chunks.py --world 3 --one-element   # the shapes a one-element sync can take

gloo (gloo/allreduce.cc) cuts a buffer of n elements into 2W segments of ceil(n / 2W), two to a
chunk, and reduces each chunk along the ring. Prints, per element count, the chunks that hold
data and plain gloo's microseconds per synchronous SUM all_reduce (median [quartiles] over
rounds, sizes interleaved): the figure behind where RingCarry puts the check words
(modes/verify/RingCarry.h) and what one more element beside a one-element loss costs.

``--one-element``: instead, the shapes in which a one-element sync with its check can reach plain
gloo, each against the user's own float32[1] SUM in the same round: two int64 words summed (a
count's or a loss's carry) or taken by MAX (KeyedPick's flag), and one int64 word per rank
gathered (all_gather_into_tensor: every rank would fold the elements itself, in gloo's order).
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


ONE_ELEMENT = ("float32[1] SUM", "int64[2] SUM", "int64[2] MAX", "gather int64[1] a rank")


def _calls(world: int, sizes: list[int], one_element: bool) -> dict:
    if not one_element:
        return {n: (lambda t=torch.ones(n): dist.all_reduce(t)) for n in sizes}
    words, word, gathered = torch.ones(2, dtype=torch.int64), torch.ones(1, dtype=torch.int64), \
        torch.zeros(world, dtype=torch.int64)
    return dict(zip(ONE_ELEMENT, (lambda t=torch.ones(1): dist.all_reduce(t),
                                  lambda: dist.all_reduce(words),
                                  lambda: dist.all_reduce(words, op=dist.ReduceOp.MAX),
                                  lambda: dist.all_gather_into_tensor(gathered, word))))


def _body(rank: int, world: int, store, sizes: list[int], iters: int, rounds: int, one_element: bool) -> dict:
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    rng = random.Random(7)  # the same order on every rank
    calls = _calls(world, sizes, one_element)
    times: dict = {n: [] for n in calls}
    for call in calls.values():
        for _ in range(50):
            call()
    for _ in range(rounds):
        order = list(calls)
        rng.shuffle(order)
        for n in order:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                calls[n]()
            times[n].append((time.perf_counter() - t0) / iters * 1e6)
    dist.destroy_process_group()
    return times


def _print_one_element(times: dict, args) -> None:
    print(f"world {args.world}: plain gloo, the shapes of a one-element sync, synchronous, {args.rounds} rounds "
          f"of {args.iters} each (interleaved); ratio to float32[1] SUM in the same round")
    base = times[ONE_ELEMENT[0]]
    for name in ONE_ELEMENT:
        med, lo, hi = _modes.median_quartiles(times[name])
        r = _modes.median_quartiles([t / b for t, b in zip(times[name], base)])
        print(f"  {name:>22} | {med:9.0f} us [{lo:.0f}, {hi:.0f}] | {r[0]:.2f}x [{r[1]:.2f}, {r[2]:.2f}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=3)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 3, 4, 6, 7, 12, 16])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--one-element", action="store_true", help="the shapes of a one-element sync and its check")
    args = ap.parse_args()
    times = _ranks.run(_body, args.world, args.sizes, args.iters, args.rounds, args.one_element)[0]
    if args.one_element:
        return _print_one_element(times, args)
    print(f"world {args.world}: plain gloo, synchronous float32 SUM all_reduce, {args.rounds} rounds of "
          f"{args.iters} per size (interleaved)")
    print(f"  {'elements':>8} | {'chunks':>6} | {'us per all_reduce':>24}")
    for n in args.sizes:
        med, lo, hi = _modes.median_quartiles(times[n])
        print(f"  {n:>8} | {chunks(n, args.world):>6} | {med:9.0f} us [{lo:.0f}, {hi:.0f}]")


if __name__ == "__main__":
    main()
