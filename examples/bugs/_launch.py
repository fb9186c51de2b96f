"""Starts N local processes on a guarded group and lets each finish on its own.

Unlike torchrun or mp.spawn, a rank that dies does not take the others down
with it, so they can show what the guard reports about it.

Ranks are started either way clusters start them: ``store="parent"`` (this
launcher hosts the TCPStore, like torchrun's agent) or ``store="rank0"`` (plain
env://, like SLURM srun, mpirun or one ``python train.py`` per rank: rank 0's
own process hosts the TCPStore). Any example takes ``--store rank0`` or
``--store parent`` on its command line to override its default.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
import time
from datetime import timedelta
from typing import Callable

import torch.distributed as dist


def _child(fn: Callable[[int, int], None], rank: int, world: int, port: int, store: str, env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # No logging set-up: torch_ext labels its own lines ("[rank0] 12:01:07 torch_ext WARNING: ...").
    import torch_ext  # noqa: F401  (registers "guard")

    if store == "parent":
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        tcp = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=60))
        dist.init_process_group("guard", store=tcp, rank=rank, world_size=world)
    else:
        dist.init_process_group("guard")  # env://: rank 0 creates and serves the store
    try:
        fn(rank, world)
    except Exception as e:  # noqa: BLE001 - show what each rank got
        # One write: the ranks share the terminal, and print() may write the end of line apart.
        note = torch_ext.explain(e)  # what the guard knows about an error torch raised (DDP's), or ""
        sys.stdout.write(f"[rank{rank}] raised {type(e).__name__}:\n{e}\n" + (note + "\n" if note else ""))
        sys.stdout.flush()
        sys.exit(1)


_STORE_NOTE = {
    "parent": "launcher: the rendezvous store (a TCPStore) runs in this launcher process, as under torchrun; "
              "it stays up when a rank dies",
    "rank0": "launcher: the rendezvous store (a TCPStore) runs in rank 0's process, as under plain env:// "
             "(srun, mpirun); it goes down with rank 0",
}


def _store_choice(default: str) -> str:
    if "--store" in sys.argv:
        choice = sys.argv[sys.argv.index("--store") + 1]
        if choice not in ("parent", "rank0"):
            raise SystemExit(f"--store {choice}: expected 'parent' (the launcher hosts the store) or 'rank0'")
        return choice
    return default


def launch(fn: Callable[[int, int], None], world: int, store: str = "parent",
           while_running: Callable[[int], None] | None = None, **env: str) -> None:
    """Runs ``fn(rank, world)`` in ``world`` processes; ``while_running(port)``, if given, runs meanwhile in this
    launcher (on a thread of its own, with the store's port), as another terminal would."""
    import threading

    store = _store_choice(store)
    ctx = mp.get_context("spawn")
    server = None
    if store == "parent":
        server = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False)
        port = server.port
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    print(_STORE_NOTE[store], flush=True)
    procs = [ctx.Process(target=_child, args=(fn, r, world, port, store, env)) for r in range(world)]
    for p in procs:
        p.start()
    watcher = threading.Thread(target=while_running, args=(port,), daemon=True) if while_running else None
    if watcher is not None:
        watcher.start()
    # Wait until every rank ended, or the only ones left are frozen (SIGSTOP,
    # as an example may do on purpose): those are killed, the others are not.
    # The deadline is wall time: a rank whose sentinel is ready but which the
    # kernel has not reaped yet (a process still exiting) makes wait() return at
    # once, so counting iterations would run it out in a blink.
    end = time.monotonic() + 120.0
    while time.monotonic() < end and any(p.exitcode is None and not _frozen(p.pid) for p in procs):
        ready = mp.connection.wait([p.sentinel for p in procs if p.exitcode is None], timeout=0.5)
        for p in procs:
            if p.sentinel in ready:
                p.join(timeout=5)  # ended: reap it
    if watcher is not None:
        watcher.join(timeout=max(1.0, end - time.monotonic()))
    for r, p in enumerate(procs):
        if p.exitcode is None:
            p.kill()
            p.join()
            print(f"rank {r} exit code: {p.exitcode} (killed by the launcher: it was "
                  f"{'frozen' if time.monotonic() < end else 'still running after 120 s'})")
        else:
            print(f"rank {r} exit code: {p.exitcode}")


def _frozen(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False
