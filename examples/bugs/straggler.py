"""A straggler: nothing hangs, but every step waits for one slow rank.

    python examples/bugs/straggler.py

Four CPU ranks train 40 steps (a gradient all_reduce each); rank 2's data loader
takes 10 ms longer per batch than the others' (30 ms instead of 20). Each rank
writes its dump at the end (torch_ext.dump()), and diagnose names the rank the
others waited for, how long per collective, and where:

    python -m torch_ext.diagnose torch_ext_dumps --trace trace.json

(trace.json: each rank's wait in each collective as a "wait (ms)" counter track.)
"""
import time

import torch
import torch.distributed as dist

import torch_ext
from _launch import launch

STEPS = 40


def load_batch(rank: int) -> torch.Tensor:
    time.sleep(0.03 if rank == 2 else 0.02)  # rank 2 reads from a slower disk
    return torch.ones(64)


def train(rank: int, world: int) -> None:
    for _ in range(STEPS):
        grads = load_batch(rank)
        dist.all_reduce(grads)
    torch_ext.dump()  # into TORCH_EXT_DUMP_DIR


if __name__ == "__main__":
    launch(train, 4, TORCH_EXT_DUMP_DIR="torch_ext_dumps")
