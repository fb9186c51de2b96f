"""A rank busy past the group's timeout is waited for: busy is not hung.

    python examples/bugs/long_checkpoint.py

Rank 0 writes a checkpoint for 7 s while rank 1 waits in the next all_reduce;
abort_after (TORCH_EXT_ABORT_AFTER=4, standing for the group's timeout, 30 min
by default) is shorter. At 2 s (warn_after) rank 1 reports rank 0 busy in
save_checkpoint; at 4 s, rank 0 still progressing (its main thread runs, it
writes), the wait goes on instead of failing, up to busy_cap (4 x abort_after by
default). Both ranks finish their step. A rank that stops progressing (asleep,
blocked, SIGSTOP) still ends the wait at abort_after, as a hang.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

from _launch import launch


def save_checkpoint(path: str, seconds: float) -> None:
    # Serialising on the main thread and writing, paced: a long checkpoint to slow storage.
    end = time.monotonic() + seconds
    chunk = bytes(range(256)) * 1024
    with open(path, "wb") as f:
        while time.monotonic() < end:
            spin = time.monotonic() + 0.02
            while time.monotonic() < spin:
                pass
            f.write(chunk)
            f.flush()
            time.sleep(0.08)
    os.remove(path)


def train(rank: int, world: int) -> None:
    dist.all_reduce(torch.ones(4))
    if rank == 0:
        save_checkpoint(f"checkpoint_rank{rank}.bin", 7.0)
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)  # rank 1 waits here past abort_after
    # One write: the ranks share the terminal, and print() may write the end of line apart.
    sys.stdout.write(f"[rank{rank}] the step after the checkpoint: all_reduce gave {t.tolist()}\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    launch(train, 2, TORCH_EXT_WARN_AFTER="2", TORCH_EXT_ABORT_AFTER="4")
