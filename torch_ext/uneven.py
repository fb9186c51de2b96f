"""Uneven data: a loop over per-rank data that ends on every rank at the same step.

:func:`even_batches` iterates this rank's data while every rank has a next
batch and no rank asked to stop. Each step costs one
:class:`~torch_ext.step_sync.StepSync` all_reduce, which carries the stop flag
and whether this rank has a next batch. Under ``policy="join"`` the ranks that
ran out shadow DDP's collectives through its own join hook, with the count of
ranks that had data taken from that same all_reduce.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence, TypeVar

import torch
import torch.distributed as dist

from torch_ext import _compat
from torch_ext.step_sync import PendingStepSync, StepSync, StepSyncResult, StopLike

__all__ = ["EvenBatches", "even_batches"]

T = TypeVar("T")

_POLICIES = ("stop", "join")
_END = object()


def _count_work(value: int) -> Any:
    """A completed Work whose future holds one count, for DDP's reducer.

    DDP divides gradients by the number of ranks still training when its
    forward-pass work handle says so (that is how ``Join`` passes the count,
    from an extra all_reduce per step); this hands it the count our step sync
    already computed, so no extra collective is needed. The Work is created in
    C++ from a completed future, so the reducer can read it from the autograd
    thread without any Python object having to stay alive.
    """
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result([torch.tensor([value], dtype=torch.int64)])
    return _compat.work_from_future(fut)


class _Pass(Iterator[T]):
    """One pass of :class:`EvenBatches` over its iterable (one epoch)."""

    def __init__(self, owner: EvenBatches[T]) -> None:
        self._owner = owner
        self._iterable = owner.iterable
        self._sync = owner.sync
        self._stop = owner.stop
        self.policy = owner.policy
        self._joinables = owner.joinables
        self.overlap = owner.overlap
        self.steps = 0
        self.reason: str | None = None
        self.last: StepSyncResult | None = None
        self._it: Iterator[T] | None = None
        self._next: Any = _END
        self._pending: PendingStepSync | _Deferred | None = None
        self._done = False
        self._started = False
        self._hooks: list[Any] = []
        self._joining = False
        self._had_data_last = True

    # -- helpers -----------------------------------------------------------
    def _fetch(self) -> Any:
        assert self._it is not None
        try:
            return next(self._it)
        except StopIteration:
            return _END

    def _start_sync(self) -> PendingStepSync:
        return self._sync.start(stop=self._stop, has_data=self._next is not _END)

    def _shutdown(self) -> None:
        it, self._it = self._it, None
        if it is None:
            return
        # DataLoader iterators own worker processes: shut them down now (joined,
        # queues closed) rather than whenever the iterator is garbage collected,
        # which may be never (a framework holding a reference) or at interpreter
        # exit, where it shows up as "worker exited unexpectedly" or as zombie
        # workers. Persistent workers belong to the DataLoader and are reused by
        # its next iter(), so they are left alone.
        shutdown = _compat.worker_shutdown(it)
        persistent = bool(getattr(self._iterable, "persistent_workers", False))
        if shutdown is not None and not persistent:
            shutdown()
        close = getattr(it, "close", None)
        if callable(close) and shutdown is None:
            close()  # generators: run their finally blocks now

    def _set_join_mode(self, ranks_with_data: int, enable: bool) -> None:
        for j in self._joinables:
            # is_first_joinable=False: DDP must not run Join's own per-step
            # counting all_reduce; the step sync already counted.
            config = _compat.join_config(enable=enable, throw_on_early_termination=False, is_first_joinable=False) \
                if enable else _compat.disabled_join_config()
            _compat.set_join_config(j, config)
            reducer = getattr(j, "reducer", None)
            if reducer is not None:
                # useStaticWorldSize=False: divide by our count; True: back to the world size.
                _compat.set_forward_pass_work_handle(reducer, _count_work(ranks_with_data), not enable)

    def _finish(self, reason: str) -> None:
        if self._done:
            return
        self._done = True
        self.reason = reason
        self._shutdown()
        if self._joining:
            # Everyone agrees the loop is over: the ranks that trained last hand
            # their model to the others (DDP's post-hook broadcasts it), then
            # DDP goes back to dividing by the full world size.
            self._set_join_mode(self._sync.world_size, False)
            for hook in self._hooks:
                hook.post_hook(self._had_data_last)
            self._joining = False

    # -- iteration ---------------------------------------------------------
    def __iter__(self) -> _Pass[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        try:
            return self._advance()
        except StopIteration:
            raise
        except BaseException:
            # An error on this rank: do not leave DataLoader workers behind.
            self._done = True
            self._shutdown()
            raise

    def _advance(self) -> T:
        if not self._started:
            self._started = True
            self._it = iter(self._iterable)
            self._next = self._fetch()  # prefetch: know whether this rank has data before the sync
            if self._joinables:
                self._hooks = [j.join_hook(divide_by_initial_world_size=False) for j in self._joinables]
            self._pending = self._start_sync()
        while True:
            pending, self._pending = self._pending, None
            assert pending is not None
            out = pending.wait()
            self.last = out
            if out.stop:
                self._finish("stop")
                raise StopIteration
            if not out.any_has_data:
                self._finish("exhausted")
                raise StopIteration
            if self.policy == "stop" and not out.all_have_data:
                self._finish("data")
                raise StopIteration
            mine = self._next is not _END
            if not out.all_have_data and self._joinables:
                # policy "join" and some rank ran out: from now on DDP runs in
                # join mode, dividing by the ranks that still have data.
                self._joining = True
                self._set_join_mode(out.ranks_with_data, True)
            self._had_data_last = mine
            if mine:
                batch = self._next
                self._next = self._fetch()  # prefetch the next batch now, so the next sync knows
                if self._next is _END:
                    self._shutdown()  # out of data: release the workers while the others finish
                self._pending = self._start_sync() if self.overlap else _Deferred(self)
                self.steps += 1
                return batch  # type: ignore[return-value]
            # No data here but others still have some (policy "join"): shadow
            # the joinables' collectives for this step, in the same order
            # relative to the next sync as the ranks that train.
            if self.overlap:
                self._pending = self._start_sync()
            for hook in self._hooks:
                hook.main_hook()
            if not self.overlap:
                self._pending = self._start_sync()

    def close(self) -> None:
        """Ends this pass on THIS rank only: waits for a sync in flight, shuts the data down."""
        pending, self._pending = self._pending, None
        if isinstance(pending, PendingStepSync):
            pending.wait()
        if not self._done:
            self._done = True
            self._shutdown()

    def __del__(self) -> None:
        # Only release the data here. A sync still in flight is not waited for:
        # if the other ranks never started it, waiting would hang a finaliser.
        try:
            if not self._done and self._it is not None:
                self._shutdown()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass


class EvenBatches(Iterable[T]):
    """What :func:`even_batches` returns: iterate it once per epoch, like a DataLoader.

    Each ``iter()`` starts a new pass over the wrapped iterable (a new epoch);
    iterating it directly in a ``for`` loop does that. After a pass, ``steps`` is
    the number of batches this rank yielded, ``reason`` says why the pass ended
    (``"stop"``: a rank asked to stop; ``"data"``: a rank ran out under policy
    ``"stop"``; ``"exhausted"``: every rank ran out) and ``last`` is the last
    :class:`StepSyncResult`.
    """

    def __init__(self, iterable: Iterable[T], group: dist.ProcessGroup | None = None, stop: StopLike = None, *,
                 policy: str = "stop", joinables: Sequence[Any] | None = None, overlap: bool | None = None,
                 sync: StepSync | None = None) -> None:
        if policy not in _POLICIES:
            raise ValueError(f"even_batches: policy must be one of {_POLICIES}, got {policy!r}")
        if joinables and policy != "join":
            raise ValueError("even_batches: joinables=... only applies to policy='join'")
        if not hasattr(iterable, "__iter__"):
            raise TypeError(f"even_batches: expected an iterable (DataLoader, IterableDataset, generator, list), "
                            f"got {type(iterable).__name__}")
        self.iterable = iterable
        self.sync = sync if sync is not None else StepSync(group)
        self.stop = stop
        self.policy = policy
        self.joinables = list(joinables or [])
        # Overlapping the sync with the step means the stop flag of step i is
        # seen at step i+1; without a stop flag there is nothing to lose.
        self.overlap = (stop is None) if overlap is None else bool(overlap)
        self._pass: _Pass[T] | None = None

    def __iter__(self) -> _Pass[T]:
        if self._pass is not None and not self._pass._done:
            # A new epoch while the last one is unfinished on this rank: end it
            # here (waiting for its sync in flight) rather than leak it.
            self._pass.close()
        self._pass = _Pass(self)
        return self._pass

    def __next__(self) -> T:
        if self._pass is None:
            self._pass = _Pass(self)
        return next(self._pass)

    @property
    def steps(self) -> int:
        return self._pass.steps if self._pass is not None else 0

    @property
    def reason(self) -> str | None:
        return self._pass.reason if self._pass is not None else None

    @property
    def last(self) -> StepSyncResult | None:
        return self._pass.last if self._pass is not None else None

    @property
    def _it(self) -> Iterator[T] | None:
        return self._pass._it if self._pass is not None else None

    def close(self) -> None:
        """Ends the current pass: waits for the sync in flight and shuts the data iterator down.

        Call it after leaving the loop with ``break`` on every rank at the same
        step (a step budget, say): with ``overlap`` the next step's sync was
        already started on all ranks and is waited for here. Leaving the loop
        on one rank only is what hangs distributed jobs; stop through the
        ``stop`` flag instead, which ends the loop on every rank at the same step.
        """
        if self._pass is not None:
            self._pass.close()

    def __repr__(self) -> str:
        return (f"EvenBatches(policy={self.policy!r}, overlap={self.overlap}, joinables={len(self.joinables)}, "
                f"steps={self.steps}, reason={self.reason!r})")


class _Deferred:
    """Starts the next sync only when it is waited on (overlap=False)."""

    __slots__ = ("_owner",)

    def __init__(self, owner: _Pass) -> None:
        self._owner = owner

    def wait(self) -> StepSyncResult:
        return self._owner._start_sync().wait()


def even_batches(iterable: Iterable[T], group: dist.ProcessGroup | None = None, stop: StopLike = None, *,
                 policy: str = "stop", joinables: Sequence[Any] | None = None, overlap: bool | None = None,
                 sync: StepSync | None = None) -> EvenBatches[T]:
    """Iterates ``iterable`` while every rank has a next batch and no rank asked to stop.

    All ranks leave the loop at the same step, so the collectives that follow
    (validation, checkpointing, ``destroy_process_group``) match up. Each step
    costs one small all_reduce (:class:`StepSync`), which carries the stop flag
    and whether this rank has a next batch; the next batch is prefetched before
    the sync so a rank knows whether it has one.

    Args:
        iterable: this rank's data (a DataLoader, an IterableDataset, a generator).
        group: process group (default: the default group).
        stop: when to stop: a callable returning a truth value (called once per
            step), a flag object with ``is_set()`` (``threading.Event``), a 1-element
            tensor (read on its device, may be updated in place), or a bool.
        policy: ``"stop"`` (default): every rank stops when the first runs out of
            data. ``"join"``: ranks that ran out keep taking part until all are
            done; with ``joinables=[ddp_model, ...]`` they shadow DDP's
            collectives with zero gradients (DDP's own join hook), and gradients
            are averaged over the ranks that had data at that step.
        joinables: ``torch.distributed.algorithms.Joinable`` objects (DDP,
            ZeroRedundancyOptimizer) to shadow under ``policy="join"``. Other
            collectives in the loop body are not shadowed.
        overlap: launch the next step's sync before yielding the current batch,
            so it runs during the training step. The stop flag is then sampled
            one step early (a stop requested during step i ends the loop after
            step i+1, on every rank). Default: on when ``stop`` is None.
        sync: a :class:`StepSync` to use (default: a new one on ``group``).

    DataLoader workers are shut down (joined) as soon as this rank runs out of
    data or the loop ends.
    """
    return EvenBatches(iterable, group, stop, policy=policy, joinables=joinables, overlap=overlap, sync=sync)
