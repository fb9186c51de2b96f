"""Where the guard's reports go when the application has not configured logging.

The C++ core logs every report through Python's logger ``torch_ext`` (hang
reports at WARNING, errors at ERROR). Python's own fallback for an unconfigured
application prints bare lines (no rank, no time, no level), which interleave
unreadably across ranks. :func:`install` attaches one handler to ``torch_ext``
that, only while the application has configured nothing, writes each record to
stderr with every line labelled::

    [rank0] 12:01:07 torch_ext WARNING: collective #2 all_reduce(float32[4], SUM) ... has waited 61.0 s
    [rank0] 12:01:07 torch_ext WARNING:   waiting: ranks 0-2 at train.py:68 in step

The rank is the default group's once ``init_process_group`` has run, before
that the ``RANK`` environment variable (torchrun, SLURM wrappers, env://), and
is left out when neither is known. On a job spanning several hosts (torchrun's
``LOCAL_WORLD_SIZE`` smaller than ``WORLD_SIZE``) the label also names the local
rank and host: ``[rank5 local1@node-b]``.

"Configured" is decided per record, so ``logging.basicConfig`` called after
``import torch_ext`` takes over at once: as soon as the root logger or the
``torch_ext`` logger has a handler of the application's, this handler stays
silent and the record follows the application's configuration (one copy).

An ERROR record is the report of an error. When it is the report a guarded
group failed with, as a mismatch, a timeout or a lost store, every pending and
later collective of this rank on that group raises the error with exactly
this report, which an uncaught error's traceback prints: here such a record is
printed as its first line only, pointing to the raised error, so each rank
prints the report once. Any other ERROR record is printed in full: a failure
in the inner backend (a rank gone), whose own op may have raised before the
cross-rank report was complete, or a record no group failed with. Hang reports
(WARNING, nothing raised yet) are printed in full.
"""
from __future__ import annotations

import io
import logging
import os
import socket
import sys
import time

import torch

from torch_ext import _compat
from torch_ext._core import _C

LOGGER_NAME = "torch_ext"

# Group failures whose report is raised, as is, by every op on the group afterwards.
_RAISED_AS_IS = ("mismatch", "timeout", "store_lost", "deadlock")
# The guard logs a report just before it fails the group with it: how long to
# wait for the failure to show before printing the record in full.
_FAILURE_WAIT_S = 1.0

_POINTER = " (the error raised here carries the full report)"


def _rank_label() -> str:
    rank: str | None = None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = str(dist.get_rank())
    except Exception:  # noqa: BLE001 - a label must never break logging
        rank = None
    if rank is None:
        rank = os.environ.get("RANK")
    if rank is None:
        return ""
    local, local_size, size = (os.environ.get(k) for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE"))
    if local is not None and local_size and size and local_size != size:
        return f"[rank{rank} local{local}@{socket.gethostname()}] "
    return f"[rank{rank}] "


def _failure_kind(text: str) -> str | None:
    """The kind of the guarded group failure whose report is ``text``; None if no group failed with it."""
    try:
        groups = _compat.process_groups()
    except Exception:  # noqa: BLE001 - not initialised, or torch changed: print in full
        return None
    for pg in groups:
        try:
            backend = _compat.group_backend(pg, torch.device("cpu"))
        except Exception:  # noqa: BLE001 - a group without a CPU backend
            continue
        if _C._is_guard(backend):
            failure = _C._failure(backend)
            if failure is not None and failure[1] == text:
                return failure[0]
    return None


def _raised_as_is(text: str) -> bool:
    deadline = time.monotonic() + _FAILURE_WAIT_S
    while True:
        kind = _failure_kind(text)
        if kind is not None or time.monotonic() >= deadline:
            return kind in _RAISED_AS_IS
        time.sleep(0.01)  # polls the group's state: the guard fails it right after logging


def _app_configured(logger: logging.Logger, ours: logging.Handler) -> bool:
    """True when the application gave the record somewhere to go itself."""
    current: logging.Logger | None = logger
    while current is not None:
        if any(h is not ours for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent  # type: ignore[assignment]
    return False


class DefaultHandler(logging.Handler):
    """stderr, every line labelled; silent once the application configures logging."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)

    def handle(self, record: logging.LogRecord) -> bool:
        if _app_configured(logging.getLogger(record.name), self):
            return False
        return super().handle(record)

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if getattr(record, "torch_ext_raised", False):
            text = text.split("\n", 1)[0].rstrip(":") + _POINTER
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        prefix = f"{_rank_label()}{stamp} {record.name} {record.levelname}: "
        return "\n".join(prefix + line for line in text.split("\n"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if record.levelno >= logging.ERROR and record.name == LOGGER_NAME and not record.exc_info:
                record.torch_ext_raised = _raised_as_is(record.getMessage())
            msg = self.format(record) + "\n"
            stream = sys.stderr
            # torch's excepthook (set by init_process_group) captures a traceback
            # in a StringIO to prefix it with "[rankN]:"; a record emitted by the
            # guard's helper thread meanwhile would land inside the traceback.
            if isinstance(stream, io.StringIO) and sys.__stderr__ is not None:
                stream = sys.__stderr__
            if stream is None:
                return
            stream.write(msg)
            stream.flush()
        except Exception:  # noqa: BLE001
            self.handleError(record)


_handler: DefaultHandler | None = None


def install() -> None:
    """Attaches the default handler to the ``torch_ext`` logger (once)."""
    global _handler
    if _handler is not None:
        return
    _handler = DefaultHandler()
    logging.getLogger(LOGGER_NAME).addHandler(_handler)
