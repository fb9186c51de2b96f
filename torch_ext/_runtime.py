"""Attaches the C++ core to this interpreter: call sites, stack sampling, logging."""
from __future__ import annotations

import atexit
import importlib.util
import os
import site
import sys
import sysconfig
import threading

import torch

from torch_ext import _C

_installed = False


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
    # Frames report their code's filename as given at import time; register both
    # the real paths and the paths as seen, in case of symlinks.
    internal += [os.path.dirname(torch.__file__) + os.sep, os.path.dirname(__file__) + os.sep]
    _C._install_runtime(sorted(set(internal)), stdlib, sorted(sites), main)
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


def _at_exit() -> None:
    """Interpreter exit (see install): a mismatch found while waiting for the
    verdict on the last collectives ends the process with status 1, never 0."""
    mismatches = _C._at_exit()
    if not mismatches:
        return
    for report in mismatches:
        sys.stderr.write(f"torch_ext: CollectiveMismatchError at exit: {report}\n")
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
