"""The compiled core, ``torch_ext._C``: loaded once, checked against the running torch.

Every module of the package takes ``_C`` from here (``from torch_ext._core import _C``),
never with ``from torch_ext import _C``: that form would load the module file directly,
unchecked, whenever the package's ``__init__`` has not set the attribute yet. The
loading and its messages are in ``torch_ext._extension``.
"""
from __future__ import annotations

from torch_ext import _extension
from torch_ext._version import __version__

# Refuses, with one clear ImportError, a _C compiled against another torch.
_C = _extension.load(__version__)
