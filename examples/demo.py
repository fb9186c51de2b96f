"""torch_ext demo: the guard catching the classic data-parallel hangs, live.

    torchrun --nproc-per-node 4 examples/demo.py      # or: bash scripts/demo.sh

Four CPU ranks on gloo, wrapped by the ``guard`` backend. Each scene reproduces
one way real jobs hang or silently corrupt, on a fresh guarded group, and shows
what the guard makes of it. Every scene finishes in seconds; none hangs.
"""
from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

import torch_ext

# torch 2.13 renamed all_gather_into_tensor (the old name warns); older releases have only that.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

RANK = int(os.environ.get("RANK", 0))
LINE = "=" * 78


def say(text: str) -> None:
    if RANK == 0:
        print(text, flush=True)


def scene(title: str, story: str) -> None:
    dist.barrier()  # scenes do not overlap (the default group is guarded too)
    say(f"\n{LINE}\n{title}\n{story}\n{LINE}")


def report(rank_says: str) -> None:
    """Every rank says what it caught; rank 0 prints it all, in rank order.

    The lines travel as byte tensors (two all_gathers: lengths, then bytes), not
    with ``all_gather_object``, which needs numpy: torch's CPU wheel runs without it.
    """
    mine = torch.tensor(list(f"[rank {RANK}] {rank_says}".encode()), dtype=torch.uint8)
    world = dist.get_world_size()
    lengths = torch.zeros(world, dtype=torch.int64)
    all_gather_single(lengths, torch.tensor([mine.numel()]))
    width = int(lengths.max())
    padded = torch.zeros(world * width, dtype=torch.uint8)
    all_gather_single(padded, torch.cat([mine, torch.zeros(width - mine.numel(), dtype=torch.uint8)]))
    for r, n in enumerate(lengths.tolist()):
        say(bytes(padded[r * width:r * width + n].tolist()).decode())


# --- scene 1 ----------------------------------------------------------------------

def train_step(group, x):
    dist.all_reduce(x, group=group)


def rank0_only_reduce(group):
    x = torch.ones(8)
    if RANK == 0:
        dist.reduce(x, dst=0, group=group)  # the classic bug: inside `if rank == 0:`
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        train_step(group, torch.ones(8))


# --- scene 2 and 3 ----------------------------------------------------------------

def validate():
    time.sleep(3)  # a long rank-local validation


def slow_rank(group, sleeper: int):
    dist.all_reduce(torch.ones(4), group=group)
    if RANK == sleeper:
        validate()
    dist.all_reduce(torch.ones(4), group=group)


# --- scene 4 ----------------------------------------------------------------------

def uneven_epoch() -> int:
    data = range(3 + RANK)  # ranks hold 3, 4, 5, 6 batches
    steps = 0
    for _batch in torch_ext.even_batches(data):
        dist.all_reduce(torch.ones(2))  # the training step's gradient sync
        steps += 1
    return steps


def main() -> int:
    dist.init_process_group("guard")
    say(f"torch_ext {torch_ext.__version__}: {torch_ext.describe()}")

    scene("1. A rank calls a different collective",
          "rank 0 runs dist.reduce inside `if rank == 0:`; the others go on to the next all_reduce.\n"
          "Plain gloo: data silently pairs with the wrong op, or hangs. guard (default check, verify):")
    g = dist.new_group(backend="guard", group_desc="scene1", pg_options=torch_ext.GuardOptions(interval=0.1))
    try:
        rank0_only_reduce(g)
        report("no error?!")
    except torch_ext.CollectiveMismatchError as e:
        report(f"CollectiveMismatchError:\n{e}" if RANK == 0 else "CollectiveMismatchError (same report)")

    scene("2. A rank has not arrived (slow validation on rank 3)",
          "Ranks 0-2 wait in an all_reduce while rank 3 validates for 3 s. guard logs who is where\n"
          "after warn_after=1 s (reported by the lowest waiting rank), and training goes on:")
    g = dist.new_group(backend="guard", group_desc="scene2",
                       pg_options=torch_ext.GuardOptions(warn_after=1, interval=0.1))
    slow_rank(g, sleeper=3)
    report("collective completed, no error")

    scene("3. A rank never arrives in time (abort_after=1.5 s)",
          "The same hang with a deadline: every live rank gets CollectiveTimeoutError with the report,\n"
          "instead of waiting out a 30-minute timeout. Rank 2 learns it the moment it arrives:")
    g = dist.new_group(backend="guard", group_desc="scene3",
                       pg_options=torch_ext.GuardOptions(warn_after=60, abort_after=1.5, interval=0.1))
    try:
        slow_rank(g, sleeper=2)
        report("no error?!")
    except torch_ext.CollectiveTimeoutError as e:
        report(f"CollectiveTimeoutError:\n{e}" if RANK == 0 else "CollectiveTimeoutError (same report)")

    scene("4. Ranks disagree on when to stop (uneven data)",
          "Ranks hold 3, 4, 5 and 6 batches. A plain loop leaves rank 0 after 3 steps while the others\n"
          "wait in their 4th all_reduce forever. torch_ext.even_batches ends every rank at the same step:")
    report(f"stopped after {uneven_epoch()} steps")

    dist.barrier()
    say(f"\n{LINE}\nAll scenes done: every hang became a report or an error naming the ranks.\n{LINE}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
