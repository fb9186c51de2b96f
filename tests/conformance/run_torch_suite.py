#!/usr/bin/env python
"""Runs PyTorch's own distributed test suite (shipped in the torch wheel) on a backend.

The suite is ``torch.testing._internal.distributed.distributed_test``: the class
``DistributedTest._DistTestBase`` holds the tests, ``TestDistBackend`` spawns one
process per rank, and both read their configuration from environment variables
(``BACKEND``, ``WORLD_SIZE``, ``TEMP_DIR``, ``INIT_METHOD``) at import time. This
runner builds the test class the way PyTorch's ``test/distributed/test_distributed_spawn.py``
does (mixin of the two, spawn start method), with ``BACKEND=guard`` (after
``import torch_ext``) or ``BACKEND=gloo`` as the baseline, runs the selected tests
with unittest and writes one JSON result::

    {"meta": {...}, "results": {"test_name": {"status": "passed" | "skipped" | "failed",
                                               "reason": "...", "seconds": 1.2}}}

Examples (from the repository root, after building the extension in place)::

    PYTHONPATH=$PWD python tests/conformance/run_torch_suite.py --backend guard \
        --out build/conformance/guard.json
    PYTHONPATH=$PWD python tests/conformance/run_torch_suite.py --backend gloo \
        --shard 1/4 --out build/conformance/gloo.json --resume
    PYTHONPATH=$PWD python tests/conformance/run_torch_suite.py --backend guard -k all_reduce -k barrier

Profiles (``--profile``):

``declared`` (default)
    Before the suite is imported, ``guard`` is added to every capability set of
    ``common_distributed.DistTestCases`` that lists ``gloo`` (``ddp``, ``subgroup``,
    ``gpu``, ``cuda``) and to ``backend_feature["plugin"]``. Those tables are the
    suite's own declaration of what a backend supports, read by its skip
    decorators; declaring guard like gloo is the substitution the suite allows.
    Tests that compare ``BACKEND`` or ``dist.get_backend()`` with the literal
    ``"gloo"`` still take their non-gloo branch.
``as-is``
    Only ``BACKEND`` changes: shows what the suite does with a backend it does not know.

Both profiles leave the suite's code untouched. The runner adds only bookkeeping
in the child processes: each rank's stdout/stderr goes to
``<log-dir>/<test>/rank<N>.log`` and the reason of a skip raised inside a rank
(which the suite reports to the parent only as "skipped at subprocess level") is
saved next to it.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import os
import platform
import re
import sys
import tempfile
import time
import traceback
import unittest

# ---------------------------------------------------------------------------
# Configuration travels to the spawned ranks through the environment: they
# re-import this file as __mp_main__ and must build the same test class.
_ENV_PROFILE = "TORCH_EXT_CONF_PROFILE"
_ENV_LOG_DIR = "TORCH_EXT_CONF_LOG_DIR"
_ENV_IMPORT_EXT = "TORCH_EXT_CONF_IMPORT_EXT"
# The class name depends on INIT_METHOD, which TestDistBackend.setUp rewrites
# (to a file:// URL) before it spawns the ranks: fix the name once, in the parent.
_ENV_CLASS = "TORCH_EXT_CONF_CLASS"
# How the ranks start: "spawn" (PyTorch's test_distributed_spawn.py), or "fork"
# (from this process, the suite already imported: about 5 s of CPU less per
# rank and test on a 2-core machine; what PyTorch's fork-mode suite did).
_ENV_START = "TORCH_EXT_CONF_START"

PROFILES = ("declared", "as-is")
SUITE_MODULE = "torch.testing._internal.distributed.distributed_test"


def _declare_backend(name: str) -> list[str]:
    """Lists ``name`` wherever the suite's capability tables list gloo."""
    from torch.testing._internal.common_distributed import DistTestCases

    changed = []
    for key, backends in DistTestCases.backend_feature.items():
        if "gloo" in backends and name not in backends:
            backends.add(name)
            changed.append(f"backend_feature[{key!r}]")
    if name not in DistTestCases.backend_feature["plugin"]:
        DistTestCases.backend_feature["plugin"].add(name)
        changed.append("backend_feature['plugin']")
    for key, backends in DistTestCases.skip_collective.items():
        if "gloo" in backends and name not in backends:
            backends.add(name)
            changed.append(f"skip_collective[{key!r}]")
    return changed


def _child_bookkeeping(test_name: str, rank: int) -> None:
    """In a spawned rank: send its output to a per-test log, remember skip reasons."""
    log_dir = os.environ.get(_ENV_LOG_DIR)
    if not log_dir:
        return
    test_dir = os.path.join(log_dir, test_name)
    os.makedirs(test_dir, exist_ok=True)
    fd = os.open(os.path.join(test_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)

    skip_path = os.path.join(test_dir, f"skip{rank}.txt")

    class _SkipReason(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "skipping test" in str(record.msg) and record.args and len(record.args) >= 3:
                with open(skip_path, "w") as f:
                    f.write(str(record.args[2]))

    logging.getLogger("torch.testing._internal.common_distributed").addHandler(_SkipReason())


def _load_suite():
    """Imports the suite (env already set) and returns the spawn-mode test class."""
    backend = os.environ["BACKEND"]
    if os.environ.get(_ENV_IMPORT_EXT) == "1":
        import torch_ext  # noqa: F401  (registers the "guard" backend)
    if os.environ.get(_ENV_PROFILE, "declared") == "declared" and backend not in ("gloo", "nccl", "ucc", "mpi"):
        _declare_backend(backend)

    import torch
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

    # Same shape as PyTorch's test/distributed/test_distributed_spawn.py.
    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            if os.environ.get(_ENV_START) == "fork":
                self._start_processes(torch.multiprocessing.get_context("fork").Process)
            else:
                self._spawn_processes()
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

        @classmethod
        def _run(cls, rank, test_name, file_name, pipe, **kwargs):
            _child_bookkeeping(test_name, rank)
            super()._run(rank, test_name, file_name, pipe, **kwargs)

    torch.backends.cuda.matmul.allow_tf32 = False
    name = os.environ.get(_ENV_CLASS)
    if not name:
        has_init_method = "NoInitFile" if os.environ.get("INIT_METHOD", "env://") == "env://" else ""
        name = f"TestDistBackendWithSpawn{backend.upper()}{has_init_method}"
        os.environ[_ENV_CLASS] = name
    TestDistBackendWithSpawn.__name__ = name
    TestDistBackendWithSpawn.__qualname__ = name
    globals()[name] = TestDistBackendWithSpawn
    return TestDistBackendWithSpawn


if __name__ == "__mp_main__":
    # A spawned rank: rebuild the class its parent pickled by reference.
    _load_suite()


# ---------------------------------------------------------------------------
# Parent side: selection, running, results.


_EXC_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Timeout|Failure|Interrupt)\b")


def _first_line(text: str) -> str:
    """The most telling line of an error: the exception line of the innermost traceback.

    Failures of a rank arrive in the parent as "Process i exited with error code 10
    and exception:" followed by the rank's traceback; the suite then appends a
    "To execute this test, run ..." epilogue. The last line that starts like an
    exception ("AssertionError: ...", "torch.distributed.DistBackendError: ...")
    is the one that says what went wrong.
    """
    lines = [ln.rstrip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    exc = [ln for ln in lines if _EXC_LINE.match(ln)]
    pick = exc[-1] if exc else lines[-1]
    if pick.startswith("RuntimeError: Process ") and len(exc) == 1:
        # Only the parent's summary: the rank died without a Python traceback.
        pick = pick + " (no traceback from the rank: see its log)"
    return pick[:500]


def _skip_reason(log_dir: str | None, test_name: str, message: str) -> str:
    if log_dir:
        d = os.path.join(log_dir, test_name)
        if os.path.isdir(d):
            for f in sorted(os.listdir(d)):
                if f.startswith("skip"):
                    with open(os.path.join(d, f)) as fh:
                        return f"{message} [rank: {fh.read().strip()}]"
    return message


class JsonResult(unittest.TextTestResult):
    """Records each test's outcome and rewrites the JSON file after every test."""

    def __init__(self, *args, sink=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._sink = sink
        self._t0 = 0.0

    def _name(self, test) -> str:
        return test.id().split(".")[-1]

    def startTest(self, test):
        self._t0 = time.monotonic()
        super().startTest(test)

    def _put(self, test, status, reason="", detail=""):
        entry = {"status": status, "seconds": round(time.monotonic() - self._t0, 2)}
        if reason:
            entry["reason"] = reason
        if detail:
            entry["detail"] = detail[-6000:]
        self._sink(self._name(test), entry)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._put(test, "passed")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._put(test, "skipped", _skip_reason(os.environ.get(_ENV_LOG_DIR), self._name(test), str(reason)))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        text = "".join(traceback.format_exception(*err))
        self._put(test, "failed", _first_line(text), text)

    def addError(self, test, err):
        super().addError(test, err)
        if isinstance(err[1], unittest.SkipTest):  # raised from setUp on some paths
            self._put(test, "skipped", str(err[1]))
            return
        text = "".join(traceback.format_exception(*err))
        self._put(test, "failed", _first_line(text), text)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._put(test, "passed", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._put(test, "failed", "unexpected success")


def _select(names: list[str], patterns: list[str], excludes: list[str], shard: tuple[int, int] | None) -> list[str]:
    def match(name: str, pats: list[str]) -> bool:
        return any(fnmatch.fnmatchcase(name, p) if any(c in p for c in "*?[") else p in name for p in pats)

    out = [n for n in names if (not patterns or match(n, patterns)) and not match(n, excludes)]
    if shard:
        i, n = shard
        out = out[i - 1 :: n]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="guard", help="backend name given to the suite (guard, gloo)")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--profile", choices=PROFILES, default="declared")
    p.add_argument("-k", dest="patterns", action="append", default=[], help="substring or glob; repeatable")
    p.add_argument("--tests", default="", help="comma-separated exact test names (combined with -k by union)")
    p.add_argument("-x", "--exclude", action="append", default=[], help="substring or glob to leave out")
    p.add_argument("--shard", help="i/n: run every n-th selected test starting at the i-th (1-based)")
    p.add_argument("--test-timeout", type=int, default=180, help="seconds before the suite kills a test's ranks")
    p.add_argument("--out", default="", help="JSON result file (merged into if it exists and --resume)")
    p.add_argument("--resume", action="store_true", help="skip tests already recorded in --out")
    p.add_argument("--log-dir", default="", help="per-test rank logs (default: a temp dir, kept)")
    p.add_argument("--list", action="store_true", help="print the selected test names and exit")
    p.add_argument("--static-skips", action="store_true",
                   help="run nothing: record which tests the suite's decorators skip at import time (and why)")
    p.add_argument("--start-method", choices=("spawn", "fork"), default="spawn",
                   help="how each test's ranks start (spawn: fresh interpreters, as PyTorch's CI; fork: faster)")
    p.add_argument("--import-ext", choices=("auto", "yes", "no"), default="auto",
                   help="import torch_ext before the suite (auto: only for backend guard)")
    args = p.parse_args(argv)

    # The suite reads all of this at import time, in the parent and in each rank.
    os.environ["BACKEND"] = args.backend
    os.environ["WORLD_SIZE"] = str(args.world_size)
    os.environ.setdefault("INIT_METHOD", "env://")
    os.environ[_ENV_PROFILE] = args.profile
    os.environ[_ENV_START] = args.start_method
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(args.test_timeout)
    import_ext = args.import_ext == "yes" or (args.import_ext == "auto" and args.backend == "guard")
    os.environ[_ENV_IMPORT_EXT] = "1" if import_ext else "0"
    log_dir = args.log_dir or tempfile.mkdtemp(prefix=f"conf-{args.backend}-logs-")
    os.makedirs(log_dir, exist_ok=True)
    os.environ[_ENV_LOG_DIR] = os.path.abspath(log_dir)
    # TEMP_DIR must exist with a barrier/ folder before the suite is imported;
    # TestDistBackend.setUp replaces it with a fresh one for every test.
    temp_dir = tempfile.mkdtemp(prefix="conf-temp-")
    os.makedirs(os.path.join(temp_dir, "barrier"), exist_ok=True)
    os.environ["TEMP_DIR"] = temp_dir

    cls = _load_suite()
    import torch

    loader = unittest.TestLoader()
    names = sorted(loader.getTestCaseNames(cls))
    shard = None
    if args.shard:
        i, n = (int(x) for x in args.shard.split("/"))
        if not 1 <= i <= n:
            p.error("--shard i/n needs 1 <= i <= n")
        shard = (i, n)
    exact = [t for t in args.tests.split(",") if t]
    unknown = [t for t in exact if t not in names]
    if unknown:
        p.error(f"--tests: not in the suite: {', '.join(unknown)}")
    if exact and not args.patterns:
        selected = _select(exact, [], args.exclude, shard)
    else:
        selected = _select(names, args.patterns, args.exclude, shard)
        selected = sorted(set(selected) | set(_select(exact, [], args.exclude, shard)))

    results: dict[str, dict] = {}
    if args.out and args.resume and os.path.exists(args.out):
        with open(args.out) as f:
            results = json.load(f).get("results", {})
        selected = [n for n in selected if n not in results]
    if args.list:
        print("\n".join(selected))
        print(f"# {len(selected)} of {len(names)} tests", file=sys.stderr)
        return 0

    from torch.testing._internal.common_distributed import DistTestCases

    if args.static_skips:
        static = {}
        for n in selected:
            fn = getattr(cls, n)
            if getattr(fn, "__unittest_skip__", False):
                static[n] = {"status": "skipped", "reason": str(getattr(fn, "__unittest_skip_why__", ""))}
            else:
                static[n] = {"status": "would run"}
        doc = {"meta": {"backend": args.backend, "profile": args.profile, "torch": torch.__version__,
                        "world_size": args.world_size, "tests_in_suite": len(names)}, "results": static}
        text = json.dumps(doc, indent=1)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
        counts: dict[str, int] = {}
        for e in static.values():
            counts[e["status"]] = counts.get(e["status"], 0) + 1
        print(f"static skips, {args.backend}, profile {args.profile}: {counts}")
        return 0

    meta = {
        "suite": SUITE_MODULE,
        "class": cls.__name__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "backend": args.backend,
        "world_size": args.world_size,
        "profile": args.profile,
        "torch_ext_imported": import_ext,
        "declared_features": sorted(k for k, v in DistTestCases.backend_feature.items() if args.backend in v),
        "tests_in_suite": len(names),
        "log_dir": os.path.abspath(log_dir),
    }
    if import_ext:
        import torch_ext

        meta["torch_ext"] = os.path.dirname(torch_ext.__file__)

    def sink(name: str, entry: dict) -> None:
        results[name] = entry
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            tmp = args.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"meta": meta, "results": dict(sorted(results.items()))}, f, indent=1)
            os.replace(tmp, args.out)

    suite = unittest.TestSuite(cls(n) for n in selected)
    print(f"running {len(selected)} of {len(names)} tests of {cls.__name__} "
          f"(world size {args.world_size}, profile {args.profile}); rank logs in {log_dir}", flush=True)
    t0 = time.monotonic()
    runner = unittest.TextTestRunner(
        verbosity=2, resultclass=lambda *a, **kw: JsonResult(*a, sink=sink, **kw), stream=sys.stdout
    )
    runner.run(suite)
    counts: dict[str, int] = {}
    for e in results.values():
        counts[e["status"]] = counts.get(e["status"], 0) + 1
    print(f"done in {time.monotonic() - t0:.0f}s: {counts}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
