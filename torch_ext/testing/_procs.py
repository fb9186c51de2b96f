"""Real programs per rank (``python SCRIPT``), for what only a real process shows:
its exit path, its exit status, and how long it takes to end by itself."""
from __future__ import annotations

import dataclasses
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any

from torch_ext.testing import _warm
from torch_ext.testing._ranks import free_port, lost_store_port, rank_env


@dataclasses.dataclass
class ProcResult:
    """One real process of :func:`launch_script`."""

    rank: int
    returncode: int | None  # None: it did not end by itself before the deadline (then killed)
    output: str
    ended_at: float | None  # time.time() when it ended by itself

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def describe(self) -> str:
        if self.returncode is None:
            state = "DID NOT END (killed at the deadline)"
        elif self.returncode < 0:
            state = f"exit {self.returncode} (killed by {signal.Signals(-self.returncode).name})"
        else:
            state = f"exit {self.returncode}"
        # c10d's warnings carry a C++ backtrace of ~20 "frame #N:" lines each:
        # drop them, so a failure's log shows every rank's own lines.
        lines = self.output.splitlines()
        kept = [line for line in lines if not _BACKTRACE_FRAME.match(line)]
        dropped = f"({len(lines) - len(kept)} C++ backtrace frame lines left out)\n" if len(kept) < len(lines) else ""
        return f"--- rank {self.rank}: {state}\n{dropped}" + "\n".join(kept)[-6000:]


_BACKTRACE_FRAME = re.compile(r"^frame #\d+: ")


def launch_script(args: list[str], world_size: int, *, store: str = "rank0", timeout: float = 60.0,
                  env: dict[str, str] | None = None, wait_for: list[int] | None = None,
                  cwd: Any = None, fresh: bool = False) -> list[ProcResult]:
    """Starts ``python ARGS`` once per rank, as SLURM/mpirun/torchrun would, and lets each end by itself.

    ``store``: ``"rank0"`` (plain env://, rank 0's process hosts the TCPStore) or
    ``"parent"`` (this process hosts it, like torchrun's agent). Waits until the
    ranks in ``wait_for`` (default: all) have ended or ``timeout`` passed; then
    kills every process still there (a stopped one too) and reports it as not
    ended. Each process gets one OpenMP thread and ``env`` on top of this
    process's environment, and runs in ``cwd``.

    With ``store="rank0"`` the port is chosen free here and bound by rank 0
    later; another process can take it in between (EADDRINUSE, seen under load
    on a busy CI machine). Rank 0 then ends at once and the others would wait
    for a store that never comes, so the job is started again on a new port, up
    to three times, within the same ``timeout``.

    Each rank is a program of its own, whose exit is an interpreter's exit (atexit
    hooks, threads joined, finalisation, its exit status), forked from a warm
    interpreter that has imported torch once (``_warm.py``: about 0.1 s a rank
    instead of 1-2 CPU-s); ``fresh=True`` starts a new interpreter per rank
    instead, for what depends on the interpreter's own start-up.
    """
    if not fresh:
        _warm.start(_environment(env), args, cwd)  # outside the deadline: the first start imports torch
    deadline = time.monotonic() + timeout
    for _ in range(3):
        results, port_lost = _launch_once(args, world_size, store, deadline, env, wait_for, cwd, fresh)
        if not port_lost:
            break
    return results


def _environment(env: dict[str, str] | None) -> dict[str, str]:
    """Every rank's environment but its launcher variables: this process's, one OpenMP thread, ``env``."""
    return dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))


def _launch_once(args: list[str], world_size: int, store: str, deadline: float, env: dict[str, str] | None,
                 wait_for: list[int] | None, cwd: Any, fresh: bool) -> tuple[list[ProcResult], bool]:
    """One launch of :func:`launch_script`; also says whether rank 0 lost its store's port to another process."""
    import torch.distributed as dist

    server = None
    if store == "parent":
        server = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False,
                               timeout=timedelta(seconds=60))
        port = server.port
    else:
        port = free_port()
    logdir = tempfile.mkdtemp(prefix="torch_ext_procs_")
    procs, logs = [], []
    base = _environment(env)
    for rank in range(world_size):
        log = open(os.path.join(logdir, f"rank{rank}.log"), "w+")
        renv = dict(base, **rank_env(rank, world_size, port, store))
        if fresh:
            procs.append(subprocess.Popen([sys.executable, *args], env=renv, stdout=log, stderr=subprocess.STDOUT,
                                          cwd=cwd))
        else:
            procs.append(_warm.popen(args, env=renv, stdout=log, stderr=subprocess.STDOUT, cwd=cwd))
        logs.append(log)
    watch = set(range(world_size) if wait_for is None else wait_for)
    ended: dict[int, float] = {}
    port_lost = False

    def end(r: int) -> None:
        nonlocal port_lost
        ended[r] = time.time()
        if r == 0 and store == "rank0":
            logs[0].seek(0)
            port_lost = lost_store_port(logs[0].read())

    # Woken by each process's end (a pidfd becomes readable when it exits).
    pidfds = {}
    for r, p in enumerate(procs):
        try:
            pidfds[os.pidfd_open(p.pid)] = r
        except ProcessLookupError:  # ended and reaped by the warm interpreter already (a CI run)
            p.wait(timeout=30)
            end(r)
    try:
        while not watch <= set(ended) and not port_lost:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready, _, _ = select.select([fd for fd, r in pidfds.items() if r not in ended], [], [], remaining)
            for fd in ready:
                r = pidfds[fd]
                if procs[r].poll() is not None:
                    end(r)
    finally:
        for fd in pidfds:
            os.close(fd)
    results = []
    for r, p in enumerate(procs):
        if r not in ended and p.poll() is not None:
            ended[r] = time.time()
        if r not in ended:
            try:
                p.send_signal(signal.SIGCONT)
                p.kill()
            except ProcessLookupError:
                pass
        p.wait(timeout=30)
        logs[r].seek(0)
        results.append(ProcResult(r, p.returncode if r in ended else None, logs[r].read(), ended.get(r)))
        logs[r].close()
    del server
    return results, port_lost
