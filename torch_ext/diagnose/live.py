"""Live report of a running guarded job, from outside it: ``torch-ext-diagnose live HOST:PORT``.

The asker is a plain client of the job's store (the one at MASTER_ADDR:MASTER_PORT,
or torchrun's rendezvous endpoint). It finds the default group's keys under
``torch_ext/live`` (written by rank 0 when the group was created), raises a
"live:<token>" request on the group's alert counter, which every rank's
watchdog already reads at each exchange (so a job that is never asked pays
nothing for this), and collects the snapshots the ranks' watchdog threads
write: C++ threads, so a rank answers while its Python holds the GIL in native
code or sleeps, and while it is inside a blocking collective. It then runs the
post-mortem's cross-rank analysis (``_C._analyze_dumps``) on them.

Nothing here waits past the deadline: the store I/O runs on a daemon thread
and the report is made from what came back in time; ranks that did not answer
are named, with their last status in the store (heartbeat age, "exited",
"left").
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
from datetime import timedelta
from typing import Any

from torch_ext._core import _C
from torch_ext.diagnose._words import rank_list, utc
from torch_ext.diagnose.stragglers import format_stragglers, stragglers_from_snapshots

__all__ = ["LiveError", "LiveReport", "RankLive", "parse_ranks", "live_report", "ask", "format_text"]

# Where the asker finds the job (StoreKeys.h, keys::kLiveDirectory, through _C: every key and
# value of the request is written as the C++ side reads it).
DIRECTORY_KEY = _C._live_directory_key()
DEFAULT_TIMEOUT_S = 5.0
# Asking more ranks than this needs --ranks or all_ranks=True: each rank asked writes one snapshot of
# up to about 55 KB + 18 bytes per rank of the job into the store (docs/performance.md, "Live reports").
MAX_RANKS_BY_DEFAULT = 1024
_POLL_S = 0.05


class LiveError(RuntimeError):
    """No live report could be made at all (the store is unreachable, or holds no guarded job)."""


@dataclasses.dataclass
class RankLive:
    """One rank as the live report sees it."""

    rank: int
    answered: bool
    state: str  # "in_collective", "computing", "not_answering", "exited", "left"
    summary: str  # the rank's state line, in words
    host: str | None = None
    pid: int | None = None
    groups: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # one per group (waits + progress)
    stack: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # main thread, innermost first
    stack_note: str = ""
    threads: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # other Python threads: id, name, frames
    snapshot: dict[str, Any] | None = None  # the rank's whole snapshot (dump format), when it answered


@dataclasses.dataclass
class LiveReport:
    """``torch_ext.live_report()`` / ``torch-ext-diagnose live``: the job as it is now."""

    address: str
    world_size: int
    asked_ns: int  # wall clock when the request went out
    elapsed_s: float  # how long collecting took
    timeout_s: float
    ranks: list[RankLive]  # the ranks asked about (--ranks), in order
    answered: list[int]
    not_answered: list[int]
    verdicts: list[dict[str, Any]]  # one per group, as the post-mortem's (kind, text, waiting, not_arrived, ...)
    store_note: str = ""  # set when the store stopped answering while collecting
    exchange_s: float = 0.2  # how often the job's ranks read requests (their exchange period)

    def text(self) -> str:
        return format_text(self)

    def analysis(self):
        """The report as the post-mortem's :class:`torch_ext.diagnose.Analysis` (one "dump" per rank that
        answered), for its outputs: ``html.render(rep.analysis())`` is ``--html``."""
        from torch_ext.diagnose import Analysis, Dump

        dumps = [Dump(f"rank {r.rank} (live)", r.rank, r.snapshot, json.dumps(r.snapshot))
                 for r in self.ranks if r.snapshot is not None]
        return Analysis(dumps, [], self.verdicts)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for r in out["ranks"]:
            r.pop("snapshot", None)
        out["live"] = True
        out["stragglers"] = self.stragglers()
        return out

    def stragglers(self) -> list[dict[str, Any]]:
        """Who the others wait for: the watchdog's rule on every answering rank's wait windows (stragglers.py)."""
        return stragglers_from_snapshots([r.snapshot for r in self.ranks if r.snapshot is not None])


def parse_ranks(spec: str, world_size: int | None = None) -> list[int]:
    """``"0-7,12"`` -> [0..7, 12]; ValueError naming the bad part."""
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise ValueError(f"--ranks {spec!r}: {part!r} is not a rank or a range like 0-7") from None
    if world_size is not None:
        outside = sorted(r for r in out if r < 0 or r >= world_size)
        if outside:
            raise ValueError(f"--ranks {spec!r}: rank(s) {','.join(map(str, outside))} outside the job's "
                             f"{world_size} ranks (0-{world_size - 1})")
    return sorted(out)


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise LiveError(f"{address!r} is not HOST:PORT (pass the job's store address: MASTER_ADDR:MASTER_PORT, "
                        "or torchrun's --rdzv-endpoint)")
    return host.strip("[]"), int(port)


class _Collect:
    """The store side of one request; runs on a daemon thread, leaves what it got in its fields."""

    def __init__(self, host: str, port: int, timeout_s: float | None, wanted: list[int] | None, store: Any = None,
                 all_ranks: bool = False):
        self.host, self.port = host, port
        self.timeout_s = timeout_s
        self.wanted = wanted
        self.store = store
        self.all_ranks = all_ranks
        self.error: BaseException | None = None
        self.directory: dict[str, Any] | None = None
        self.deadline = 0.0
        self.asked_ns = 0
        self.snaps: dict[int, str] = {}
        self.statuses: dict[int, str] = {}
        self.status_read: set[int] = set()  # silent ranks whose status was looked for
        self.done = False
        self.stage = "connecting"

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            self.error = e
        finally:
            self.done = True

    def _run(self) -> None:
        import torch.distributed as dist

        start = time.monotonic()
        first = self.timeout_s if self.timeout_s is not None else DEFAULT_TIMEOUT_S
        store = self.store
        if store is None:
            # A refused connection is known at once; torch's client would retry it until its timeout.
            try:
                socket.create_connection((self.host, self.port), timeout=min(2.0, first)).close()
            except OSError as e:
                raise LiveError(
                    f"the store at {self.host}:{self.port} is unreachable ({e.strerror or e}): the job has ended, "
                    "or its store's host is gone (rank 0's process under a plain env:// rendezvous, torchrun's agent "
                    "otherwise); check the address (MASTER_ADDR:MASTER_PORT, or torchrun's --rdzv-endpoint)") from None
            store = dist.TCPStore(self.host, self.port, is_master=False, wait_for_workers=False,
                                  timeout=timedelta(seconds=max(1.0, first)))
        self.stage = "reading the job's directory"
        if not store.check([DIRECTORY_KEY]):
            raise LiveError(
                f"no guarded job at {self.host}:{self.port}: its store holds no {DIRECTORY_KEY!r} key "
                "(the job does not "
                "use backend='guard', has not reached init_process_group yet, or runs a torch_ext without live "
                "reports); pass the store of the job you mean (MASTER_ADDR:MASTER_PORT, or torchrun's --rdzv-endpoint)")
        self.directory = d = json.loads(store.get(DIRECTORY_KEY))
        prefix, size = str(d["prefix"]), int(d["size"])
        outside = [r for r in (self.wanted or []) if r >= size]
        if outside:
            raise LiveError(f"rank(s) {','.join(map(str, outside))} outside the job's {size} ranks (0-{size - 1}); "
                            "pass ranks the job has")
        asked = self.wanted if self.wanted is not None else list(range(size))
        if self.wanted is None and size > MAX_RANKS_BY_DEFAULT and not self.all_ranks:
            raise LiveError(
                f"the job has {size} ranks: a live report of every one writes about "
                f"{size * (55_000 + 18 * size) / 1e9:.1f} GB of snapshots into its store; pass --ranks (e.g. "
                f"--ranks 0-63), or --all-ranks to ask every rank anyway")
        if self.timeout_s is None:
            # A large group exchanges less often than every tick (the store budget): give it three exchanges.
            self.timeout_s = max(DEFAULT_TIMEOUT_S, 3 * float(d.get("exchange_s", 0.2)) + 1.0)
        self.deadline = start + self.timeout_s
        token = _C._live_request_id(f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}")
        self.stage = "posting the request"
        self.asked_ns = time.time_ns()
        k = store.add(prefix + _C._alerts_key(), 1)
        store.set(prefix + _C._alert_key(k), _C._live_alert(token, self.wanted or [], self.wanted is None))
        snap_key = {r: prefix + _C._snapshot_key(token, r) for r in asked}
        missing = set(asked)
        self.stage = "waiting for the ranks' snapshots"
        while missing:
            batch = sorted(missing)
            final = time.monotonic() >= self.deadline
            if len(batch) > 64 and not final:
                # One call for all while many are missing; rank by rank once few are, or at the deadline.
                found = batch if store.check([snap_key[r] for r in batch]) else []
            else:
                found = [r for r in batch if store.check([snap_key[r]])]
            for r in found:
                self.snaps[r] = store.get(snap_key[r]).decode("utf-8", "replace")
                store.delete_key(snap_key[r])
                missing.discard(r)
            if not missing or final:
                break
            time.sleep(_POLL_S)  # polling the store for the answers, bounded by the deadline
        # The last statuses of those that did not answer (a few store calls each: only while they are few).
        for r in sorted(missing)[:256]:
            self.status_read.add(r)
            key = prefix + _C._status_key(r)
            if store.check([key]):
                self.statuses[r] = store.get(key).decode("utf-8", "replace")
        self.stage = "done"


def ask(address: str, *, timeout: float | None = None, ranks: list[int] | None = None,
        all_ranks: bool = False, _store: Any = None) -> LiveReport:
    """Asks the job whose store is at ``address`` ("HOST:PORT") for a live report; see the module doc.

    ``ranks``: ask only these (global) ranks; the verdict then covers them only.
    Jobs over :data:`MAX_RANKS_BY_DEFAULT` ranks need ``ranks`` or ``all_ranks=True``.
    """
    host, port = _split_address(address)
    c = _Collect(host, port, timeout, ranks, _store, all_ranks)
    t = threading.Thread(target=c.run, name="torch_ext_live", daemon=True)
    t.start()
    start = time.monotonic()
    bound = timeout if timeout is not None else DEFAULT_TIMEOUT_S
    # The directory read decides the default deadline; until then the first bound holds.
    while not c.done:
        limit = c.deadline if c.deadline else start + bound
        if time.monotonic() >= limit + 1.0:  # the last reads after the deadline (statuses of the silent ranks)
            break
        t.join(0.05)
    elapsed = time.monotonic() - start
    if c.error is not None:
        if isinstance(c.error, LiveError):
            raise c.error
        raise LiveError(f"the store at {address} failed while {c.stage}: {c.error}") from c.error
    if c.directory is None:
        raise LiveError(f"the store at {address} does not answer: no reply within {bound:.1f} s while {c.stage} "
                        "(its host is frozen, stopped or overloaded); the job cannot be asked through it")
    store_note = "" if c.done else (f"the store stopped answering while {c.stage}: ranks that had not answered by "
                                    "then are reported as not answering")
    return _build(address, c, elapsed, store_note)


def _secs(ns: int) -> str:
    return f"{max(0, ns) / 1e9:.1f} s"


def _rank_of(c: _Collect, r: int, snap: dict[str, Any] | None, now_ns: int) -> RankLive:
    if snap is None:
        status = _C._decode_status(c.statuses[r]) if r in c.statuses else None
        waited = f"did not answer within {c.timeout_s:.1f} s"
        if status is None and r not in c.status_read:
            return RankLive(r, False, "not_answering", f"{waited} (its last status was not read: too many ranks were "
                                                       "silent)")
        if status is None:
            return RankLive(r, False, "not_answering", f"{waited}; no status in the store (never started, or gone)")
        beat = now_ns - int(status["heartbeat_ns"])
        if status["phase"] == "exited":
            return RankLive(r, False, "exited", f"exited {_secs(beat)} ago after issuing #{status['last_seq']}")
        if status["phase"] == "left":
            return RankLive(r, False, "left", f"left the group (destroy_process_group) {_secs(beat)} ago after "
                                              f"issuing #{status['last_seq']}")
        return RankLive(r, False, "not_answering",
                        f"{waited}: last heartbeat {_secs(beat)} ago, last issued #{status['last_seq']} (process "
                        "stopped, frozen or gone, or its watchdog cannot reach the store)")
    groups: list[dict[str, Any]] = []
    by_name = {g["name"]: g for g in snap.get("groups", [])}
    for w in snap.get("waits", []):
        g = by_name.get(w["group"], {})
        pend = w.get("pending")
        groups.append({
            "group": w["group"],
            "label": w.get("desc") or w["group"],
            "last_seq": w.get("last_seq", 0),
            "last_completed_seq": g.get("last_completed_seq"),
            "last_completed_ns": g.get("last_completed_ns"),
            "pending": pend,
            "pending_s": round((now_ns - int(pend["time_created_ns"])) / 1e9, 3) if pend else None,
            "issued_beyond": (int(w.get("last_seq", 0)) - int(pend["collective_seq_id"])) if pend else 0,
        })
    lines: list[str] = []
    state = "computing"
    for g in groups:
        pend = g["pending"]
        done = g["last_completed_seq"]
        after = f"last completed #{done}" if done is not None else "last completed unknown"
        if pend:
            state = "in_collective"
            beyond = f", issued {g['issued_beyond']} more beyond it" if g["issued_beyond"] > 0 else ""
            lines.append(f"in collective #{pend['collective_seq_id']} {pend['op']} on group \"{g['label']}\" for "
                         f"{g['pending_s']:.1f} s at {pend['where'] or '(unknown call site)'}{beyond}; {after}")
        elif g["last_completed_ns"]:
            lines.append(f"computing since {utc(int(g['last_completed_ns']), date=False)} "
                         f"({_secs(now_ns - int(g['last_completed_ns']))}) "
                         f"after #{done} on group \"{g['label']}\"")
        else:
            lines.append(f"computing: no collective completed yet on group \"{g['label']}\"")
    main = snap.get("main_thread") or {}
    return RankLive(r, True, state, "; ".join(lines) or "no group", snap.get("hostname"), snap.get("pid"), groups,
                    list(main.get("frames", [])), main.get("note", ""), list(snap.get("threads", [])), snap)


def _build(address: str, c: _Collect, elapsed: float, store_note: str) -> LiveReport:
    size = int(c.directory["size"])
    snaps: dict[int, dict[str, Any]] = {}
    texts: list[str] = []
    for r, text in sorted(c.snaps.items()):
        try:
            data = json.loads(text)
            _C._check_snapshot(text, f"rank {r}'s live snapshot")
        except ValueError:
            continue
        snaps[r] = data
        texts.append(text)
    statuses = {r: s for r, s in c.statuses.items() if r not in snaps}
    not_asked = set() if c.wanted is None else set(range(size)) - set(c.wanted)
    verdicts = [json.loads(v) for v in _C._analyze_dumps(texts, statuses, not_asked)] if texts else []
    now_ns = max([int(s.get("time_ns", 0)) for s in snaps.values()] + [c.asked_ns])
    wanted = c.wanted if c.wanted is not None else list(range(size))
    ranks = [_rank_of(c, r, snaps.get(r), now_ns) for r in wanted if 0 <= r < size]
    return LiveReport(address, size, c.asked_ns, round(elapsed, 3), float(c.timeout_s or DEFAULT_TIMEOUT_S), ranks,
                      sorted(snaps), sorted(set(wanted) - set(snaps)), verdicts, store_note,
                      float(c.directory.get("exchange_s", 0.2)))


def _frame(f: dict[str, Any]) -> str:
    """As the reports write a frame (Frame::describe): "train.py:120 in step", "torch .../distributed_c10d.py:..."."""
    base = os.path.basename(str(f.get("filename", "?"))) or "?"
    where = f"{f['library']} .../{base}" if f.get("library") else base
    return f"{where}:{f.get('line', 0)} in {f.get('name', '?')}"


def _stack_lines(frames: list[dict[str, Any]], max_frames: int) -> list[str]:
    """Innermost first, up to the outermost user frame; the library frames beyond it (the launcher) folded."""
    # "<string>", "<frozen runpy>": the interpreter's entry, not the user's code.
    users = [i for i, f in enumerate(frames) if not f.get("library") and not str(f.get("filename", "")).startswith("<")]
    keep = (users[-1] + 1) if users else min(len(frames), 3)
    keep = min(keep, max_frames)
    lines = [_frame(f) for f in frames[:keep]]
    rest = frames[keep:]
    if rest:
        libs = sorted({str(f.get("library") or "entry") for f in rest})
        lines.append(f"... {len(rest)} outer {', '.join(libs)} frame{'s' if len(rest) > 1 else ''} ...")
    return lines


def format_text(rep: LiveReport, max_frames: int = 24) -> str:
    asked = utc(rep.asked_ns)
    n_asked = len(rep.ranks)
    out = [f"torch_ext live report of the job at {rep.address} ({rep.world_size} ranks), asked {asked}; "
           f"{len(rep.answered)} of {n_asked}{'' if n_asked == rep.world_size else ' asked'} answered within "
           f"{rep.elapsed_s:.1f} s (deadline {rep.timeout_s:.1f} s)",
           "[live] lines show the job as it runs now (no deadline has passed for them); [absent] lines come from a "
           "rank's last status in the store"]
    if rep.store_note:
        out.append("note: " + rep.store_note)
    for r in rep.ranks:
        if not r.answered:
            out.append(f"\n[absent] rank {r.rank}: {r.summary}")
            continue
        out.append(f"\n[live] rank {r.rank} (host {r.host}, pid {r.pid}): {r.summary}")
        note = r.stack_note[len("main thread "):] if r.stack_note.startswith("main thread ") else r.stack_note
        note = f" ({note})" if note else ""
        out.append(f"  main thread{note}:" if r.stack else f"  main thread: no Python stack{note}")
        out.extend(f"    {line}" for line in _stack_lines(r.stack, max_frames))
        for t in r.threads:
            out.append(f"  thread {t.get('name') or '(unnamed)'} ({t.get('id', 0):#x}):")
            out.extend(f"    {line}" for line in _stack_lines(list(t.get("frames", [])), max_frames))
    if rep.not_answered:
        out.append(f"\nnot answering: rank(s) {rank_list(rep.not_answered)}")
    for v in rep.verdicts:
        label = v.get("group", v.get("group_name", "?"))
        out.append("")
        if v["kind"] == "none" and not v.get("pending"):
            out.append(f'[live] group "{label}": nothing pending, no mismatch found')
            continue
        out.append(f"[live] {v['text']}")
    out.extend(format_stragglers(rep.stragglers(), prefix="[live] "))
    return "\n".join(out)


def _log_live_report(sig: int) -> None:
    """TORCH_EXT_LIVE_SIGNAL arrived (the watchdog calls this through the runtime): log the job's live report.

    On a thread of its own, so the runtime's helper thread (the one that logs) is free at once.
    """
    import logging
    import signal as _signal

    log = logging.getLogger("torch_ext")
    try:
        name = _signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"

    def run() -> None:
        try:
            rep = live_report()
        except Exception as e:  # noqa: BLE001 - a report that cannot be made is logged, never raised
            log.warning("live report asked by %s: not made: %s", name, e)
            return
        log.warning("live report asked by %s (TORCH_EXT_LIVE_SIGNAL):\n%s", name, format_text(rep))

    threading.Thread(target=run, name="torch_ext_live_signal", daemon=True).start()


def live_report(timeout: float | None = None, ranks: list[int] | None = None) -> LiveReport:
    """The live report of the job this process belongs to (every rank's state and stack, who waits for whom).

    Asks through a connection of its own to the default group's store (never
    the user's connection); returns within ``timeout`` seconds (default 5),
    naming the ranks that did not answer. Raises :class:`LiveError` when the
    store cannot be reached, and RuntimeError outside an initialised guard job.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("torch_ext.live_report() needs an initialised default process group "
                           "(call torch.distributed.init_process_group(backend='guard') first)")
    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    if not isinstance(store, dist.TCPStore):
        raise RuntimeError(f"torch_ext.live_report() needs a TCPStore; this job's store is a {type(store).__name__}")
    return ask(f"{store.host}:{store.port}", timeout=timeout, ranks=ranks)
