"""Starts N benchmark ranks on this machine and collects one result per rank.

Ranks are forked from a forkserver with torch and torch_ext preloaded (so even 32
ranks start in seconds), rendezvous on a TCPStore served by this process, and
send back a picklable result. A rank that fails makes the whole run fail.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch.distributed as dist


def _child(fn: Callable[..., Any], rank: int, world: int, port: int, env: dict[str, str], args: tuple,
           conn: Any) -> None:
    os.environ.update(env)
    try:
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=120))
        value = fn(rank, world, store, *args)
        conn.send_bytes(pickle.dumps(("ok", value)))
    except BaseException:  # noqa: BLE001
        conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
    os._exit(0)


def run(fn: Callable[..., Any], world: int, *args: Any, env: dict[str, str] | None = None,
        timeout: float = 600) -> list[Any]:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch_ext"])
    server = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=120))
    conns, procs = [], []
    for rank in range(world):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(fn, rank, world, server.port, dict(env or {}), args, child))
        p.start()
        child.close()
        conns.append(parent)
        procs.append(p)
    results = []
    for rank, (conn, p) in enumerate(zip(conns, procs)):
        if not conn.poll(timeout):
            for q in procs:
                q.kill()
            raise TimeoutError(f"rank {rank} gave no result within {timeout} s")
        status, value = pickle.loads(conn.recv_bytes())
        if status != "ok":
            for q in procs:
                q.kill()
            raise RuntimeError(f"rank {rank} failed:\n{value}")
        results.append(value)
    for p in procs:
        p.join(timeout=30)
    return results
