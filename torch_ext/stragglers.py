"""Straggler report: which rank the others wait for, before anything is stuck.

Every rank times each collective from issue to completion on its own clock;
the rank that arrives last waits least. The guard sums those waits over
windows of collectives defined by sequence numbers (no clock agrees across
hosts), every rank publishes its windows in the status record it writes
anyway, and the group's rank 0 compares them: a rank is a straggler in a
window when the other ranks' median wait exceeds its own by at least the
``straggler`` share of the window's time (``TORCH_EXT_STRAGGLER``, default
0.05; ``off`` turns the analysis off). It is *named* when that holds at one
call site in at least 3 of the last 32 windows and in at least half of the
windows whose waits were heaviest there: a rank slow only in validation is
named with validation's call site. Rank 0 logs a rate-limited warning.

:func:`stragglers` returns the analysis on any rank (rank 0's own, or what it
last wrote to the store) as a :class:`StragglerReport` that a training loop
can log (:meth:`StragglerReport.metrics`). Each call on a rank other than 0 is
one store read: call it every few steps, not every collective.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from torch_ext._core import _C
from torch_ext._groups import group_state, guard_backend

__all__ = ["Straggler", "StragglerReport", "stragglers"]


@dataclass(frozen=True)
class Straggler:
    """A rank the others waited for.

    ``extra_s_per_step`` is ``extra_s_per_collective`` times the collectives
    of one training step (the period of the recent collectives' pattern of call
    sites and shapes); None when no period shows, or for a ``phase``, whose
    ``extra_s_per_collective`` counts the collectives at its site only.
    """

    rank: int  # global rank
    host: str
    site: str  # where the others waited most: "train.py:40 in step"
    phase: bool  # the site is a phase of the loop (validation, ...), not its main step
    windows: int  # windows of collectives in which it was the straggler there
    site_windows: int  # windows whose waits were heaviest there
    first_seq: int
    last_seq: int
    lost_s: float  # over those windows: the others' mean wait minus its own
    share: float  # lost_s over the windows' median time
    extra_s_per_collective: float
    extra_s_per_step: float | None
    own_wait_share: float  # its wait over its time, in those windows
    others_wait_share: float  # the same, median of the other ranks
    waited_ranks: int
    text: str  # the warning rank 0 logs

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class StragglerReport:
    """The straggler analysis of one group (see the module's docstring)."""

    group: str
    size: int
    threshold: float
    analysed_up_to: int  # the last collective seq analysed (0: nothing yet)
    collectives_per_step: float | None
    stragglers: list[Straggler] = field(default_factory=list)
    # The last windows analysed: first_seq, last_seq, wait_s and span_s per
    # group rank, the call site where the others waited most, and the late ranks.
    windows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def straggler(self) -> Straggler | None:
        """The straggler that cost the others most, if any."""
        return self.stragglers[0] if self.stragglers else None

    def wait_shares(self) -> dict[int, float]:
        """Each rank's share of its time spent waiting in the group's collectives over
        :attr:`windows`, by group rank: the straggler's is the lowest."""
        waits: dict[int, float] = {}
        spans: dict[int, float] = {}
        for w in self.windows:
            for r, (wait, span) in enumerate(zip(w["wait_s"], w["span_s"])):
                waits[r] = waits.get(r, 0.0) + wait
                spans[r] = spans.get(r, 0.0) + span
        return {r: waits[r] / spans[r] for r in sorted(waits) if spans[r] > 0}

    def metrics(self, prefix: str = "straggler/") -> dict[str, float]:
        """Scalars for a logger: ``straggler/rank`` (-1: none), ``straggler/extra_ms_per_step``
        (per collective when steps are unknown), ``straggler/share``,
        ``straggler/own_wait_share``, ``straggler/others_wait_share``, ``straggler/count``."""
        s = self.straggler
        per_step = None if s is None else (s.extra_s_per_step if s.extra_s_per_step is not None
                                           else s.extra_s_per_collective)
        return {
            f"{prefix}count": float(len(self.stragglers)),
            f"{prefix}rank": float(s.rank) if s else -1.0,
            f"{prefix}extra_ms_per_step": per_step * 1e3 if per_step is not None else 0.0,
            f"{prefix}share": s.share if s else 0.0,
            f"{prefix}own_wait_share": s.own_wait_share if s else 0.0,
            f"{prefix}others_wait_share": s.others_wait_share if s else 0.0,
        }

    def __str__(self) -> str:
        if not self.stragglers:
            upto = f"collective {self.analysed_up_to}" if self.analysed_up_to else "nothing analysed yet"
            return f'no straggler on group "{self.group}" ({upto})'
        return "\n".join(s.text for s in self.stragglers)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "StragglerReport":
        named = [Straggler(**{k: s[k] for k in Straggler.__dataclass_fields__}) for s in data.get("stragglers", [])]
        return cls(group=data["group"], size=data["size"], threshold=data["threshold"],
                   analysed_up_to=data["analysed_up_to"], collectives_per_step=data.get("collectives_per_step"),
                   stragglers=named, windows=list(data.get("windows", [])))


def stragglers(group: dist.ProcessGroup | None = None) -> StragglerReport:
    """The straggler analysis of ``group`` (default: the default group).

    On the group's rank 0 (the analyst) this is its latest analysis; on other
    ranks what rank 0 last wrote to the store (when whom it names changes, else
    every 10 s), read with one bounded store call. Before the first analysis
    (or with ``straggler="off"``) the report names nobody and
    ``analysed_up_to`` is 0.
    """
    backend = guard_backend(group)
    text = _C._stragglers(backend)
    if text:
        return StragglerReport.from_json(json.loads(text))
    state = group_state(group, 1)
    threshold = float(_C._config(backend).get("straggler", 0.0) or 0.0)
    return StragglerReport(group=state.get("desc") or state.get("name", ""), size=int(state.get("size", 0)),
                           threshold=threshold, analysed_up_to=0, collectives_per_step=None)
