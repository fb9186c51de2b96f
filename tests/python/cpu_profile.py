"""Where a test run's time goes: each test's wall time, the CPU of its whole process tree, and the
processes it started (issue 66; the tables in docs/testing.md, "CI time").

Enabled by ``pytest --cpu-profile FILE`` (conftest.py registers it; ``bash scripts/test.sh
--cpu-profile FILE`` passes it to both passes); each pytest process (each pytest-xdist worker)
appends one JSON line per test to FILE. ``scripts/test_profile.py FILE`` turns the lines into the
tables. An option, not an environment variable: the ranks the tests start see nothing of it
(test_verdicts_at_defaults refuses any TORCH_EXT_ variable).

- **CPU**: each worker moves itself into a cgroup-v1 ``cpuacct`` group of its own, so every process
  it starts (the forkserver's ranks, ``python script.py`` children, torchrun and its workers,
  compilers) is counted, including those that have already exited; one test runs at a time in a
  worker, so a test's CPU is the group's usage across it. Without a writable cpuacct hierarchy
  (not root, cgroup v2 only) the worker's own CPU and that of the children it reaped are taken
  instead (``"cpu_source": "rusage"``): forkserver ranks are then missing.
- **Processes**: a thread lists the group's processes every 20 ms and classifies each new one by its
  command line: ``fork`` (forked from an interpreter that imported torch: ``run_ranks``' forkserver
  children, programs of the warm interpreter, ``torch_ext/testing/_zygote.py``; the forkserver and the
  zygote themselves, one each per worker, count here too),
  ``python`` (a new interpreter: about 1.2-2.3 CPU-s to import torch alone), ``other`` (compilers,
  pip, shells). A process that lives less than 20 ms may be missed: interpreters that import torch
  and ranks live far longer.
"""
from __future__ import annotations

import json
import os
import resource
import threading
import time

import pytest

CGROUP_ROOT = "/sys/fs/cgroup/cpuacct"


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _what(cmd: str) -> str:
    """A new interpreter's program: its script's name, ``-m MODULE`` or ``-c``."""
    words = cmd.split(" ")[1:]
    while words and words[0].startswith("-") and words[0] not in ("-m", "-c"):
        words = words[1:]
    if not words:
        return os.path.basename(cmd.split(" ", 1)[0])
    if words[0] in ("-m", "-c"):
        return " ".join(words[:2]) if words[0] == "-m" else "-c"
    return os.path.basename(words[0])


def _kind(cmd: str) -> str:
    # Forked from an interpreter that has torch imported: run_ranks' forkserver, the warm
    # interpreter (torch_ext/testing/_zygote.py). A spawned multiprocessing child is a new interpreter.
    if "multiprocessing.forkserver" in cmd or "_zygote.py" in cmd:
        return "fork"
    first = os.path.basename(cmd.split(" ", 1)[0]) if cmd else ""
    return "python" if first.startswith("python") or first in ("torchrun", "pytest", "accelerate") else "other"


class CpuProfile:
    def __init__(self, out: str) -> None:
        self.out = out
        self.worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.group = None
        self.seen: dict[int, str] = {}
        self.commands: dict[int, str] = {}  # pid -> what a new interpreter ran (its script or module)
        self.lock = threading.Lock()
        try:
            group = os.path.join(CGROUP_ROOT, f"torch_ext_tests_{os.getpid()}")
            os.makedirs(group, exist_ok=True)
            with open(os.path.join(group, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            self.group = group
        except OSError:
            self.group = None
        if self.group:
            threading.Thread(target=self._watch, daemon=True, name="cpu_profile").start()

    def _usage(self) -> float:
        if self.group:
            with open(os.path.join(self.group, "cpuacct.usage")) as f:
                return int(f.read()) / 1e9
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    def _watch(self) -> None:
        me = os.getpid()
        procs = os.path.join(self.group, "cgroup.procs")
        while True:
            try:
                with open(procs) as f:
                    pids = [int(line) for line in f if line.strip()]
            except OSError:
                return
            for pid in pids:
                if pid != me and pid not in self.seen:
                    cmd = _cmdline(pid)
                    with self.lock:
                        self.seen[pid] = _kind(cmd)
                        if self.seen[pid] == "python":
                            self.commands[pid] = _what(cmd)
            time.sleep(0.02)

    def _counts(self) -> dict[str, int]:
        with self.lock:
            kinds = list(self.seen.values())
        return {k: kinds.count(k) for k in ("fork", "python", "other")}

    def _commands(self, since: set[int]) -> dict[str, int]:
        with self.lock:
            new = [c for pid, c in self.commands.items() if pid not in since]
        return {c: new.count(c) for c in sorted(set(new))}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):  # noqa: ARG002 - pytest's hook signature
        before_counts = self._counts()
        with self.lock:
            before_pids = set(self.commands)
        t0, c0 = time.monotonic(), self._usage()
        yield
        wall, cpu = time.monotonic() - t0, self._usage() - c0
        after = self._counts()
        record = {"test": item.nodeid, "worker": self.worker, "start": time.time() - wall, "wall": round(wall, 3),
                  "cpu": round(cpu, 3), "cpu_source": "cgroup" if self.group else "rusage",
                  **{k: after[k] - before_counts[k] for k in after}, "interpreters": self._commands(before_pids)}
        with open(self.out, "a") as f:
            f.write(json.dumps(record) + "\n")


def add_option(parser) -> None:
    parser.addoption("--cpu-profile", metavar="FILE", default=None,
                     help="append each test's wall time, CPU of its process tree and processes started to FILE "
                          "(JSON lines; tables: python scripts/test_profile.py FILE)")


def register(config) -> None:
    out = config.getoption("cpu_profile")
    controller = not hasattr(config, "workerinput") and config.getoption("numprocesses", None)
    if not out or controller:
        return  # off, or pytest-xdist's controller (its workers run the tests and measure them)
    config.pluginmanager.register(CpuProfile(os.path.abspath(out)), "torch_ext_cpu_profile")
