"""Under torchrun: the guard's report reaches the launcher's failure summary.

torchrun's agent prints, for each failed worker, the error file the worker
wrote (``TORCHELASTIC_ERROR_FILE``, torchelastic's ``@record`` format), and ends
the surviving workers with SIGTERM as soon as one worker's process ends. The
C++ side (``csrc/guard/watchdog/LauncherStop.h``) writes that file and handles
the SIGTERM; this module only names the file: a guard error nobody caught, or a
failure found at exit, is recorded there, so the summary's root cause reads the
guard's report instead of "To enable traceback see ...".
"""

from __future__ import annotations

import os
import traceback

from torch_ext._core import _C

# torchelastic's variable (torch.distributed.elastic.multiprocessing.errors): set by torchrun's agent per worker.
_ERROR_FILE_VAR = "TORCHELASTIC_ERROR_FILE"


def error_file() -> str:
    """The launcher's error file for this worker; "" outside torchrun (or torchelastic)."""
    return os.environ.get(_ERROR_FILE_VAR, "")


def install() -> None:
    """With the first guarded group: a SIGTERM from the launcher leaves the report first (LauncherStop.h).

    Nothing outside torchrun, and nothing where SIGTERM has a handler already (the program's or a framework's).
    """
    path = error_file()
    if path:
        _C._launcher_stop(path)


def record(exc: BaseException) -> None:
    """An error the program did not catch: written to the launcher's error file, unless one exists (a
    ``@record``-decorated main wrote its own)."""
    path = error_file()
    if not path:
        return
    details = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    _C._launcher_error(path, f"{type(exc).__name__}: {exc}", details)


def record_text(text: str) -> None:
    """A failure the exit found (``"CollectiveMismatchError at exit: ..."``): the process ends with status 1."""
    path = error_file()
    if path:
        _C._launcher_error(path, text, "torch_ext: " + text)
