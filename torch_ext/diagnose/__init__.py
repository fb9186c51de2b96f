"""Post-mortem analysis of torch_ext dumps: ``python -m torch_ext.diagnose DUMP_DIR``.

Every rank of a guarded job writes ``rank<N>.json`` into ``TORCH_EXT_DUMP_DIR``
whenever a report is made (hang, mismatch, failure) or on ``torch_ext.dump()``.
This reads those files alone (no running job needed), runs the same cross-rank
analysis as the live reports, and prints it. It can also write the dumps out for
other tools: ``--fr`` PyTorch Flight Recorder files for ``torchfrtrace``
(``flight_recorder.py``), ``--trace`` a Chrome Trace Event / Perfetto JSON
(``trace.py``) and ``--html`` a self-contained page (``html.py``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from torch_ext import _C

__all__ = ["Dump", "BadFile", "Analysis", "load_dir", "analyze_dir", "format_text", "culprits", "group_sizes"]


@dataclasses.dataclass
class Dump:
    path: str
    rank: int
    data: dict[str, Any]
    text: str


@dataclasses.dataclass
class BadFile:
    path: str
    reason: str


@dataclasses.dataclass
class Analysis:
    dumps: list[Dump]
    bad: list[BadFile]
    verdicts: list[dict[str, Any]]  # one per group

    @property
    def ranks(self) -> list[int]:
        return sorted(d.rank for d in self.dumps)


def load_dir(path: str | os.PathLike[str]) -> tuple[list[Dump], list[BadFile]]:
    """Reads every file in ``path``; returns the valid dumps and the bad files with reasons."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path!r} is not a directory (pass the TORCH_EXT_DUMP_DIR of the job)")
    dumps: list[Dump] = []
    bad: list[BadFile] = []
    seen: dict[int, str] = {}
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            continue
        size = os.path.getsize(full)
        if size > _C.MAX_DUMP_BYTES:
            # Refused unread: a dump never comes near this, and reading it could exhaust memory.
            bad.append(BadFile(full, f"{size >> 20} MiB, over the {_C.MAX_DUMP_BYTES >> 20} MiB a dump may hold "
                                     "(not a torch_ext dump?)"))
            continue
        try:
            with open(full, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            bad.append(BadFile(full, "not a text file (binary content)"))
            continue
        except OSError as e:
            bad.append(BadFile(full, f"cannot be read: {e.strerror}"))
            continue
        if not text.strip():
            bad.append(BadFile(full, "empty file"))
            continue
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            # The text ended where more was due: at its end, or inside a string that never closed.
            ended = e.pos >= len(text.rstrip()) - 1 or e.msg.startswith("Unterminated string")
            what = "truncated JSON" if ended else "invalid JSON"
            bad.append(BadFile(full, f"{what}: {e.msg} at line {e.lineno} column {e.colno}"))
            continue
        try:
            rank, _groups = _C._check_snapshot(text, os.path.basename(full))
        except ValueError as e:
            bad.append(BadFile(full, f"not a valid torch_ext dump: {e}"))
            continue
        if rank in seen:
            bad.append(BadFile(full, f"second dump for rank {rank} (first: {os.path.basename(seen[rank])}); ignored"))
            continue
        seen[rank] = full
        dumps.append(Dump(full, rank, data, text))
    return dumps, bad


def analyze_dir(path: str | os.PathLike[str]) -> Analysis:
    dumps, bad = load_dir(path)
    verdicts = [json.loads(v) for v in _C._analyze_dumps([d.text for d in dumps])] if dumps else []
    return Analysis(dumps, bad, verdicts)


def group_sizes(dumps: list[Dump]) -> dict[str, int]:
    """Group name -> size, from whichever dumps hold the group."""
    sizes: dict[str, int] = {}
    for d in dumps:
        for g in d.data.get("groups", []):
            sizes[g["name"]] = int(g["size"])
    return sizes


_P2P_RANK = re.compile(r"^\s*(?:but )?rank (\d+)(?::| has )", re.M)


def culprits(verdict: dict[str, Any]) -> dict[int, str]:
    """The ranks a verdict blames (global rank -> why), for the HTML page and the trace.

    A hang or failure blames the ranks that have not arrived and those that are
    gone. A collective mismatch blames the ranks outside the largest group of
    identical calls (every named rank when there is no single largest group); a
    send/recv that does not pair blames both sides.
    """
    kind = verdict.get("kind")
    out: dict[int, str] = {}
    if kind in ("hang", "failure"):
        for r in verdict.get("not_arrived", []):
            out[int(r)] = "has not arrived"
        for r in verdict.get("gone", []):
            out[int(r)] = "is gone"
    elif kind == "mismatch" and verdict.get("ranks"):
        calls: dict[str, list[int]] = {}
        for line in verdict["ranks"]:
            calls.setdefault(line["op"] if line.get("issued", True) else "(not issued)", []).append(int(line["rank"]))
        largest = max(len(v) for v in calls.values())
        majority = [op for op, rs in calls.items() if len(rs) == largest]
        for op, rs in calls.items():
            if len(majority) > 1 or op not in majority:
                for r in rs:
                    out[r] = f"differs: {op}"
    elif kind == "mismatch":
        for m in _P2P_RANK.finditer(verdict.get("text", "")):
            out[int(m.group(1))] = "send/recv does not pair"
    return dict(sorted(out.items()))


def format_text(a: Analysis) -> str:
    lines: list[str] = []
    world = max(group_sizes(a.dumps).values(), default=0)
    lines.append(f"torch_ext diagnose: {len(a.dumps)} dump(s) from rank(s) {_ranks(a.ranks)}")
    missing = [r for r in range(world) if r not in a.ranks]
    if missing:
        lines.append(f"no dump from rank(s) {_ranks(missing)}: gone, frozen, or never reached a report")
    for b in a.bad:
        lines.append(f"bad file {b.path}: {b.reason}")
    for v in a.verdicts:
        lines.append("")
        label = v.get("group", v.get("group_name", "?"))
        if v["kind"] == "none" and not v.get("pending"):
            lines.append(f'group "{label}": nothing pending, no mismatch found')
            continue
        lines.append(v["text"])
    return "\n".join(lines)


def _ranks(ranks: list[int]) -> str:
    return ",".join(str(r) for r in ranks) if ranks else "(none)"
