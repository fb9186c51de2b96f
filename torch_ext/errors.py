"""Errors raised by guarded process groups.

All derive from :class:`torch.distributed.DistBackendError`, so code that already
catches that keeps working. The C++ core raises the matching C++ types and the
bindings translate them to these classes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import torch.distributed as dist

__all__ = [
    "GuardError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "CollectiveFailureError",
    "StoreLostError",
    "DeadlockError",
    "GroupJoinError",
    "Report",
    "RankOp",
    "OpFacts",
]


@dataclass(frozen=True)
class OpFacts:
    """One operation a report names: its text as the report writes it, and what it is."""

    text: str  # "all_reduce(float32[2177], SUM)"
    op: str  # "all_reduce"
    dtype: str  # of its first tensor ("" without tensors)
    sizes: tuple[int, ...]  # of its first tensor
    tensors: int  # how many tensors it has
    reduce_op: str  # "SUM"; "" for an op that does not reduce

    @property
    def numel(self) -> int:
        """Elements of its first tensor (0 without tensors)."""
        n = 1 if self.tensors else 0
        for d in self.sizes:
            n *= d
        return n


@dataclass(frozen=True)
class RankOp:
    """What one rank issued at the collective a mismatch is about, and where."""

    rank: int  # global rank
    issued: bool  # False: it had not issued that collective (``op`` says why)
    op: str  # the op's text, as the report writes it
    site: str  # its call site ("train.py:53 in train"), "" when not issued


@dataclass(frozen=True)
class Report:
    """What a guard error reports, as values: read ``err.report`` instead of parsing ``str(err)``.

    ``error`` is the error's kind (``"mismatch"``, ``"timeout"``, ``"deadlock"``,
    ``"failure"``, ``"store_lost"``); ``verdict`` what the ranks concluded
    (``"mismatch"``, ``"hang"`` or ``"failure"``). Ranks are global ranks. A mismatch
    fills ``rows`` (one per rank); a hang or failure fills ``op`` and the ranks by
    where they stand; a deadlock also ``cycle_groups``. ``ops`` gives the facts of
    each operation the text names. Fields the report does not know are empty.
    """

    error: str
    verdict: str
    group: str  # the group's label ("default_pg")
    seq: int  # the collective it is about (0: not one collective)
    op: str
    rows: tuple[RankOp, ...]
    waiting: tuple[int, ...]
    not_arrived: tuple[int, ...]
    gone: tuple[int, ...]
    completed: tuple[int, ...]
    cycle_groups: tuple[str, ...]
    certain: bool  # a deadlock whose every rank blocks in it
    waits_for: tuple[int, ...]  # a chain of waits ends at these ranks
    ops: tuple[OpFacts, ...]
    text: str

    @property
    def ranks(self) -> tuple[int, ...]:
        """Every rank the report names, in order."""
        named = {r.rank for r in self.rows} | set(self.waiting + self.not_arrived + self.gone + self.completed)
        return tuple(sorted(named))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        """The report of the C++ core's verdict JSON (``_C._failure_facts``)."""
        def ints(key: str) -> tuple[int, ...]:
            return tuple(int(r) for r in data.get(key, ()))

        return cls(
            error=str(data["error"]), verdict=str(data["kind"]), group=str(data.get("group", "")),
            seq=int(data.get("seq", 0)), op=str(data.get("op", "")),
            rows=tuple(RankOp(int(r["rank"]), bool(r["issued"]), str(r["op"]), str(r["where"]) if r["issued"] else "")
                       for r in data.get("ranks", ())),
            waiting=ints("waiting"), not_arrived=ints("not_arrived"), gone=ints("gone"), completed=ints("completed"),
            cycle_groups=tuple(str(g) for g in data.get("cycle_groups", ())), certain=bool(data.get("certain", False)),
            waits_for=ints("waits_for"),
            ops=tuple(OpFacts(str(f["text"]), str(f["op"]), str(f["dtype"]), tuple(int(d) for d in f["sizes"]),
                              int(f["tensors"]), str(f["reduce_op"])) for f in data.get("shown_ops", ())),
            text=str(data["text"]))


# Where a guard error's facts come from, and the notes its text gains where it
# is read: registered by the modules that know them (torch_ext/backend.py: the
# C++ core's record of the failure; torch_ext/_ddp.py: DDP's gradient buckets),
# so that this module imports nothing of torch_ext's.
_report_source: list[Callable[[str], str | None]] = []
_annotators: list[Callable[[str, Report | None], str]] = []


def set_report_source(source: Callable[[str], str | None]) -> None:
    """``source(text)``: the JSON facts of the failure a guard error's text reports, or None."""
    _report_source[:] = [source]


def add_annotator(annotate: Callable[[str, Report | None], str]) -> None:
    """``annotate(text, report) -> text`` rewrites every guard error's text when first read (in order of adding)."""
    if annotate not in _annotators:
        _annotators.append(annotate)


def _report_of(text: str) -> Report | None:
    for source in _report_source:
        facts = source(text)
        if facts is not None:
            return Report.from_json(json.loads(facts))
    return None


def _annotated(text: str, report: Report | None) -> str:
    for annotate in _annotators:
        try:
            text = annotate(text, report)
        except Exception:  # noqa: BLE001 - the error's own text, whatever a note does
            pass
    return text


class GuardError(dist.DistBackendError):
    """Base class: a guarded process group failed and says why, naming ranks.

    Its text is the guard's report; where this process runs DDP, each all_reduce
    line of a gradient bucket is followed by the bucket and its parameters
    (torch_ext/_ddp.py, through add_annotator), read once, when the text is first read.
    ``report`` holds the same facts as values (:class:`Report`: ranks, call sites, kind).
    """

    @property
    def report(self) -> Report | None:
        """The facts of this error's report; None for an error no guarded group of this process raised."""
        text = super().__str__()
        cached = self.__dict__.get("_torch_ext_report")
        if cached is None or cached[0] != text:
            try:
                report = _report_of(text)
            except Exception:  # noqa: BLE001 - a record that cannot be read is no report
                report = None
            cached = (text, report)
            self.__dict__["_torch_ext_report"] = cached
        return cached[1]

    def __str__(self) -> str:
        text = super().__str__()
        noted = self.__dict__.get("_torch_ext_text")
        if noted is None or noted[0] != text:
            noted = (text, _annotated(text, self.report))
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
