"""One process per rank, a deadline on everything, every rank's outcome reported.

See :func:`run_ranks`. Ranks are forked from a forkserver that has torch and
torch_ext preloaded (a rank starts in ~0.1 s instead of importing torch again),
connected through a TCPStore hosted either by the calling process (as torchrun's
agent does) or by rank 0 (plain env://), and watched until each has reported
and exited or the deadline has passed; ranks still running then are killed.
"""
from __future__ import annotations

import dataclasses
import faulthandler
import importlib.util
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import socket
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

from torch_ext.testing import _zygote
from torch_ext.testing._gpu import GPU_RUNNER_VAR, apply_gpu_rule, gpu_shortfall

_CTX = None
# Imported once by the forkserver, so every rank starts with them loaded.
# Lightning too where it is installed: about 2 CPU-s to import, paid once here instead of in every
# rank that trains through it; what it reads from the environment at import, each rank reads again
# from its own (_zygote.settle_preloads).
PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "torch_ext"]
if importlib.util.find_spec("lightning") is not None:
    PRELOAD.append("lightning")
PRELOAD.append("torch_ext.testing._frozen")

DEVICES = ("cpu", "cuda")
STORES = ("parent", "rank0")


def _ready() -> None:
    pass


def _context():
    """The forkserver context, started and done preloading (seconds, once per process).

    The first start is waited for here, before any run's deadline starts: on a
    loaded CI machine importing torch can take longer than a short test timeout.
    """
    global _CTX
    if _CTX is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        p = ctx.Process(target=_ready)
        p.start()  # returns once the forkserver has imported PRELOAD and forked
        p.join()
        _CTX = ctx
    return _CTX


class RanksFailedError(AssertionError):
    """Some rank of :func:`run_ranks` raised, exited badly or was still running at the deadline.

    The message holds, for every rank, its exit status, its exception with the
    traceback, and the tail of its output (where the guard logs its hang reports);
    ``results`` holds the :class:`RankResult` objects. An ``AssertionError``, so
    pytest and unittest count it as a test failure.
    """

    def __init__(self, message: str, results: "RunResults") -> None:
        super().__init__(message)
        self.results = results


@dataclasses.dataclass
class RankResult:
    """What one rank did: its return value or exception, exit code, output, and whether it hit the deadline."""

    rank: int
    exitcode: int | None = None
    value: Any = None
    error_type: str | None = None
    error: str | None = None
    traceback: str | None = None
    log: str = ""
    timed_out: bool = False
    reported: bool = False

    @property
    def ok(self) -> bool:
        # Reported: a process that ended with 0 without returning from the
        # function (os._exit in user code) did not pass.
        return self.reported and self.error_type is None and not self.timed_out and self.exitcode == 0

    def status(self) -> str:
        """One line: how the rank ended."""
        if self.timed_out:
            return "still running at the deadline: killed (its stack, dumped just before, is in its output)"
        if self.error_type:
            lines = (self.error or "").strip().splitlines()
            # A multi-line report's first line ends in ":" (e.g. "... differs across
            # ranks:"); here it stands alone, pointing to the report below.
            line = lines[0].rstrip().rstrip(":") if lines else ""
            line = line if len(line) <= 160 else line[:157] + "..."
            more = ", full report below" if len(lines) > 1 else ""
            return f"raised {self.error_type}" + (f": {line}" if line else "") + f" (exit {self.exitcode}{more})"
        if self.exitcode is not None and self.exitcode < 0:
            name = signal.Signals(-self.exitcode).name if -self.exitcode in signal.valid_signals() else "?"
            return f"killed by signal {-self.exitcode} ({name}) before reporting"
        if not self.reported:
            return f"exited with {self.exitcode} before returning from the function"
        if self.exitcode != 0:
            return f"returned, then exited with {self.exitcode}"
        return "ok"

    def describe(self, output_chars: int = 6000) -> str:
        state = "TIMED OUT" if self.timed_out else f"exit {self.exitcode}"
        head = f"--- rank {self.rank}: {state}"
        if self.error_type:
            head += f", raised {self.error_type}"
        body = self.traceback or ""
        return f"{head}\n{body}\n[output]\n{self.log[-output_chars:]}"


class RunResults(list):
    """The :class:`RankResult` of every rank, in rank order.

    ``values``: the ranks' return values; ``store_keys``: the store's keys once
    every rank has exited (None when rank 0 hosted the store).
    """

    store_keys: list[str] | None = None
    title: str = "ranks"

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self)

    @property
    def values(self) -> list[Any]:
        return [r.value for r in self]


def report(results: list[RankResult], title: str | None = None) -> str:
    """Every rank's outcome: a one-line summary per rank, then each rank's traceback and output."""
    title = title or getattr(results, "title", "ranks")
    bad = [r.rank for r in results if not r.ok]
    lines = [f"{title}: {len(bad)} of {len(results)} rank(s) failed" if bad else f"{title}: every rank ok"]
    lines += [f"  rank {r.rank}: {r.status()}" for r in results]
    # Failed ranks in full; ranks that passed with a shorter output tail (they
    # may still have logged the guard's report about the others).
    lines += [r.describe(6000 if not r.ok else 2000) for r in results]
    return "\n".join(lines)


def assert_all_ok(results: list[RankResult]) -> list[Any]:
    """Raises :class:`RanksFailedError` unless every rank returned normally; returns their values in rank order."""
    if not all(r.ok for r in results):
        raise RanksFailedError(report(results), results if isinstance(results, RunResults) else RunResults(results))
    return [r.value for r in results]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lost_store_port(rank0_output: str) -> bool:
    """Under ``store="rank0"``, rank 0 ended because the store's port, chosen free by the launcher, was taken by
    another process before rank 0 could bind it (EADDRINUSE): nothing of the job ran, and a launch on another
    port is the same job."""
    return "EADDRINUSE" in rank0_output and "failed to listen" in rank0_output


def rank_env(rank: int, world_size: int, port: int, store: str) -> dict[str, str]:
    """The variables a launcher sets for ``rank``.

    ``store="parent"``: the calling process serves the TCPStore and env://
    rendezvous connects every rank to it as a client (torchrun's agent store);
    ``"rank0"``: plain env://, rank 0's process creates and serves it.
    """
    env = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
           "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    if store == "parent":
        env.update(TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0")
    elif store != "rank0":
        raise ValueError(f"store={store!r}: expected 'parent' (this process hosts the TCPStore, as torchrun's "
                         "agent does) or 'rank0' (rank 0 hosts it, plain env://)")
    return env


def guard_deadlines(timeout: float, env: dict[str, str] | None = None) -> dict[str, str]:
    """``TORCH_EXT_WARN_AFTER`` / ``TORCH_EXT_ABORT_AFTER`` / ``TORCH_EXT_BUSY_CAP`` for a run with this ``timeout``.

    A collective waiting a quarter of the run's budget (at least 2 s, at most
    10 s) is a hang in a test: the guard aborts it there, on every live rank, with
    its report, well before the ranks would be killed at ``timeout``; the report
    is logged at half that. A wait for a rank that keeps busy goes on to twice
    that (busy_cap), still within the budget. Returns nothing when any of the
    variables is already in ``env`` or this process's environment: then the
    caller has chosen, and the guard's own configuration (the one place they are
    parsed) applies as usual.
    """
    names = ("TORCH_EXT_WARN_AFTER", "TORCH_EXT_ABORT_AFTER", "TORCH_EXT_BUSY_CAP")
    if any(name in (env or {}) or name in os.environ for name in names):
        return {}
    abort = min(max(timeout / 4, 2.0), 10.0)
    return {names[0]: f"{abort / 2:g}", names[1]: f"{abort:g}", names[2]: f"{2 * abort:g}"}


def _child(fn: Callable[..., Any], rank: int, world_size: int, port: int, store_host: str, backend: str | None,
           device: str, pg_options: Any, pg_timeout: float, env: dict[str, str], args: tuple, kwargs: dict,
           conn: Any, log_path: str, natural_exit: bool, deadline: float) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(env)
    os.environ.update(rank_env(rank, world_size, port, store_host))
    _zygote.settle_preloads()  # Lightning (preloaded) reads its rank again, from this rank's environment
    # Just before the parent's deadline, every thread's stack goes to the output,
    # so a rank killed there still says where it was.
    before = deadline - time.monotonic() - 1.0
    if before > 0:
        faulthandler.dump_traceback_later(before, exit=False)
    import logging

    import torch.distributed as dist

    logging.basicConfig(level=logging.INFO, format=f"[rank{rank}] %(name)s %(levelname)s: %(message)s",
                        stream=sys.stderr, force=True)
    code = 0
    try:
        if device == "cuda":
            import torch

            torch.cuda.set_device(rank)
        if backend is not None and store_host == "parent":
            store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timedelta(seconds=60))
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
    faulthandler.cancel_dump_traceback_later()
    sys.stdout.flush()
    sys.stderr.flush()
    if natural_exit:
        sys.exit(code)
    os._exit(code)


def _check_gpus(world_size: int) -> None:
    missing = gpu_shortfall(world_size)
    if missing is None:
        return
    if os.environ.get("PYTEST_CURRENT_TEST"):
        apply_gpu_rule(world_size, f"run_ranks(device='cuda', world_size={world_size})")
    raise RuntimeError(f"run_ranks(device='cuda', world_size={world_size}) {missing}: one GPU per rank is "
                       f"needed. Use a smaller world_size or device='cpu' (gloo), or run on a machine with "
                       f"{world_size} GPUs (under pytest this is a skip, or a failure with {GPU_RUNNER_VAR}=1).")


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str | None = "guard",
    device: str = "cpu",
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    store: str = "parent",
    pg_options: Any = None,
    pg_timeout: float = 120.0,
    check: bool = True,
    natural_exit: bool = False,
    title: str | None = None,
    **kwargs: Any,
) -> RunResults:
    """Runs ``fn(rank, world_size, *args, **kwargs)`` in ``world_size`` processes, one per rank.

    Each rank gets the launcher variables (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR/PORT), ``env`` on top, and an initialised default process group
    on ``backend`` (``None``: none; the store address is still in MASTER_ADDR/PORT).

    - ``device="cuda"``: rank r uses GPU r (``torch.cuda.set_device``); fewer GPUs
      than ranks is a ``RuntimeError``, or under pytest a skip (a failure on a GPU
      runner, ``TORCH_EXT_GPU_RUNNER=1``).
    - ``timeout``: seconds for the whole run. Ranks still running then are killed
      (each dumps its stacks a second before). Unless set in ``env`` or the
      environment, the guard's ``warn_after``/``abort_after`` derive from it
      (:func:`guard_deadlines`), so a hung collective fails with the guard's
      report first.
    - ``store``: ``"parent"`` (this process hosts the TCPStore, like torchrun's
      agent) or ``"rank0"`` (plain env://: rank 0's process hosts it).
    - ``check``: raise :class:`RanksFailedError`, holding every rank's exit status,
      exception and output, unless every rank returned normally.

    ``fn`` and its arguments are pickled: ``fn`` must be importable (a module-level
    function). Return values come back by pickle too. Returns a :class:`RunResults`
    (``.values`` for the return values).
    """
    if device not in DEVICES:
        raise ValueError(f"device={device!r}: expected one of {DEVICES}")
    if store not in STORES:
        rank_env(0, 1, 0, store)  # raises, naming the accepted values
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: expected at least 1")
    if device == "cuda":
        _check_gpus(world_size)
    env = dict(env or {})
    if backend is not None:
        env = {**guard_deadlines(timeout, env), **env}
    title = title or f"run_ranks({getattr(fn, '__qualname__', fn)!s}, world_size={world_size}, " \
                     f"backend={backend!r}, device={device!r}, store={store!r}, timeout={timeout:g} s)"
    _context()  # the forkserver's first start (seconds on a loaded machine) is not the ranks' time
    deadline = time.monotonic() + timeout
    for _ in range(3):
        results, port_lost = _run_once(fn, world_size, args, kwargs, backend, device, deadline, env, store,
                                       pg_options, pg_timeout, natural_exit, title)
        if not port_lost:
            break
    if check and not results.ok:
        raise RanksFailedError(report(results), results)
    return results


def _run_once(fn: Callable[..., Any], world_size: int, args: tuple, kwargs: dict[str, Any], backend: str | None,
              device: str, deadline: float, env: dict[str, str], store: str, pg_options: Any, pg_timeout: float,
              natural_exit: bool, title: str) -> tuple[RunResults, bool]:
    """One launch of :func:`run_ranks`; also says whether rank 0 lost its store's port to another process
    (then the other ranks are not waited for: they joined no job)."""
    import torch.distributed as dist

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
            args=(fn, rank, world_size, port, store, backend, device, pg_options, pg_timeout, env, args, kwargs,
                  child, log_path, natural_exit, deadline),
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
    results.title = title
    pending = set(range(world_size))
    port_lost = False
    while pending and not port_lost:
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
        port_lost = store == "rank0" and lost_store_port(results[0].error or "")
        if pending and not port_lost:
            # Woken by a rank's result or its exit, not by a blind sleep.
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
        conns[r].close()
        try:
            with open(logs[r], errors="replace") as f:
                results[r].log = f.read()
        except FileNotFoundError:
            results[r].log = "(no output: the rank did not start)"
    results.store_keys = server.list_keys() if server is not None else None
    del server
    return results, port_lost


def _receive(conn: Any, result: RankResult) -> None:
    try:
        payload = conn.recv_bytes()
    except (EOFError, OSError):
        return  # the rank died before reporting: its exit code tells
    result.reported = True
    try:
        status, value, etype, msg, tb = pickle.loads(payload)
    except Exception as e:  # noqa: BLE001 - a result that cannot be read is a failure
        result.error_type = "ResultNotReadable"
        result.error = f"cannot unpickle the rank's return value: {e!r}; return something picklable"
        return
    if status == "ok":
        result.value = value
    else:
        result.error_type, result.error, result.traceback = etype, msg, tb
