"""Loads ``torch_ext._C``, first checking it was compiled against the running torch.

A C++ extension only works with the torch it was compiled against: torch has no
stable C++ ABI, so another version (or the same version built differently, e.g.
``+cpu`` and ``+cu128``) fails at load with an undefined symbol, or crashes later.
The build records the torch it compiled against in ``torch_ext/_build_info.py``
(written by ``setup.py``), which is read here *before* ``_C`` is loaded. A torch
outside the releases torch_ext supports (``_compat.SUPPORTED_TORCH``) is refused first.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import torch
from packaging.version import InvalidVersion, Version

from torch_ext._compat import SUPPORTED_TORCH

PACKAGE_DIR = Path(__file__).resolve().parent


def built_against() -> str | None:
    """The torch version ``_C`` was compiled against, or None if the build did not record it."""
    try:
        from torch_ext import _build_info
    except ImportError:
        return None
    return _build_info.TORCH_VERSION


def same_torch(built: str, running: str) -> bool:
    """Whether an extension compiled against ``built`` can load in ``running``.

    Exact equality, local label included: 2.13.0 and 2.13.1 differ, and so do
    2.13.0+cpu and 2.13.0+cu128 (a CPU and a CUDA build of one release).
    """
    try:
        return Version(built) == Version(running)
    except InvalidVersion:
        return built == running


def rebuild_command(version: str) -> str:
    """How to compile this torch_ext against the running torch, for where it is installed."""
    pip = f"{sys.executable} -m pip install --no-build-isolation"
    root = PACKAGE_DIR.parent
    if (root / "setup.py").is_file() and (root / "csrc").is_dir():
        return f"{pip} -e {root}"
    # An installed wheel: it holds no sources, so rebuild from the sdist.
    return f"{pip} --force-reinstall --no-deps torch_ext-{version}.tar.gz  (its sdist)"


def mismatch_message(version: str, built: str, running: str) -> str:
    return (f"torch_ext {version} was compiled against torch {built}, but torch {running} is installed "
            f"(a C++ extension only loads with the torch it was compiled against).\n"
            f"Rebuild it against this torch:\n  {rebuild_command(version)}\n"
            f"or install torch {built} again.")


def supported_torch(running: str) -> bool:
    """Whether torch ``running`` is one of the releases torch_ext supports (``_compat.SUPPORTED_TORCH``).

    By release (major, minor) only: pre-releases and local builds of a supported release are in.
    """
    try:
        release = Version(running).release[:2]
    except InvalidVersion:
        return True  # an unparsable source build: the check against the build's record still applies
    oldest, newest = SUPPORTED_TORCH
    return oldest <= release <= newest


def unsupported_message(version: str, running: str) -> str:
    (a, b), (c, d) = SUPPORTED_TORCH
    return (f"torch_ext {version} supports torch {a}.{b} to {c}.{d}, but torch {running} is installed.\n"
            f"Install a supported torch (pip install 'torch>={a}.{b},<{c}.{d + 1}'), then rebuild torch_ext "
            f"against it:\n  {rebuild_command(version)}")


def load(version: str) -> ModuleType:
    """Imports and returns ``torch_ext._C``; raises one clear ImportError if it cannot work."""
    running = str(torch.__version__)
    if not supported_torch(running):
        raise ImportError(unsupported_message(version, running), name="torch_ext._C")
    built = built_against()
    if built is not None and not same_torch(built, running):
        raise ImportError(mismatch_message(version, built, running), name="torch_ext._C")
    try:
        return importlib.import_module("torch_ext._C")
    except ImportError as e:
        if isinstance(e, ModuleNotFoundError) and e.name == "torch_ext._C":
            what = f"torch_ext._C is not built in {PACKAGE_DIR}"
        else:
            what = (f"torch_ext._C cannot be loaded ({e}); compiled against torch {built or '(not recorded)'}, "
                    f"running torch {running}")
        raise ImportError(f"{what}.\nBuild it against the installed torch:\n  {rebuild_command(version)}",
                          name="torch_ext._C") from e

