"""Shared fixtures and markers for torch_ext's tests.

The `world` marker and the `ranks` fixture come from torch_ext's own pytest
plugin (torch_ext.testing.pytest_plugin, loaded through its pytest11 entry point).
"""
from __future__ import annotations

import gc
import os
import sys

import pytest

from torch_ext.testing import apply_gpu_rule

sys.path.insert(0, os.path.dirname(__file__))

# The store timeout of every rank these tests start (inherited through the
# environment). The store-loss tests set their own (test_store_loss,
# examples/bugs/rank0_dies.py), the defaults tests the default (12 s). The others
# are not about the store: a store reply that waits on a busy 2-core machine, or
# on the store server's name lookup of a connecting peer (5 s where DNS drops the
# query: docs/diagnostics.md, "A store that pauses is not lost"), must not fail
# them with StoreLostError for a reason they do not test.
os.environ.setdefault("TORCH_EXT_STORE_TIMEOUT", "15")


def pytest_collection_modifyitems(config, items):
    # Long tests first (stable otherwise): pytest-xdist hands tests out in this
    # order, so a soak started last would run alone at the end (scripts/test.sh).
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    # What the imports and the collection made (torch, the test modules) lives as long as this process:
    # frozen out of the garbage collector's work, a full collection while a test runs here no longer
    # walks it (about 0.25 CPU-s each with torch imported; run_ranks' forkserver does the same).
    gc.freeze()


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:2] if p.isdigit())


def pytest_runtest_setup(item):
    # The GPU rule, shared with the plugin's world(n, device="cuda"): skipped
    # without enough CUDA devices, a failure on a GPU runner (TORCH_EXT_GPU_RUNNER=1).
    marker = item.get_closest_marker("gpu")
    if marker is not None:
        apply_gpu_rule(int(marker.kwargs.get("count", 1)))


def pytest_addoption(parser):
    # --cpu-profile FILE: each test's wall time, CPU and processes, one JSON line each (cpu_profile.py).
    from cpu_profile import add_option

    add_option(parser)


def pytest_configure(config):
    # pytest -n --dist loadgroup (scripts/test.sh) keeps an xdist_group on one worker by a suffix that
    # pytest-xdist writes into each test's node id. pytest 9.2 ignores that write
    # (pytest-dev/pytest-xdist#1386, open): the groups are dealt out test by test and each worker builds
    # their module fixtures again (the packaging builds, the verdicts-at-defaults job: minutes of CI),
    # with nothing failing. Refused, rather than run slow; scripts/setup.sh pins pytest below 9.2.
    if config.getoption("dist", None) == "loadgroup" and _release(pytest.__version__) >= (9, 2):
        raise pytest.UsageError(f"pytest-xdist's --dist loadgroup does not keep an xdist_group on one worker "
                                f"under pytest {pytest.__version__} (pytest-dev/pytest-xdist#1386): install the "
                                "pytest that scripts/setup.sh pins (bash scripts/setup.sh test)")
    from cpu_profile import register

    register(config)
    _share_zygotes(config)


def _share_zygotes(config):
    """In pytest's main process: the warm interpreters (torch_ext/testing/_warm.py) are shared by every
    process of this run, pytest-xdist's workers included, one per environment key instead of one per key
    and worker (45 imports of torch, 84 CPU-s, in a pass on five workers); they end with this process."""
    from torch_ext.testing import _warm

    if hasattr(config, "workerinput") or os.environ.get(_warm.SHARED):
        return
    import tempfile

    directory = tempfile.mkdtemp(prefix="torch_ext_warm_shared_")
    os.environ[_warm.SHARED] = f"{os.getpid()}:{directory}"
    config._torch_ext_warm_shared = directory


def pytest_unconfigure(config):
    directory = getattr(config, "_torch_ext_warm_shared", None)
    if directory is not None:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
