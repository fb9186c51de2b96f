"""Starts N local processes on a guarded group and lets each finish on its own.

Unlike torchrun or mp.spawn, a rank that dies does not take the others down
with it, so they can show what the guard reports about it.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
from datetime import timedelta
from typing import Callable

import torch.distributed as dist


def _child(fn: Callable[[int, int], None], rank: int, world: int, port: int, env: dict[str, str]) -> None:
    os.environ.update(env)
    import logging

    logging.basicConfig(level=logging.INFO, format=f"[rank{rank}] %(name)s %(levelname)s: %(message)s")
    import torch_ext  # noqa: F401  (registers "guard")

    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("guard", store=store, rank=rank, world_size=world)
    try:
        fn(rank, world)
    except Exception as e:  # noqa: BLE001 - show what each rank got
        print(f"[rank{rank}] raised {type(e).__name__}:\n{e}", flush=True)
        sys.exit(1)


def launch(fn: Callable[[int, int], None], world: int, **env: str) -> None:
    ctx = mp.get_context("spawn")
    server = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False)
    procs = [ctx.Process(target=_child, args=(fn, r, world, server.port, env)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    for r, p in enumerate(procs):
        print(f"rank {r} exit code: {p.exitcode}")
