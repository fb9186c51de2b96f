"""Errors raised by guarded process groups.

All derive from :class:`torch.distributed.DistBackendError`, so code that already
catches that keeps working. The C++ core raises the matching C++ types and the
bindings translate them to these classes.
"""
from __future__ import annotations

from typing import Callable

import torch.distributed as dist

__all__ = [
    "GuardError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "CollectiveFailureError",
    "StoreLostError",
    "DeadlockError",
    "GroupJoinError",
]


# Notes a guard error's text gains where it is read, registered by the module
# that knows them (torch_ext/_ddp.py: DDP's gradient buckets), so that this
# module imports nothing of torch_ext's.
_annotators: list[Callable[[str], str]] = []


def add_annotator(annotate: Callable[[str], str]) -> None:
    """``annotate(text) -> text`` rewrites every guard error's text when it is first read (in order of adding)."""
    if annotate not in _annotators:
        _annotators.append(annotate)


def _annotated(text: str) -> str:
    for annotate in _annotators:
        try:
            text = annotate(text)
        except Exception:  # noqa: BLE001 - the error's own text, whatever a note does
            pass
    return text


class GuardError(dist.DistBackendError):
    """Base class: a guarded process group failed and says why, naming ranks.

    Its text is the guard's report; where this process runs DDP, each all_reduce
    line of a gradient bucket is followed by the bucket and its parameters
    (torch_ext/_ddp.py, through add_annotator), read once, when the text is first read.
    """

    def __str__(self) -> str:
        text = super().__str__()
        noted = self.__dict__.get("_torch_ext_text")
        if noted is None or noted[0] != text:
            noted = (text, _annotated(text))
            self.__dict__["_torch_ext_text"] = noted
        return noted[1]


class CollectiveMismatchError(GuardError):
    """Ranks issued different collectives (op, shape, dtype, reduce op, root, order).

    Raised on every rank of the group, before the inner collective runs (strict
    mode) or on the pending and following collectives (async mode). The message
    names the group, the sequence number and, per distinct fingerprint, the ranks
    that issued it with their call sites.
    """


class CollectiveTimeoutError(GuardError):
    """A collective waited longer than ``abort_after`` (TORCH_EXT_ABORT_AFTER).

    The message carries the hang report: which ranks wait, which have not arrived
    and where their main thread is, which are gone.
    """


class DeadlockError(CollectiveTimeoutError):
    """Ranks wait for each other in a cycle that can never resolve.

    A wait-for cycle across groups (rank 0 in ``dp`` then ``mp``, the others in
    ``mp`` then ``dp``) or of send/recv (two pipeline stages that both receive
    first), where every rank of the cycle blocks in its wait: none of them can
    issue what another waits for. Raised on every live rank of the groups on
    the cycle as soon as that is known (seconds), not at ``abort_after``; set
    ``TORCH_EXT_END_DEADLOCKS=0`` to wait for ``abort_after`` instead. A
    :class:`CollectiveTimeoutError`, so code that catches hangs catches this too.
    The message names the groups, the ranks and where each waits.
    """


class CollectiveFailureError(GuardError):
    """The inner backend failed a collective (e.g. a peer process died).

    The message carries the cross-rank report, e.g. which rank has no heartbeat.
    """


class StoreLostError(CollectiveFailureError):
    """The store the guard exchanges its checks through is gone or does not answer.

    Outside torchrun the TCPStore lives in rank 0's process, so rank 0 raising,
    being killed or freezing takes it down. The first line names the store
    (``the store at HOST:PORT``), who hosts it, and whether it is gone
    (connection closed or refused) or does not answer (``TORCH_EXT_STORE_TIMEOUT``);
    the following lines give this rank's pending collective and each peer's last
    known state. Raised by the pending and every following operation of every
    guarded group on that store.
    """


class GroupJoinError(GuardError):
    """A guard group could not be created: not every rank joined it, or its ranks cannot work together.

    Raised by ``init_process_group`` / ``new_group`` (and a DeviceMesh's groups)
    on every rank that joined, before any collective: when a rank did not join
    within ``join_timeout`` (TORCH_EXT_JOIN_TIMEOUT, 5 min), at once when a rank
    is known to have created another backend there (plain ``gloo``), or when
    ranks run torch_ext releases whose join protocols differ. The message names
    each rank that did not join and what is known of it, or each rank's
    versions side by side.
    """
