"""Attaches the C++ core to this interpreter: call sites, stack sampling, logging."""
from __future__ import annotations

import atexit
import importlib.util
import os
import site
import sys
import sysconfig
import threading
import traceback

import torch

from torch_ext import _launcher
from torch_ext._core import _C
from torch_ext._ddp import explain
from torch_ext.errors import GuardError

_installed = False
# The process that made this interpreter's guard groups; a process forked from it inherits them
# (their threads stayed in the parent) and must leave them alone at its exit.
_groups_pid: int | None = None


def _prefix(path: str) -> str:
    return os.path.realpath(path).rstrip(os.sep) + os.sep


def install() -> None:
    global _installed
    if _installed:
        return
    internal = [_prefix(os.path.dirname(torch.__file__)), _prefix(os.path.dirname(__file__))]
    paths = sysconfig.get_paths()
    stdlib = sorted({_prefix(paths["stdlib"]), _prefix(paths["platstdlib"])})
    sites = {_prefix(paths["purelib"]), _prefix(paths["platlib"])}
    try:
        sites |= {_prefix(p) for p in site.getsitepackages()}
    except AttributeError:  # virtualenv's old site module
        pass
    main = threading.main_thread().ident or 0
    # typing_extensions' @deprecated wraps torch's own functions (dist.all_gather_into_tensor
    # in torch 2.13): its wrapper frame is torch's, not a framework calling torch.
    te = sys.modules.get("typing_extensions")
    if te is not None and getattr(te, "__file__", None):
        internal += [os.path.realpath(te.__file__), te.__file__]
    # Frames report their code's filename as given at import time; register both
    # the real paths and the paths as seen, in case of symlinks.
    internal += [os.path.dirname(torch.__file__) + os.sep, os.path.dirname(__file__) + os.sep]
    _C._install_runtime(sorted(set(internal)), stdlib, sorted(sites), main)
    # What this process runs, in every dump: a replay (--repro) names it next to its own.
    from torch_ext._version import __version__

    _C._set_software(f"torch {torch.__version__}, torch_ext {__version__}, Python {sys.version.split()[0]}")
    try:
        listed = _C.resolve_config({})["library_packages"]
    except ValueError:
        listed = []  # a malformed setting is reported when a guard group is created
    set_library_packages(listed)
    # At interpreter exit every guarded group says "exited", the watchdog stops
    # without waiting on the store, and inner backends are kept alive: no exit
    # path joins a stuck thread or tears down a gloo group whose peer is gone.
    atexit.register(_at_exit)
    _installed = True


# How much of an uncaught exception's message its peers' reports quote (DDP's
# "Expected to have finished reduction ..." names the parameters without a
# gradient on its last lines, after about 900 characters).
_LAST_WORDS_CHARS = 1500


def _uncaught() -> str:
    """The exception ending this interpreter, if the program did not catch it:
    ``"RuntimeError: ... (at train.py:30 in step)"``; "" for none, and for the
    guard's own errors (every peer has the verdict already).

    Python keeps it in ``sys.last_exc`` (3.12) / ``sys.last_value`` once it has
    printed it, before the atexit hooks run.
    """
    if hasattr(sys, "ps1"):
        return ""  # an interactive session keeps the last error shown at its prompt, long handled
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if exc is None or isinstance(exc, SystemExit):
        return ""
    if isinstance(exc, GuardError):
        return ""
    text = str(exc).split("\nException raised from")[0].strip()  # torch's C++ backtrace
    if len(text) > _LAST_WORDS_CHARS:
        text = text[:_LAST_WORDS_CHARS] + " ..."
    where = ""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ is not None else []
    if frames:
        # The innermost frame of the program's own code (not torch's, nor another library's).
        internal = (os.path.dirname(torch.__file__), os.path.dirname(__file__))
        ours = [f for f in frames if not f.filename.startswith(internal) and "-packages" + os.sep not in f.filename]
        f = (ours or frames)[-1]
        where = f" (at {os.path.basename(f.filename)}:{f.lineno} in {f.name})"
    text = "\n    ".join(line.rstrip() for line in text.splitlines())  # nested under the report's line
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"


def made_group() -> None:
    """A guard group was made in this process: its exit speaks for the groups (see _at_exit)."""
    global _groups_pid
    _groups_pid = os.getpid()


def _forked_child() -> bool:
    return _groups_pid is not None and _groups_pid != os.getpid()


def _leave_the_parents_groups() -> None:
    """A process forked from one with groups (``os.fork()`` and a normal exit; multiprocessing's
    children leave by ``os._exit``) inherits the groups' objects but none of their threads: the
    watchdog's, the store's, gloo's. Tearing them down would join threads that are not there (a
    hang, or std::terminate for a joinable std::thread), and saying "exited" for the parent's
    rank would end its peers' waits on its behalf. So the child keeps torch's groups and their
    stores for good: nothing of them is destroyed when the interpreter ends, and the child's own
    exit status stands."""
    try:
        import torch.distributed.distributed_c10d as c10d

        world = c10d._world
        for pg, (_, store) in list(world.pg_map.items()):
            _C._keep_forever(pg)
            _C._keep_forever(store)
    except Exception:  # noqa: BLE001 - a torch without these internals: the child ends as it would have
        pass


def _at_exit() -> None:
    """Interpreter exit (see install): a mismatch found while waiting for the
    verdict on the last collectives, or a group whose creation was refused after
    this rank concluded it, ends the process with status 1, never 0; an
    uncaught exception is left as this rank's last words for its peers. A
    forked child leaves its parent's groups alone (_leave_the_parents_groups)."""
    if _forked_child():
        _leave_the_parents_groups()
        return
    try:
        uncaught = _uncaught()
    except Exception:  # noqa: BLE001 - the exit must go on whatever the exception's str() does
        uncaught = ""
    ending = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if isinstance(ending, GuardError) and not hasattr(sys, "ps1"):
        try:  # under torchrun: its failure summary prints the guard's report (_launcher.py)
            _launcher.record(ending)
        except Exception:  # noqa: BLE001 - never in the exit's way
            pass
    if uncaught:
        try:  # what the guard knows about it (DDP's unfinished reduction), after its traceback
            note = explain(getattr(sys, "last_exc", None) or getattr(sys, "last_value", None))
        except Exception:  # noqa: BLE001 - a note, never in the exit's way
            note = ""
        if note:
            sys.stderr.write(note + "\n")
            sys.stderr.flush()
    unraised = _C._at_exit(uncaught)  # "<ErrorType> at exit: <report>" each
    if not unraised:
        return
    for text in unraised:
        sys.stderr.write(f"torch_ext: {text}\n")
    try:
        _launcher.record_text(unraised[0])
    except Exception:  # noqa: BLE001 - never in the exit's way
        pass
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(1)


_listed: list[str] = []


def _package_roots(name: str) -> list[str]:
    """Folders (or the file, for a module) of an importable name, as given and as real paths."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return []
    if spec.submodule_search_locations:
        places = [p.rstrip(os.sep) + os.sep for p in spec.submodule_search_locations]
    elif spec.origin and os.path.isabs(spec.origin):
        places = [spec.origin]
    else:
        return []
    return sorted({*places, *(_prefix(p) if p.endswith(os.sep) else os.path.realpath(p) for p in places)})


def set_library_packages(names: list[str]) -> None:
    """Frames of these packages count as library code (TORCH_EXT_LIBRARY_PACKAGES).

    A name that cannot be found now is skipped; it is looked up again whenever
    the list is set (each guard group sets it from its resolved config).
    """
    global _listed
    roots = [(root, name) for name in names for root in _package_roots(name)]
    _listed = list(names)
    _C._set_listed_libraries(roots)


def library_packages() -> list[str]:
    """The packages currently treated as library code by TORCH_EXT_LIBRARY_PACKAGES."""
    return list(_listed)
