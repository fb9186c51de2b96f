"""Multi-process test harness: real processes, gloo over loopback, a deadline on everything.

``run_ranks(fn, world_size, ...)`` starts one process per rank (forked from a
forkserver that has torch and torch_ext preloaded, so a rank starts in ~0.1 s),
connects them through a TCPStore, optionally calls ``init_process_group``, runs
``fn(rank, world_size, *args)`` and returns one :class:`RankResult` per rank: the
return value or the exception, the exit code, the rank's output, and whether it
was still running at the deadline (then it is killed). Every rank's outcome is
reported, not only the last one's.

Ranks are launched both ways users launch them (``store=``):

- ``"parent"``: the test process serves the TCPStore, as torchrun's agent does;
- ``"rank0"``: plain env:// rendezvous (SLURM srun, mpirun, Kubernetes, one
  ``python train.py`` per rank): rank 0's own process hosts the TCPStore, so a
  fault of rank 0 takes the store with it.

``launch_script`` starts real interpreters (``python SCRIPT`` per rank, either
way), for what only a real process shows: its exit path, its exit status, and
how long it takes to end by itself.
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import pickle
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch.distributed as dist

_CTX = None

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_script(args: list[str], cwd: Any, timeout: float, nproc: int | None = None, *,
               python: str = sys.executable, source_tree: bool = True, **env: str) -> subprocess.CompletedProcess:
    """Runs ``python ARGS`` (under torchrun with ``nproc`` local ranks if given) as a user would.

    The project root is on PYTHONPATH (unless ``source_tree=False``: then the
    caller's PYTHONPATH is dropped too, e.g. to run an installed wheel with
    another ``python``), one OpenMP thread per process, ``env`` added on top;
    output is captured as text and the run is killed at ``timeout``.
    """
    launcher = [] if nproc is None else [
        "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port", "0",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0"]
    full_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if source_tree:
        full_env["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    full_env.update(OMP_NUM_THREADS="1", **env)
    return subprocess.run([python, *launcher, *args], capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=cwd)


def _context():
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "torch_ext"])
    return _CTX


@dataclasses.dataclass
class RankResult:
    rank: int
    exitcode: int | None = None
    value: Any = None
    error_type: str | None = None
    error: str | None = None
    traceback: str | None = None
    log: str = ""
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.error_type is None and not self.timed_out and self.exitcode == 0

    def describe(self) -> str:
        state = "TIMED OUT" if self.timed_out else f"exit {self.exitcode}"
        head = f"--- rank {self.rank}: {state}"
        if self.error_type:
            head += f", raised {self.error_type}"
        body = self.traceback or ""
        return f"{head}\n{body}\n[output]\n{self.log[-6000:]}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world_size: int, port: int, store: str) -> dict[str, str]:
    """The variables a launcher sets for ``rank``; ``store`` as in the module docstring."""
    env = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
           "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    if store == "parent":
        # The test process serves the store; with the agent-store flag, env://
        # rendezvous (e.g. Lightning's) connects every rank to it as a client.
        env.update(TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0")
    elif store != "rank0":
        raise ValueError(f"store={store!r}: expected 'parent' or 'rank0'")
    return env


def _child(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    store_host: str,
    backend: str | None,
    pg_options: Any,
    pg_timeout: float,
    env: dict[str, str],
    args: tuple,
    kwargs: dict,
    conn: Any,
    log_path: str,
    natural_exit: bool,
) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(env)
    os.environ.update(rank_env(rank, world_size, port, store_host))
    import logging

    logging.basicConfig(level=logging.INFO, format=f"[rank{rank}] %(name)s %(levelname)s: %(message)s",
                        stream=sys.stderr, force=True)
    code = 0
    try:
        if backend is not None and store_host == "parent":
            store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                                  timeout=timedelta(seconds=60))
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                    timeout=timedelta(seconds=pg_timeout), pg_options=pg_options)
        elif backend is not None:
            # Plain env://: rank 0 creates and serves the TCPStore.
            dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=pg_timeout),
                                    pg_options=pg_options)
        value = fn(rank, world_size, *args, **kwargs)
        # Plain pickle, by value: multiprocessing's own pickler would share tensor
        # storage through file descriptors that die with this process.
        conn.send_bytes(pickle.dumps(("ok", value, None, None, None)))
        if backend is not None and dist.is_initialized():
            dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - report everything to the parent
        code = 1
        try:
            conn.send_bytes(pickle.dumps(("error", None, type(e).__name__, str(e), traceback.format_exc())))
        except Exception:  # noqa: BLE001
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    if natural_exit:
        sys.exit(code)
    os._exit(code)


class RunResults(list):
    """The per-rank results, plus the store's keys once every rank has exited
    (None when rank 0 hosted the store)."""

    store_keys: list[str] | None


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str | None = "guard",
    timeout: float = 60.0,
    pg_timeout: float = 120.0,
    env: dict[str, str] | None = None,
    pg_options: Any = None,
    natural_exit: bool = False,
    store: str = "parent",
    **kwargs: Any,
) -> RunResults:
    """Runs ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` processes.

    ``backend=None`` skips ``init_process_group`` (the store address is still in
    MASTER_ADDR/MASTER_PORT). ``store`` says who hosts the TCPStore: the test
    process (``"parent"``) or rank 0 (``"rank0"``, plain env://). Ranks still
    running after ``timeout`` seconds are killed and marked ``timed_out``.
    """
    ctx = _context()
    server = None
    if store == "parent":
        server = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False,
                               timeout=timedelta(seconds=60))
        port = server.port
    else:
        port = free_port()
    logdir = tempfile.mkdtemp(prefix="torch_ext_ranks_")
    procs, conns, logs = [], [], []
    for rank in range(world_size):
        parent, child = ctx.Pipe(duplex=False)
        log_path = os.path.join(logdir, f"rank{rank}.log")
        p = ctx.Process(
            target=_child,
            args=(fn, rank, world_size, port, store, backend, pg_options, pg_timeout, dict(env or {}), args,
                  kwargs, child, log_path, natural_exit),
            # Not daemonic, so ranks can start DataLoader workers; every rank is
            # joined or killed below.
            daemon=False,
        )
        p.start()
        child.close()
        procs.append(p)
        conns.append(parent)
        logs.append(log_path)

    results = RunResults(RankResult(rank=r) for r in range(world_size))
    deadline = time.monotonic() + timeout
    pending = set(range(world_size))
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        for r in list(pending):
            if conns[r].poll(0):
                _receive(conns[r], results[r])
            procs[r].join(timeout=0)
            if procs[r].exitcode is not None:
                if conns[r].poll(0):
                    _receive(conns[r], results[r])
                pending.discard(r)
        if pending:
            # Wait on the processes' sentinels rather than sleeping blindly.
            mp.connection.wait([procs[r].sentinel for r in pending] + [conns[r] for r in pending],
                               timeout=min(remaining, 0.5))
    for r in pending:
        results[r].timed_out = True
        if conns[r].poll(0):
            _receive(conns[r], results[r])
        try:
            os.kill(procs[r].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for r, p in enumerate(procs):
        p.join(timeout=10)
        results[r].exitcode = p.exitcode
        try:
            with open(logs[r], errors="replace") as f:
                results[r].log = f.read()
        except FileNotFoundError:
            results[r].log = "(no output: the rank did not start)"
    results.store_keys = server.list_keys() if server is not None else None
    del server
    return results


def _receive(conn: Any, result: RankResult) -> None:
    try:
        payload = conn.recv_bytes()
    except (EOFError, OSError):
        return  # the rank died before reporting: its exit code tells
    try:
        status, value, etype, msg, tb = pickle.loads(payload)
    except Exception as e:  # noqa: BLE001 - a result that cannot be read is a failure
        result.error_type, result.error = "HarnessError", f"cannot unpickle the rank's result: {e!r}"
        return
    if status == "ok":
        result.value = value
    else:
        result.error_type, result.error, result.traceback = etype, msg, tb


def report(results: list[RankResult]) -> str:
    return "\n".join(r.describe() for r in results)


def assert_all_ok(results: list[RankResult]) -> list[Any]:
    """Asserts every rank returned normally; returns their values in rank order."""
    bad = [r for r in results if not r.ok]
    assert not bad, "some ranks failed:\n" + report(results)
    return [r.value for r in results]


@dataclasses.dataclass
class ProcResult:
    """One real process of :func:`launch_script`."""

    rank: int
    returncode: int | None  # None: it did not end by itself before the deadline (then killed)
    output: str
    ended_at: float | None  # time.time() when it ended by itself

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
                  env: dict[str, str] | None = None, wait_for: list[int] | None = None) -> list[ProcResult]:
    """Starts ``python ARGS`` once per rank, as SLURM/mpirun/torchrun would, and lets each end by itself.

    ``store`` as in :func:`run_ranks`: ``"rank0"`` (plain env://, rank 0's process
    hosts the TCPStore) or ``"parent"`` (this process hosts it, like torchrun's
    agent). Waits until the ranks in ``wait_for`` (default: all) have ended or
    ``timeout`` passed; then kills every process still there (a stopped one
    too) and reports it as not ended. Each process has one OpenMP thread and the
    project root on PYTHONPATH.
    """
    server = None
    if store == "parent":
        server = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False,
                               timeout=timedelta(seconds=60))
        port = server.port
    else:
        port = free_port()
    logdir = tempfile.mkdtemp(prefix="torch_ext_procs_")
    procs, logs = [], []
    base = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
                **(env or {}))
    for rank in range(world_size):
        log = open(os.path.join(logdir, f"rank{rank}.log"), "w+")
        procs.append(subprocess.Popen([sys.executable, *args], env=dict(base, **rank_env(rank, world_size, port, store)),
                                      stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
        logs.append(log)
    watch = set(range(world_size) if wait_for is None else wait_for)
    ended: dict[int, float] = {}
    # Woken by each process's end (a pidfd becomes readable when it exits).
    pidfds = {os.pidfd_open(p.pid): r for r, p in enumerate(procs)}
    deadline = time.monotonic() + timeout
    try:
        while not watch <= set(ended):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready, _, _ = select.select([fd for fd, r in pidfds.items() if r not in ended], [], [], remaining)
            for fd in ready:
                r = pidfds[fd]
                if procs[r].poll() is not None:
                    ended[r] = time.time()
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
    return results
