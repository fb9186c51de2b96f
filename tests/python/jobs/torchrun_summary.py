"""Jobs under torchrun (tests/python/test_torchrun_summary.py), at the default settings.

``mismatch``: rank 1 syncs a tensor of another size at step 3. ``fork``: each rank forks a child (as a
DataLoader does for its workers) and ends it with SIGTERM: the child dies of it, as it would without the
guard (its launcher-stop handler belongs to the process that installed it).
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import torch_ext  # noqa: F401  (registers the "guard" backend)


def _fork_and_terminate() -> None:
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    ended = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
    print(f"rank {dist.get_rank()}: forked child ended by {ended}", flush=True)


def main(mode: str) -> None:
    dist.init_process_group("guard")
    if mode == "fork":
        _fork_and_terminate()
        dist.destroy_process_group()
        return
    rank = dist.get_rank()
    x = torch.ones(4)
    for step in range(200):
        y = torch.ones(5) if mode == "mismatch" and step == 3 and rank == 1 else x
        dist.all_reduce(y)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
