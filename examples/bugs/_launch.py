"""Starts N local processes on a guarded group and lets each finish on its own.

Unlike torchrun or mp.spawn, a rank that dies does not take the others down
with it, so they can show what the guard reports about it.

Each rank is this program, forked once it has imported torch and before it
starts anything else (no thread, no store yet): a rank starts in a tenth of a
second instead of importing torch again, and ends as a program does. Its end
unwinds to the top of the program (``SystemExit``), so the interpreter's exit
runs there as for ``python train.py``: atexit hooks (the guard's exit path),
threads joined, the exit status.

Ranks are started either way clusters start them: ``store="parent"`` (this
launcher hosts the TCPStore, like torchrun's agent) or ``store="rank0"`` (plain
env://, like SLURM srun, mpirun or one ``python train.py`` per rank: rank 0's
own process hosts the TCPStore). Any example takes ``--store rank0`` or
``--store parent`` on its command line to override its default.
"""
from __future__ import annotations

import os
import select
import signal
import socket
import sys
import time
from datetime import timedelta
from typing import Callable

import torch.distributed as dist


def _child(fn: Callable[[int, int], None], rank: int, world: int, port: int, store: str, env: dict[str, str]) -> None:
    # Every example leaves its ranks' dumps in ./torch_ext_dumps (unless TORCH_EXT_DUMP_DIR says
    # otherwise), for `python -m torch_ext.diagnose torch_ext_dumps` and its --repro.
    os.environ.setdefault("TORCH_EXT_DUMP_DIR", "torch_ext_dumps")
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
    sys.exit(0)


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
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun: one of its ranks (_torchrun_rank)
        return _torchrun_rank(fn, env)
    store = _store_choice(store)
    # The store's socket is bound before the ranks are forked, and served after
    # (a TCPStore's threads must not be forked).
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    if store == "parent":
        listener.listen(128)
    else:
        listener.close()  # rank 0 binds the port itself
    print(_STORE_NOTE[store], flush=True)
    sys.stderr.flush()
    pids = []
    for r in range(world):
        pid = os.fork()
        if pid == 0:
            if store == "parent":
                listener.close()
            _child(fn, r, world, port, store, env)  # ends with SystemExit: never returns here
        pids.append(pid)
    server = None
    if store == "parent":
        # The store serves on the socket and closes it: detach() hands the descriptor over (no ResourceWarning).
        server = dist.TCPStore("127.0.0.1", port, world + 1, is_master=True, wait_for_workers=False,
                               master_listen_fd=listener.detach())
    import threading

    watcher = threading.Thread(target=while_running, args=(port,), daemon=True) if while_running else None
    if watcher is not None:
        watcher.start()
    # Wait until every rank ended, or the only ones left are frozen (SIGSTOP, as
    # an example may do on purpose): those are killed, the others are not.
    codes: dict[int, int] = {}
    fds = {os.pidfd_open(pid): r for r, pid in enumerate(pids)}  # readable once the rank has ended
    end = time.monotonic() + 120.0
    while time.monotonic() < end and any(r not in codes and not _frozen(pids[r]) for r in range(world)):
        ready, _, _ = select.select([fd for fd, r in fds.items() if r not in codes], [], [], 0.5)
        for fd in ready:
            codes[fds[fd]] = os.waitstatus_to_exitcode(os.waitpid(pids[fds[fd]], 0)[1])
    for fd in fds:
        os.close(fd)
    if watcher is not None:
        watcher.join(timeout=max(1.0, end - time.monotonic()))
    for r, pid in enumerate(pids):
        if r not in codes:
            frozen = _frozen(pid)
            os.kill(pid, signal.SIGKILL)
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            print(f"rank {r} exit code: {code} (killed by the launcher: it was "
                  f"{'frozen' if frozen else 'still running after 120 s'})")
        else:
            print(f"rank {r} exit code: {codes[r]}")
    del server


def _frozen(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def _torchrun_rank(fn: Callable[[int, int], None], env: dict[str, str]) -> None:
    """One rank of a torchrun job (``torchrun --nproc-per-node N example.py``): the rank and world are
    torchrun's, and what it raises ends it as any torchrun worker (torchrun then stops the others)."""
    os.environ.setdefault("TORCH_EXT_DUMP_DIR", "torch_ext_dumps")
    os.environ.update(env)
    import torch_ext  # noqa: F401  (registers "guard")

    dist.init_process_group("guard")
    fn(dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()
