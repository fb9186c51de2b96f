"""A rank that has not arrived: live report after warn_after, dumps, and abort.

    python examples/bugs/slow_rank.py

Rank 2 validates alone for 8 s. After 2 s (TORCH_EXT_WARN_AFTER) the lowest
waiting rank logs who waits where and where rank 2's main thread is; every rank
writes a dump. At 5 s (TORCH_EXT_ABORT_AFTER) the collective fails on every live
rank with CollectiveTimeoutError; rank 2 learns it as soon as it arrives.
    python -m torch_ext.diagnose torch_ext_dumps --html report.html
"""
import time

import torch
import torch.distributed as dist

from _launch import launch


def validate() -> None:
    time.sleep(8)


def train(rank: int, world: int) -> None:
    dist.all_reduce(torch.ones(4))
    if rank == 2:
        validate()
    dist.all_reduce(torch.ones(4))


if __name__ == "__main__":
    launch(train, 3, TORCH_EXT_WARN_AFTER="2", TORCH_EXT_ABORT_AFTER="5", TORCH_EXT_DUMP_DIR="torch_ext_dumps")
