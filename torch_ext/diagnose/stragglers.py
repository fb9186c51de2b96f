"""Who the others wait for: the watchdog's straggler rule, on the wait windows of dumps or live snapshots.

Every rank's dump file and live snapshot carries its closed wait windows (for
windows of 4, 32, 256 and 2,048 consecutive collectives: how long the rank had
one of them pending, the window's span on its own clock, and the call site
where it waited most), up to the last 32 of each size. The rule is the C++
``StragglerBoard``'s, the one behind the running job's warning and
:func:`torch_ext.stragglers` (``_C._stragglers_from_dumps``), so the live
warning, ``stragglers()``, the post-mortem and the live report name the same
ranks:

- windows are compared at the finest size that every rank shows and that lasts
  0.1 s or more (a few of DDP's overlapping buckets tell noise);
- in a window, a rank is late when the median wait of the others exceeds its
  own by the straggler threshold (``TORCH_EXT_STRAGGLER``, 5% by default) of
  the window's span: it arrived last and they waited for it;
- a rank is named when it was late in at least 3 windows, and in at least half
  of the windows whose waits were heaviest at the same call site.

Only durations are compared, so the ranks' clocks need not agree. Dumps of
torch_ext before the windows were carried give no straggler section.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from torch_ext._core import _C

__all__ = ["stragglers_from_snapshots", "format_stragglers"]


def stragglers_from_snapshots(snapshots: Iterable[dict[str, Any] | str]) -> list[dict[str, Any]]:
    """One dict per group, from dump or live-snapshot dicts (or their JSON texts)::

        {"group": label, "group_name": name, "size", "threshold",
         "first_seq", "last_seq", "collectives",       # the windows analysed (None, None, 0: none)
         "collectives_per_step",                        # a step's collectives when one is named, else None
         "ranks": [{"rank" (global), "wait_s", "span_s", "wait_share"}],   # over those windows
         "stragglers": [{"rank", "site", "text", "lost_s", "extra_s_per_collective", "share", ...}],
         "windows": [{"first_seq", "last_seq", "wait_s": [...], "span_s": [...], "site", "late": [...]}]}

    The fields of ``stragglers`` and ``windows`` are those of :func:`torch_ext.stragglers`.
    """
    texts = [s if isinstance(s, str) else json.dumps(s) for s in snapshots]
    return [json.loads(t) for t in _C._stragglers_from_dumps(texts)] if texts else []


def format_stragglers(results: list[dict[str, Any]], prefix: str = "") -> list[str]:
    """The text report's section: each named straggler in the watchdog's words, then its group's wait
    shares; [] if nobody is named."""
    lines: list[str] = []
    for g in results:
        if not g["stragglers"]:
            continue
        lines.extend(prefix + s["text"] for s in g["stragglers"])
        lines.append(f'  time each rank waited in collectives {g["first_seq"]}-{g["last_seq"]}: ' +
                     ", ".join(f'rank {r["rank"]} {r["wait_share"]:.0%}' for r in g["ranks"]))
    return ["", "Stragglers:", *lines] if lines else []
