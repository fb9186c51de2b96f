"""Post-mortem analysis of torch_ext dumps: ``python -m torch_ext.diagnose DUMP_DIR``.

Every rank of a guarded job writes ``rank<N>.json`` into ``TORCH_EXT_DUMP_DIR``
whenever a report is made (hang, mismatch, failure) or on ``torch_ext.dump()``.
This reads those files alone (no running job needed), runs the same cross-rank
analysis as the live reports, and prints it. It can also write the dumps out for
other tools: ``--fr`` PyTorch Flight Recorder files for ``torchfrtrace``
(``flight_recorder.py``), ``--trace`` a Chrome Trace Event / Perfetto JSON
(``trace.py``) and ``--html`` a self-contained page (``html.py``); and ``--repro``
a script that replays the verdict on any machine's CPU (``repro.py``, run by
``torch_ext.testing.replay``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from torch_ext._core import _C
from torch_ext.diagnose._words import rank_list

__all__ = ["Dump", "BadFile", "Analysis", "JobState", "load_dir", "analyze_dir", "format_text", "culprits",
           "group_sizes", "job_state"]


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


@dataclasses.dataclass
class JobState:
    """What the dumps' states say about the job (each rank's dump follows it: docs/diagnostics.md, "Dump states").

    ``state`` is the job's: "failed" if any rank's dump says so, else "waiting"
    if any still waits, else "finished" if every rank that recovered (or had
    nothing pending) also ended cleanly, else "recovered"; "running" for dumps
    with nothing pending (manual); None when no dump carries a state (written
    by an older torch_ext).
    """

    state: str | None
    ranks: dict[int, dict[str, Any]]  # rank -> written_at, state, state_ns, recovered_ns
    written_at: list[str]  # the causes, in rank order, without repeats
    recovered_ns: int | None  # the last rank's recovery (wall ns)
    finished_ns: int | None  # the last rank's clean end (wall ns)


def job_state(dumps: list[Dump]) -> JobState:
    ranks: dict[int, dict[str, Any]] = {}
    for d in sorted(dumps, key=lambda d: d.rank):
        if isinstance(d.data.get("state"), str):
            ranks[d.rank] = {k: d.data.get(k) for k in ("written_at", "state", "state_ns", "recovered_ns")}
    states = {r["state"] for r in ranks.values()}
    if not states:
        state = None
    elif "failed" in states:
        state = "failed"
    elif "waiting" in states:
        state = "waiting"
    elif states == {"running"}:
        state = "running"
    elif states <= {"finished", "running"} and "finished" in states:
        state = "finished"
    else:
        state = "recovered"
    causes: list[str] = []
    for r in ranks.values():
        if r["written_at"] not in causes:
            causes.append(r["written_at"])
    recovered = [int(r["recovered_ns"]) for r in ranks.values() if r.get("recovered_ns")]
    finished = [int(r["state_ns"]) for r in ranks.values() if r["state"] == "finished" and r.get("state_ns")]
    return JobState(state, ranks, causes, max(recovered) if recovered else None, max(finished) if finished else None)


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


def format_text(a: Analysis, past: bool = False) -> str:
    """The text report; ``past``: the job recovered since the dumps, so each verdict is headed as history."""
    lines: list[str] = []
    world = max(group_sizes(a.dumps).values(), default=0)
    lines.append(f"torch_ext diagnose: {len(a.dumps)} dump(s) from rank(s) {rank_list(a.ranks)}")
    missing = [r for r in range(world) if r not in a.ranks]
    if missing:
        lines.append(f"no dump from rank(s) {rank_list(missing)}: gone, frozen, or never reached a report")
    for b in a.bad:
        lines.append(f"bad file {b.path}: {b.reason}")
    told: set[tuple] = set()  # the deadlocks printed: every group on one finds the same loop
    for v in a.verdicts:
        lines.append("")
        label = v.get("group", v.get("group_name", "?"))
        if v["kind"] == "none" and not v.get("pending"):
            lines.append(f'group "{label}": nothing pending, no mismatch found')
            continue
        loop = _loop(v)
        if loop is not None and loop in told:
            headline, _, first = v["text"].splitlines()[0].partition(": ")
            lines.append(f"{first}: part of the {headline} above")
            continue
        if loop is not None:
            told.add(loop)
        if past:
            lines.append("when the dumps were written (resolved since):")
        lines.append(v["text"])
    return "\n".join(lines)


def _loop(verdict: dict[str, Any]) -> tuple | None:
    """The deadlock a verdict found, as a key equal for every group on it; None: no deadlock."""
    if verdict.get("wait_shape") != "cycle" or not verdict.get("wait_sites"):
        return None
    return tuple(sorted((s["group"], s["collective_seq_id"], tuple(s["waiters"])) for s in verdict["wait_sites"]))
