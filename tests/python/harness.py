"""The project's test harness: torch_ext.testing, plus what only this checkout needs.

The machinery (one process per rank from a forkserver with torch preloaded, a
deadline on everything, every rank's outcome reported, ranks killed at the
deadline, the store hosted by the test process or by rank 0, real interpreters
per rank) is the public :mod:`torch_ext.testing`, which users' suites use too.
This module keeps the names the tests import, with the same behaviour:

- ``run_ranks`` returns every rank's :class:`RankResult` without raising
  (``check=False``): tests look at failures themselves, or call
  ``assert_all_ok`` (which raises :class:`RanksFailedError` with every rank's
  report);
- ``launch_script`` and ``run_script`` run with the project root on PYTHONPATH
  and as the working directory.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from typing import Any

from torch_ext.testing import (  # noqa: F401 - re-exported for the tests
    ProcResult,
    RankResult,
    RanksFailedError,
    RunResults,
    _warm,
    assert_all_ok,
    free_port,
    rank_env,
    report,
)
from torch_ext.testing import launch_script as _launch_script
from torch_ext.testing import run_ranks as _run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def needs(*packages: str, module: bool = False) -> None:
    """Skips the calling test (``module=True``: the whole module) unless ``packages`` are installed.

    Unlike ``pytest.importorskip`` it imports nothing: Lightning costs about 3 CPU-s to import,
    and a module that imports it when collected makes every pytest-xdist worker pay that, the
    workers whose tests never use it too (issue 66). The tests' programs import what they use.
    """
    import importlib.util

    import pytest

    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (pip install {' '.join(missing)})", allow_module_level=module)


def run_script(args: list[str], cwd: Any, timeout: float, nproc: int | None = None, *,
               python: str = sys.executable, source_tree: bool = True, fresh: bool = False,
               **env: str) -> subprocess.CompletedProcess:
    """Runs ``python ARGS`` (under torchrun with ``nproc`` local ranks if given) as a user would.

    The project root is on PYTHONPATH (unless ``source_tree=False``: then the
    caller's PYTHONPATH is dropped too, e.g. to run an installed wheel with
    another ``python``), one OpenMP thread per process, ``env`` added on top;
    output is captured as text and the run is killed at ``timeout``. The
    program (under torchrun: the agent, and its workers through torchrun's own
    ``PYTHON_EXEC``) is forked from a warm interpreter (torch_ext.testing._warm)
    unless ``fresh`` or another ``python`` is asked for; what a program starts with
    ``sys.executable`` itself (Lightning's launcher's ranks) are new interpreters.
    """
    launcher = [] if nproc is None else [
        "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port", "0",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0"]
    full_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if source_tree:
        full_env["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    full_env.update(OMP_NUM_THREADS="1", **env)
    if fresh or python != sys.executable:
        return subprocess.run([python, *launcher, *args], capture_output=True, text=True, timeout=timeout,
                              env=full_env, cwd=cwd)
    _warm.start(full_env, [*launcher, *args], cwd)  # outside the timeout: the first start imports torch
    if launcher:  # torchrun starts each worker as PYTHON_EXEC ARGS: a warm python (its own preloads)
        full_env.setdefault("PYTHON_EXEC", _warm.shim(full_env, args, cwd))
    # Without a launcher, the program's own `sys.executable ARGS` starts (Lightning's launcher's ranks) are
    # warm too: sys.executable is the zygote's shim there.
    return _warm.run([*launcher, *args], env=full_env, cwd=cwd, timeout=timeout, warm_executable=not launcher)


def run_ranks(fn, world_size: int, *args: Any, **options: Any) -> RunResults:
    """:func:`torch_ext.testing.run_ranks` returning every rank's result instead of raising (``check=False``)."""
    options.setdefault("check", False)
    return _run_ranks(fn, world_size, *args, **options)


def launch_script(args: list[str], world_size: int, *, store: str = "rank0", timeout: float = 60.0,
                  env: dict[str, str] | None = None, wait_for: list[int] | None = None,
                  fresh: bool = False) -> list[ProcResult]:
    """:func:`torch_ext.testing.launch_script` from the project root, with it on PYTHONPATH."""
    env = {"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    return _launch_script(args, world_size, store=store, timeout=timeout, env=env, wait_for=wait_for, cwd=ROOT,
                          fresh=fresh)


class LogRecords(logging.Handler):
    """Collects the torch_ext logger's records as (arrival time, level, message)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[float, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((time.monotonic(), record.levelname, record.getMessage()))


def capture_logs() -> LogRecords:
    """Starts collecting the torch_ext logger's records in this process (a rank)."""
    h = LogRecords()
    logging.getLogger("torch_ext").addHandler(h)
    return h
