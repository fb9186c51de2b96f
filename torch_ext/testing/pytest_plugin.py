"""pytest plugin: run a test function on n ranks, fail fast with every rank's report.

Registered as ``torch_ext`` through the ``pytest11`` entry point, so it loads in
every pytest run once torch_ext is installed; ``pytest -p no:torch_ext`` turns it
off. It adds:

- ``@pytest.mark.world(n, device="cpu", timeout=60, backend="guard", store="parent", env=None)``:
  the test body runs once per rank, in its own process, on an initialised group
  (see :func:`torch_ext.testing.run_ranks`). The test asks for ``rank`` and
  ``world_size`` like fixtures; other fixtures are set up once, in the pytest
  process, and their values are sent to every rank (they must pickle).
  ``device="cuda"`` needs one GPU per rank: skipped without them, a failure on a
  GPU runner (``TORCH_EXT_GPU_RUNNER=1``).
- the ``ranks`` fixture: ``ranks(fn, n, **run_ranks_options)``, for tests that
  run several multi-rank steps or look at the per-rank results themselves.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import os
import pickle
import sys
from typing import Any, Callable

import pytest

from torch_ext.testing._gpu import apply_gpu_rule
from torch_ext.testing._ranks import DEVICES, RanksFailedError, run_ranks

MARKER_HELP = ("world(n, device='cpu', timeout=60, backend='guard', store='parent', env=None): run the test "
               "body on n ranks, one process each, on an initialised guard group; the test takes rank and "
               "world_size arguments (torch_ext.testing)")
_OPTIONS = ("device", "timeout", "backend", "store", "env")


@dataclasses.dataclass(frozen=True)
class World:
    size: int
    device: str = "cpu"
    timeout: float = 60.0
    backend: str | None = "guard"
    store: str = "parent"
    env: dict | None = None


def world_of(item: pytest.Item) -> World | None:
    """The ``world`` marker of a test, validated; None when it has none."""
    marker = item.get_closest_marker("world")
    if marker is None:
        return None
    usage = f"{item.nodeid}: @pytest.mark.world takes the number of ranks and {', '.join(_OPTIONS)}"
    if len(marker.args) != 1 or not isinstance(marker.args[0], int) or marker.args[0] < 1:
        raise pytest.UsageError(f"{usage}, e.g. @pytest.mark.world(2, device='cpu'); got args {marker.args!r}")
    unknown = set(marker.kwargs) - set(_OPTIONS)
    if unknown:
        raise pytest.UsageError(f"{usage}; got unknown {sorted(unknown)}")
    world = World(marker.args[0], **marker.kwargs)
    if world.device not in DEVICES:
        raise pytest.UsageError(f"{usage}; device={world.device!r} is not one of {DEVICES}")
    return world


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        world_of(item)  # a misused marker fails the run at collection, naming the test


def pytest_runtest_setup(item: pytest.Item) -> None:
    world = world_of(item)
    if world is not None and world.device == "cuda":
        apply_gpu_rule(world.size, f"{item.nodeid} (world {world.size}, device='cuda')")


@pytest.fixture
def rank(request: pytest.FixtureRequest) -> int | None:
    """This process's rank, in a test marked ``@pytest.mark.world(n)`` (set in each rank's process)."""
    if request.node.get_closest_marker("world") is None:
        pytest.fail("the `rank` argument is given only to tests marked @pytest.mark.world(n)", pytrace=False)
    return None  # replaced by the rank in each rank's process


@pytest.fixture
def world_size(request: pytest.FixtureRequest) -> int:
    """The number of ranks of a test marked ``@pytest.mark.world(n)``."""
    world = world_of(request.node)
    if world is None:
        pytest.fail("the `world_size` argument is given only to tests marked @pytest.mark.world(n)", pytrace=False)
    return world.size


class Ranks:
    """The ``ranks`` fixture: ``ranks(fn, n, **options)`` is :func:`run_ranks` that fails the test with the report."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid

    def __call__(self, fn: Callable[..., Any], world_size: int, *args: Any, **options: Any):
        options.setdefault("title", f"{self.nodeid}: {getattr(fn, '__qualname__', fn)} on {world_size} ranks")
        try:
            return run_ranks(fn, world_size, *args, **options)
        except RanksFailedError as e:
            message = str(e)
        pytest.fail(message, pytrace=False)  # outside the except: the report alone, not a chain


@pytest.fixture
def ranks(request: pytest.FixtureRequest) -> Ranks:
    """``ranks(fn, n, *args, device=..., timeout=..., env=..., store=...)``: runs ``fn(rank, world_size, *args)``
    on n ranks (see :func:`torch_ext.testing.run_ranks`) and returns the per-rank results; a failure of any
    rank fails the test with every rank's report."""
    return Ranks(request.node.nodeid)


@dataclasses.dataclass(frozen=True)
class RankBody:
    """Where a rank's process finds the test function: by module name, else by file."""

    module: str
    file: str
    qualname: str

    @classmethod
    def of(cls, func: Callable[..., Any]) -> "RankBody":
        func = getattr(func, "__func__", func)  # a method of a test class
        return cls(func.__module__, inspect.getfile(func), func.__qualname__)

    def resolve(self) -> Callable[..., Any]:
        module = sys.modules.get(self.module)
        if module is None:
            try:
                module = importlib.import_module(self.module)
            except ImportError:
                module = None
        if module is None or os.path.abspath(getattr(module, "__file__", "") or "") != os.path.abspath(self.file):
            # pytest's importlib mode (or a name not on sys.path): load the file itself.
            spec = importlib.util.spec_from_file_location(self.module, self.file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[self.module] = module
            spec.loader.exec_module(module)
        *owners, name = self.qualname.split(".")
        obj: Any = module
        for owner in owners:
            obj = getattr(obj, owner)
        if owners:
            obj = obj()  # a test class: a fresh instance, as pytest makes one per test
        return getattr(obj, name)


def _run_test(rank: int, world_size: int, test: RankBody, kwargs: dict) -> Any:
    func = test.resolve()
    params = inspect.signature(func).parameters
    call = dict(kwargs)
    if "rank" in params:
        call["rank"] = rank
    if "world_size" in params:
        call["world_size"] = world_size
    return func(**call)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    world = world_of(pyfuncitem)
    if world is None:
        return None
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames
              if name not in ("rank", "world_size")}
    for name, value in kwargs.items():
        try:
            pickle.dumps(value)
        except Exception as e:  # noqa: BLE001 - any pickling failure means the same thing here
            pytest.fail(f"{pyfuncitem.nodeid}: the value of fixture `{name}` ({type(value).__name__}) cannot be "
                        f"sent to the rank processes ({e}). Create it inside the test body instead, or make it "
                        "picklable.", pytrace=False)
    try:
        run_ranks(_run_test, world.size, RankBody.of(pyfuncitem.obj), kwargs, backend=world.backend,
                  device=world.device, timeout=world.timeout, env=world.env, store=world.store,
                  title=f"{pyfuncitem.nodeid} on {world.size} ranks ({world.device}, timeout {world.timeout:g} s)")
    except RanksFailedError as e:
        message = str(e)
    else:
        return True
    pytest.fail(message, pytrace=False)  # outside the except: the report alone, not a chain
