"""Attaches the C++ core to this interpreter: call sites, stack sampling, logging."""
from __future__ import annotations

import atexit
import os
import site
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
    # At interpreter exit every guarded group says "exited", the watchdog stops
    # without waiting on the store, and inner backends are kept alive: no exit
    # path joins a stuck thread or tears down a gloo group whose peer is gone.
    atexit.register(_C._at_exit)
    _installed = True
