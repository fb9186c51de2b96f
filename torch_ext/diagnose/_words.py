"""Small pieces of the diagnose reports' words, shared by the text, live, HTML and trace outputs.

Each reads the dump and snapshot dicts (``torch_ext.diagnose`` documents them) and writes
what the C++ reports write for the same thing.
"""
from __future__ import annotations

import datetime
import os
from typing import Any


def call_site(frames: list[dict[str, Any]]) -> str:
    """The innermost frame as a call site: "train.py:40 in step"."""
    if not frames:
        return "(unknown call site)"
    f = frames[0]
    return f"{os.path.basename(f['filename'])}:{f['line']} in {f['name']}"


def global_rank(group: dict[str, Any], group_rank: int) -> int:
    """The global rank of ``group_rank`` in a dump's group (its "ranks"; identity when absent)."""
    ranks = group.get("ranks", [])
    return int(ranks[group_rank]) if 0 <= group_rank < len(ranks) else group_rank


def rank_list(ranks: list[int]) -> str:
    """[0, 2, 3] -> "0,2,3"; [] -> "(none)"."""
    return ",".join(str(r) for r in ranks) if ranks else "(none)"


def utc(ns: int, date: bool = True) -> str:
    """A wall-clock time in nanoseconds as "2026-11-27 21:30:05 UTC" (or "21:30:05 UTC")."""
    fmt = "%Y-%m-%d %H:%M:%S UTC" if date else "%H:%M:%S UTC"
    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.timezone.utc).strftime(fmt)
