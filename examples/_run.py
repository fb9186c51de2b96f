"""Runs an example's ``train()`` on every rank of a guarded process group.

Under torchrun (RANK set) it runs in this process; otherwise it starts
``nprocs`` local CPU processes itself. It forks where available: quick to start,
and DataLoader workers then fork too (under "spawn" every worker would start a
fresh interpreter).
"""
from __future__ import annotations

import gc
import os
import socket
from typing import Callable

import torch.distributed as dist
import torch.multiprocessing as mp


def _main(train: Callable[[], None], backend: str) -> None:
    dist.init_process_group(backend)
    try:
        train()
    finally:
        gc.collect()  # free what train() left in cycles (DDP holds the group) before the group goes
        dist.destroy_process_group()


def _worker(rank: int, world: int, port: int, train: Callable[[], None], backend: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _main(train, backend)


def run_example(train: Callable[[], None], nprocs: int = 2, backend: str = "guard") -> None:
    if "RANK" in os.environ:
        _main(train, backend)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    mp.start_processes(_worker, args=(nprocs, port, train, backend), nprocs=nprocs, start_method=method)
