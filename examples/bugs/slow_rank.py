"""A rank that has not arrived: live report after warn_after, dumps, and abort.

    python examples/bugs/slow_rank.py

Rank 2 validates alone for 8 s. After 2 s (TORCH_EXT_WARN_AFTER) the lowest
waiting rank logs who waits where and where rank 2's main thread is; every rank
writes a dump. At 5 s (TORCH_EXT_ABORT_AFTER) the collective fails on every live
rank with CollectiveTimeoutError; rank 2 learns it as soon as it arrives.
    python -m torch_ext.diagnose torch_ext_dumps --html report.html

    python examples/bugs/slow_rank.py recovers

Rank 2 validates for 3.5 s only: reported at 2 s, it arrives before the abort,
the job goes on and ends cleanly. The dumps written at warn_after are marked
recovered, then finished, and diagnose says so:
    python -m torch_ext.diagnose torch_ext_dumps
"""
import sys
import time

import torch
import torch.distributed as dist

from _launch import launch


RECOVERS = "recovers" in sys.argv[1:]


def validate() -> None:
    time.sleep(3.5 if RECOVERS else 8)


def train(rank: int, world: int) -> None:
    dist.all_reduce(torch.ones(4))
    if rank == 2:
        validate()
    dist.all_reduce(torch.ones(4))
    if RECOVERS:
        dist.all_reduce(torch.ones(4))  # training goes on
        dist.destroy_process_group()  # a clean end


if __name__ == "__main__":
    launch(train, 3, TORCH_EXT_WARN_AFTER="2", TORCH_EXT_ABORT_AFTER="5", TORCH_EXT_DUMP_DIR="torch_ext_dumps")
