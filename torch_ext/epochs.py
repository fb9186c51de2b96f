"""Uneven data named at its first epoch, while the collectives still pair (issue 39).

A sampler or shard split that gives ranks different batch counts (multi-scale
bucket samplers, WebDataset shards split unevenly) does not fail where it
starts: the ranks' collectives keep pairing, the gradient all_reduces of one
rank's second epoch with another's first (same shapes, averaged gradients of
different steps), and the job fails or hangs only where one rank leaves the
loop for good. Each rank knows its own count the moment a ``DataLoader``'s
iterator runs out; compared across ranks at the end of the first epoch that
shows a difference, it names the cause while the job still runs::

    [rank1] torch_ext WARNING: uneven data: epoch 0 of the loop at train.py:60 in <module> (batch sampler
    BucketSampler) gave the ranks different batch counts: rank 0: 8, rank 1: 7. ...

How: with the default group on ``guard`` (and ``epoch_check``, the default),
three methods of torch's ``_BaseDataLoaderIter`` are wrapped once per process:
``__next__`` (on ``StopIteration`` only: this rank's epoch ended, with its
count), ``__init__`` and ``_reset`` (an epoch begins: a new iterator, or
persistent workers reusing theirs). Nothing runs per collective or per batch
beyond one function call. When a loop that ended an epoch begins the next, the
rank puts its count and the default group's last collective in the store,
under the loop's call site and the epoch's index; the rank that finds every
rank's record there compares them. Uneven counts are reported only when the
next epoch also begins at different collectives on the ranks: that is what
makes them pair collectives of different steps. Loops that realign between
epochs (``Join``, ``even_batches(policy="join")``, whose ranks that ran out
shadow the others' collectives) and loops that issue no collective (a
rank-local evaluation) are never reported. The store work runs on a thread of
its own, so a slow or lost store never holds the training loop; a warning is
logged once per loop.
"""
from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import zlib
from typing import Any

import torch
import torch.distributed as dist

from torch_ext import _compat
from torch_ext._core import _C

__all__: list[str] = []

_log = logging.getLogger("torch_ext")


class _Watch:
    """The default group's store and size, and what this rank has seen."""

    def __init__(self, store: Any, rank: int, size: int) -> None:
        self.store = store
        self.rank = rank
        self.size = size
        self.ended: dict[str, int] = {}  # loop site -> epochs ended on this rank
        # Loop site -> (epoch, batches, sampler) of an epoch that ended and whose
        # loop has not begun its next one yet.
        self.pending: dict[str, tuple[int, int, str]] = {}
        self.warned: set[str] = set()
        self.loops: set[str] = set()  # the loops' store names (CRC-32 of the site) this rank wrote records of


_watch: _Watch | None = None
_patched = False
_jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
_worker: threading.Thread | None = None
_lock = threading.Lock()


def install(store: Any, rank: int, size: int) -> None:
    """Watches the epochs of this process's DataLoaders (called by the guard's
    creator for the default group, with its store, rank and size)."""
    global _watch, _patched
    with _lock:
        _watch = _Watch(store, rank, size) if size > 1 else None
        if _patched or _watch is None:
            return
        base = _compat.dataloader_iter_class()
        init, reset, next_ = base.__init__, base._reset, base.__next__

        def _begin(it: Any) -> None:
            if _watch is not None and _watch.pending:
                _began(sys._getframe(2))

        # An epoch begins in __init__ (a new iterator) or in _reset (persistent
        # workers reuse theirs).
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            self._torch_ext_ended = False
            _begin(self)

        def _reset(self: Any, *args: Any, **kwargs: Any) -> None:
            reset(self, *args, **kwargs)
            self._torch_ext_ended = False
            _begin(self)

        def __next__(self: Any) -> Any:
            try:
                return next_(self)
            except StopIteration:
                _ended(self, sys._getframe(1))
                raise

        __init__.__wrapped__ = init  # type: ignore[attr-defined]
        _reset.__wrapped__ = reset  # type: ignore[attr-defined]
        __next__.__wrapped__ = next_  # type: ignore[attr-defined]
        base.__init__ = __init__
        base._reset = _reset
        base.__next__ = __next__
        _patched = True


def stop() -> None:
    """No longer compares epochs (a default group created with ``epoch_check`` off)."""
    global _watch
    _watch = None


def _last_seq() -> int:
    """The default group's last collective, if it is a guard group (-1: not watched).
    Looked up each time: a reference held here would keep a destroyed group alive."""
    if _watch is None or not dist.is_initialized():
        return -1
    try:
        backend = _compat.group_backend(_compat.default_group(), torch.device("cpu"))
        return int(_C._last_seq(backend)) if _C._is_guard(backend) else -1
    except Exception:  # noqa: BLE001 - no such backend: not watched
        return -1


_DATA_DIR = os.path.dirname(torch.utils.data.__file__)


def _site(frame: Any) -> str:
    """The loop's line: the first frame outside torch.utils.data and this module
    (the ``for`` statement that iterates the DataLoader, or a trainer's fetcher)."""
    while frame is not None and (frame.f_code.co_filename.startswith(_DATA_DIR)
                                 or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"


def _sampler_name(it: Any) -> str:
    s, batched = _compat.index_sampler(it)
    if s is None:
        return ""
    inner = getattr(s, "sampler", None)
    if type(s) is torch.utils.data.BatchSampler and inner is not None:
        return f"sampler {type(inner).__name__}"
    return f"{'batch sampler' if batched else 'sampler'} {type(s).__name__}"


def _ended(it: Any, caller: Any) -> None:
    """This rank's epoch of the loop at ``caller`` ended (its iterator ran out)."""
    w = _watch
    if w is None or getattr(it, "_torch_ext_ended", False):
        return  # a next() after the end: counted once
    it._torch_ext_ended = True
    site = _site(caller)
    epoch = w.ended.get(site, 0)
    w.ended[site] = epoch + 1
    # Also after a warning: the records go on, so that each epoch's are deleted.
    w.pending[site] = (epoch, _compat.batches_yielded(it), _sampler_name(it))


def _began(caller: Any) -> None:
    """A loop begins an epoch: if it ended one before, that epoch's record goes out,
    with the collective this rank begins the next one at."""
    w = _watch
    if w is None:
        return
    site = _site(caller)
    ended = w.pending.pop(site, None)
    seq = _last_seq()
    if ended is None or seq < 0:
        return
    epoch, count, sampler = ended
    _submit((w, site, sampler, epoch, count, seq))


def _submit(job: Any) -> None:
    global _worker
    with _lock:
        if _worker is None or not _worker.is_alive():
            _worker = threading.Thread(target=_work, name="torch_ext-epochs", daemon=True)
            _worker.start()
    _jobs.put(job)


def _flush(timeout: float = 10.0) -> bool:
    """Waits until the epoch checks submitted so far have run (tests; True when they have)."""
    done = threading.Event()
    _submit(done)
    return done.wait(timeout)


def _work() -> None:
    while True:
        job = _jobs.get()
        if isinstance(job, threading.Event):
            job.set()
            continue
        try:
            _compare(*job)
        except Exception as e:  # noqa: BLE001 - a lost store, a destroyed group: never the job's problem
            _log.debug("torch_ext: the epoch check could not run: %s: %s", type(e).__name__, e)


def _compare(w: _Watch, site: str, sampler: str, epoch: int, count: int, next_seq: int) -> None:
    # The keys and their lifetimes: csrc/guard/store/StoreKeys.h (epochRecord, epochClaim, epochWarned).
    loop = f"{zlib.crc32(site.encode()):08x}"
    w.loops.add(loop)
    w.store.set(_C._epoch_record_key(loop, epoch, w.rank), f"{count} {next_seq}")
    keys = [_C._epoch_record_key(loop, epoch, r) for r in range(w.size)]
    if not w.store.check(keys):
        return  # a rank has not begun the next epoch yet: the last one to begin it compares
    if w.store.add(_C._epoch_claim_key(loop, epoch), 1) != 1:
        return  # another rank found them all first and compares
    records = [tuple(int(v) for v in value.decode().split()) for value in w.store.multi_get(keys)]
    for key in keys:
        w.store.delete_key(key)
    if epoch > 0:
        w.store.delete_key(_C._epoch_claim_key(loop, epoch - 1))
    if site in w.warned:
        return
    counts = [n for n, _ in records]
    seqs = [s for _, s in records]
    if len(set(counts)) < 2 or len(set(seqs)) < 2:
        return  # even, or realigned before the next epoch (Join shadowing the missing steps)
    w.warned.add(site)
    if w.store.add(_C._epoch_warned_key(loop), 1) != 1:
        return  # another rank warned about this loop
    by_count: dict[int, list[int]] = {}
    for r, n in enumerate(counts):
        by_count.setdefault(n, []).append(r)
    parts = [f"{_ranks(rs)}: {n}" for n, rs in sorted(by_count.items(), reverse=True)]
    by_seq: dict[int, list[int]] = {}
    for r, n in enumerate(seqs):
        by_seq.setdefault(n, []).append(r)
    starts = [f"{_ranks(rs)} after #{n}" for n, rs in sorted(by_seq.items(), reverse=True)]
    what = f" ({sampler})" if sampler else ""
    _log.warning(
        "uneven data: epoch %d of the loop at %s%s gave the ranks different batch counts: %s; epoch %d began "
        "at different collectives (%s), so from here on the ranks pair collectives of different steps (DDP "
        "averages gradients of different steps), and the job will hang or fail where the ranks with more batches "
        "go on alone. Give every rank the same number of batches: torch_ext.BucketBatchSampler, "
        "torch_ext.even_batches, or DistributedSampler's padding (TORCH_EXT_EPOCH_CHECK=0 turns this "
        "warning off)",
        epoch, site, what, "; ".join(parts), epoch + 1, "; ".join(starts),
    )


def _ranks(rs: list[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ",".join(map(str, rs))
