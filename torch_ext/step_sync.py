"""One collective per step: early stop, has-data and metric means, on every rank at once.

:class:`StepSync` answers three questions with ONE all_reduce
(``torch.ops.torch_ext.step_sync``): does any rank want to stop, do all ranks
still have data, and what are the cross-rank means of a few metrics.
:func:`even_batches` builds on it so that a loop over per-rank data of unknown
or unequal length ends on every rank at the same step.

Why not ``broadcast`` the decision from rank 0? Because the other ranks must be
waiting in the matching broadcast: a rank that decides to stop and ``break``\\ s
leaves the rest blocked in their next collective (and some backends, SageMaker's
SMDDP among them, implement all_reduce but not broadcast). Here every rank calls
the same collective every step, and every rank reads the same answer.
"""
from __future__ import annotations

import zlib
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar, Union

import torch
import torch.distributed as dist

from torch_ext import ops

__all__ = ["StepSync", "StepSyncResult", "PendingStepSync", "EvenBatches", "even_batches"]

T = TypeVar("T")
StopLike = Union[None, bool, int, torch.Tensor, Callable[[], Any], Any]
MetricValue = Union[torch.Tensor, float, int]

_POLICIES = ("stop", "join")


def _metric_signature(keys: Sequence[str]) -> float:
    """A small integer identifying the metric names (and their order).

    On the first call that carries metrics, every rank adds it to one extra slot
    of the packed buffer; the reduced slot equals ``world_size * signature``
    only if all ranks sent the same names, so a rank that reports different
    metrics is caught instead of silently mixing ``loss`` with ``acc``. Later
    calls cannot change the names (checked locally), so they skip the slot.
    crc32 < 2**32 keeps the sum exact in float64 for world sizes below 2**21.
    """
    return float(zlib.crc32("\x1f".join(keys).encode()))


class StepSyncResult:
    """What all ranks agreed on at one step (identical on every rank).

    Attributes read on the host (``stop``, ``ranks_with_data``, ...) cost one
    small device-to-host copy on CUDA the first time; ``metrics`` on CUDA stays
    on the device.
    """

    __slots__ = ("counts", "sums", "keys", "world_size", "_signature", "_host", "_owner", "_means")

    def __init__(self, counts: torch.Tensor, sums: torch.Tensor, keys: tuple[str, ...], world_size: int,
                 signature: float | None, owner: StepSync, host: list | None = None) -> None:
        #: int64 ``[ranks that want to stop, ranks that have data]``.
        self.counts = counts
        #: float64 metric sums over the ranks (a leading signature slot on the first call).
        self.sums = sums
        #: The metric names, in order.
        self.keys = keys
        #: The size of the group the sync ran on.
        self.world_size = world_size
        self._signature = signature
        self._owner = owner
        self._host = host
        self._means: dict[str, torch.Tensor] | None = None

    def _read(self) -> list:
        host = self._host
        if host is None:
            if self._signature is None:
                host = self.counts.tolist()
            else:
                # One copy for the counts and the signature slot.
                host = torch.cat([self.counts.to(torch.float64), self.sums[:1]]).tolist()
            self._host = host
            if self._signature is not None and host[2] != self.world_size * self._signature:
                raise ValueError(
                    f"StepSync ({self._owner._where()}): the ranks sent different metric names; this rank sent "
                    f"{list(self.keys)}. Every rank must pass the same metric names in the same order (a rank "
                    "without data may pass none once the names are known, or declare them with "
                    "StepSync(metrics=[...]))."
                )
        return host

    @property
    def ranks_stopping(self) -> int:
        """How many ranks asked to stop."""
        return int(self._read()[0])

    @property
    def ranks_with_data(self) -> int:
        """How many ranks had data."""
        return int(self._read()[1])

    @property
    def stop(self) -> bool:
        """True when at least one rank asked to stop."""
        return self._read()[0] > 0

    @property
    def all_have_data(self) -> bool:
        """True when every rank had data."""
        return self._read()[1] == self.world_size

    @property
    def any_has_data(self) -> bool:
        """True when at least one rank had data."""
        return self._read()[1] > 0

    @property
    def metrics(self) -> dict[str, torch.Tensor]:
        """Cross-rank means (0-dim float64 tensors), over the ranks that had data.

        NaN when no rank had data. On CUDA they are computed on the device, so
        reading them does not synchronise until you convert them to numbers.
        """
        if self._means is None:
            if not self.keys:
                self._means = {}
            else:
                host = self._read()  # also validates the names on the first call
                sums = self.sums[1:] if self._signature is not None else self.sums
                if sums.is_cuda:
                    means = sums / self.counts[1].to(torch.float64)
                else:
                    means = sums / float(host[1]) if host[1] else torch.full_like(sums, float("nan"))
                self._means = dict(zip(self.keys, means.unbind()))
        return self._means

    def metric(self, name: str) -> float:
        """The cross-rank mean of one metric as a Python float."""
        if name not in self.keys:
            raise KeyError(f"StepSync ({self._owner._where()}): no metric named {name!r}; synced metrics are "
                           f"{list(self.keys)}")
        return float(self.metrics[name])

    def __repr__(self) -> str:
        host = self._read()
        metrics = {k: float(v) for k, v in self.metrics.items()}
        return (f"StepSyncResult(stop={host[0] > 0}, ranks_stopping={int(host[0])}, "
                f"ranks_with_data={int(host[1])}/{self.world_size}, metrics={metrics})")


class PendingStepSync:
    """A step sync whose all_reduce is in flight; :meth:`wait` returns its result.

    On CUDA the counts are copied to pinned host memory on a side stream as soon
    as the collective ends, so reading the decision one step later does not wait
    for the compute queued after it.
    """

    __slots__ = ("_packed", "_keys", "_signature", "_owner", "_result", "_side", "_event", "_host", "_tensors")

    def __init__(self, packed: torch.Tensor, keys: tuple[str, ...], signature: float | None,
                 owner: StepSync) -> None:
        self._packed = packed
        self._keys = keys
        self._signature = signature
        self._owner = owner
        self._result: StepSyncResult | None = None
        self._side: Any = None
        self._event: Any = None
        self._host: torch.Tensor | None = None
        self._tensors: tuple[torch.Tensor, torch.Tensor] | None = None
        if packed.is_cuda:
            self._start_cuda_readback()

    def _start_cuda_readback(self) -> None:
        packed = self._packed
        side = torch.cuda.Stream(device=packed.device)
        side.wait_stream(torch.cuda.current_stream(packed.device))
        with torch.cuda.stream(side):
            counts, sums = ops.fused_step_sync_finish(packed)  # the side stream waits for the collective
            head = counts.to(torch.float64)
            if self._signature is not None:
                head = torch.cat([head, sums[:1]])
            host = torch.empty(head.shape, dtype=torch.float64, pin_memory=True)
            host.copy_(head, non_blocking=True)
            event = torch.cuda.Event()
            event.record(side)
        packed.record_stream(side)
        self._side, self._event, self._host, self._tensors = side, event, host, (counts, sums)

    def is_completed(self) -> bool:
        """True when the result can be read without waiting (never blocks)."""
        if self._result is not None:
            return True
        if self._event is not None:
            return bool(self._event.query())
        return False

    def wait(self) -> StepSyncResult:
        """Waits for the collective (idempotent) and returns the agreed result."""
        if self._result is None:
            host = None
            if self._event is not None:
                self._event.synchronize()
                assert self._tensors is not None and self._host is not None
                counts, sums = self._tensors
                # Later work on the current stream may read the results: order it
                # after the side stream, and tell the allocator they are used there.
                current = torch.cuda.current_stream(self._packed.device)
                current.wait_stream(self._side)
                counts.record_stream(current)
                sums.record_stream(current)
                host = [int(v) for v in self._host.tolist()[:2]] + self._host.tolist()[2:]
            else:
                counts, sums = ops.fused_step_sync_finish(self._packed)
            self._result = StepSyncResult(counts, sums, self._keys, self._owner._world, self._signature,
                                          self._owner, host)
        return self._result


class StepSync:
    """Fused per-step sync over a process group: one all_reduce per call.

    >>> sync = torch_ext.StepSync()
    >>> for batch in loader:
    ...     loss = train_step(batch)
    ...     out = sync(stop=should_stop(), metrics={"loss": loss})
    ...     if out.stop:          # True on every rank at the same step
    ...         break
    ...     log(out.metrics["loss"])   # mean over the ranks

    Non-blocking form, overlapping the collective with the next step and read
    one step later::

        pending = None
        for batch in loader:
            loss = train_step(batch)
            if pending is not None and pending.wait().stop:
                break
            pending = sync.start(stop=should_stop(), metrics={"loss": loss})
        else:
            if pending is not None:
                pending.wait()   # every started sync is waited on, on every rank

    Args:
        group: process group (default: the default group).
        metrics: the metric names, if known in advance. Lets a rank that has no
            data (and so no metric values) take part before it has seen a batch.
        device: device of the packed buffer. Default: chosen from the group, so
            that it is the same on every rank (ranks packing on different
            devices could reach different inner backends): the current CUDA
            device for groups that reduce CUDA tensors with NCCL (``nccl``, a
            ``cuda:nccl`` mix, or ``guard`` once CUDA is in use in this
            process), else CPU. Values on another device are moved there.

    Every rank of the group must call the sync the same number of times, with
    the same metric names. A rank with ``has_data=False`` contributes zeros to
    the metrics; means are taken over the ranks that had data. Metric values
    may be 1-element tensors (any real dtype; accumulated in float64; they may
    require grad, the sync does not take part in autograd) or numbers.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, *, metrics: Sequence[str] | None = None,
                 device: torch.device | str | None = None) -> None:
        self.group = group
        self._keys: tuple[str, ...] | None = tuple(metrics) if metrics is not None else None
        if self._keys is not None and len(set(self._keys)) != len(self._keys):
            raise ValueError(f"StepSync: metric names must be unique, got {list(self._keys)}")
        self._device = torch.device(device) if device is not None else None
        self._name: str | None = None
        self._world = 0
        self._rank = 0
        self._default_device: torch.device | None = None
        self._verified = False  # have the ranks compared metric names yet?
        self._flags: dict[tuple[torch.device, bool, bool], torch.Tensor] = {}
        self._zeros: dict[torch.device, torch.Tensor] = {}

    # -- setup -------------------------------------------------------------
    def _resolve(self) -> str:
        if self._name is None:
            self._name = ops.group_name_of(self.group)
            pg = self.group if self.group is not None else dist.group.WORLD
            self._world = dist.get_world_size(pg)
            self._rank = dist.get_rank(pg)
        return self._name

    @property
    def world_size(self) -> int:
        self._resolve()
        return self._world

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The metric names this sync carries (declared, or seen on the first call with metrics)."""
        return self._keys or ()

    def _where(self) -> str:
        return f"group '{self._name}', rank {self._rank} of {self._world}"

    def _group_device(self) -> torch.device:
        """The device every rank packs on, decided from the group alone."""
        if self._default_device is None:
            pg = self.group if self.group is not None else dist.group.WORLD
            backend = str(dist.get_backend(pg)).lower()
            try:
                pg._get_backend(torch.device("cpu"))
                has_cpu = True
            except RuntimeError:
                has_cpu = False
            cuda_in_use = torch.cuda.is_available() and torch.cuda.is_initialized()
            wants_cuda = "nccl" in backend or not has_cpu or ("guard" in backend and cuda_in_use)
            if wants_cuda:
                if not torch.cuda.is_available():
                    raise RuntimeError(
                        f"StepSync ({self._where()}): the group (backend {backend!r}) reduces on CUDA but CUDA is "
                        "not available here; pass device=... naming a device the group serves"
                    )
                self._default_device = torch.device("cuda", torch.cuda.current_device())
            else:
                self._default_device = torch.device("cpu")
        return self._default_device

    # -- packing -----------------------------------------------------------
    def _flag_pair(self, device: torch.device, stop: bool, have: bool) -> torch.Tensor:
        # The op never writes its inputs, so the four constant flag tensors are
        # made once per device and reused: no allocation or copy per step.
        key = (device, stop, have)
        t = self._flags.get(key)
        if t is None:
            t = torch.tensor([stop, have], dtype=torch.bool, device=device)
            self._flags[key] = t
        return t

    def _pack(self, stop: Any, has_data: Any, metrics: Mapping[str, MetricValue] | None
              ) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...], float | None]:
        if self._name is None:
            self._resolve()
        if metrics:
            keys = tuple(metrics)
            if self._keys is not None and keys != self._keys:
                raise ValueError(
                    f"StepSync ({self._where()}): metric names changed from {list(self._keys)} to {list(keys)}; "
                    "every call must pass the same names in the same order (use one StepSync per set of metrics)"
                )
        else:
            keys = self._keys or ()
        have = _as_flag(has_data, "has_data", self)
        flag_stop = _as_flag(stop, "stop", self)
        have_tensor = isinstance(have, torch.Tensor)
        if keys and not metrics and not have_tensor and have:
            raise ValueError(
                f"StepSync ({self._where()}): has_data=True but no values for the metrics {list(keys)}; pass "
                "metrics={...} or has_data=False"
            )

        device = self._device
        if device is None:
            device = self._device = self._group_device()

        if have_tensor or isinstance(flag_stop, torch.Tensor):
            flags = torch.stack([_flag_tensor(flag_stop, device), _flag_tensor(have, device)])
        else:
            flags = self._flag_pair(device, flag_stop, have)

        signature = _metric_signature(keys) if keys and not self._verified else None
        if not keys:
            values = self._zero_metrics(device, 0)
        elif not metrics or (not have_tensor and not have):
            # No data here: contribute zeros for the metrics.
            values = self._zero_metrics(device, len(keys))
        else:
            values = _metric_vector(keys, metrics, device, self)
            if have_tensor:
                # has_data only known on the device: zero the metrics without a host sync.
                values = values * (have.to(device) != 0)
        if signature is not None:
            values = torch.cat([torch.tensor([signature], dtype=torch.float64, device=device),
                                values.to(torch.float64)])
            self._verified = True
        if keys and self._keys is None:
            self._keys = keys  # remembered only once a call with them was valid
        return flags, values, keys, signature

    def _zero_metrics(self, device: torch.device, k: int) -> torch.Tensor:
        t = self._zeros.get(device)
        if t is None or t.numel() != k:
            t = torch.zeros(k, dtype=torch.float64, device=device)
            self._zeros[device] = t
        return t

    # -- public API --------------------------------------------------------
    def __call__(self, stop: StopLike = False, has_data: Any = True,
                 metrics: Mapping[str, MetricValue] | None = None) -> StepSyncResult:
        """Runs the sync now (blocking) and returns the agreed :class:`StepSyncResult`.

        ``stop`` and ``has_data`` may be bools, 1-element tensors (read on their
        device, no host sync), callables or objects with ``is_set()``.
        """
        flags, values, keys, signature = self._pack(stop, has_data, metrics)
        counts, sums = torch.ops.torch_ext.step_sync.default(flags, values, self._name)
        return StepSyncResult(counts, sums, keys, self._world, signature, self)

    def start(self, stop: StopLike = False, has_data: Any = True,
              metrics: Mapping[str, MetricValue] | None = None) -> PendingStepSync:
        """Launches the sync without waiting; read it later with ``.wait()``.

        Metric values are copied into the packed buffer when ``start`` runs, so
        their tensors may be reused right after. Every started sync must be
        waited on (on every rank) before the group is destroyed.
        """
        flags, values, keys, signature = self._pack(stop, has_data, metrics)
        packed = torch.ops.torch_ext.step_sync_start.default(flags, values, self._name)
        return PendingStepSync(packed, keys, signature, self)

    def __repr__(self) -> str:
        name = self._name or "<unresolved>"
        return f"StepSync(group={name!r}, metrics={list(self._keys) if self._keys else []})"


def _as_flag(value: Any, what: str, owner: StepSync) -> Any:
    """A bool, or a 1-element tensor (read on its device). Callables and events are evaluated."""
    if value is True or value is False:
        return value
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"StepSync ({owner._where()}): {what} must be a single value, got a tensor of shape "
                             f"{tuple(value.shape)}")
        return value
    if value is None:
        return False
    is_set = getattr(value, "is_set", None)
    if callable(is_set):  # threading.Event and friends
        return bool(is_set())
    if callable(value):
        return _as_flag(value(), what, owner)
    return bool(value)


def _flag_tensor(value: Any, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().reshape(()).to(device=device, dtype=torch.float64)
    return torch.tensor(1.0 if value else 0.0, dtype=torch.float64, device=device)


def _metric_vector(keys: tuple[str, ...], metrics: Mapping[str, MetricValue], device: torch.device,
                   owner: StepSync) -> torch.Tensor:
    values = [metrics[k] for k in keys]
    first = values[0]
    if isinstance(first, torch.Tensor):
        dtype = first.dtype
        if all(isinstance(v, torch.Tensor) and v.dim() == 0 and v.dtype == dtype and v.device == device
               for v in values) and not first.is_complex():
            # Common case, one call: 0-dim tensors of one dtype on the device.
            # The op converts to float64 itself.
            return torch.stack([v.detach() for v in values])
    elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return torch.tensor(values, dtype=torch.float64, device=device)
    # General case: mixed numbers and tensors, shapes [1], several dtypes/devices.
    parts = []
    for k, v in zip(keys, values):
        if isinstance(v, torch.Tensor):
            if v.numel() != 1:
                raise ValueError(f"StepSync ({owner._where()}): metric {k!r} must be a single value, got a tensor "
                                 f"of shape {tuple(v.shape)}; reduce it locally first (e.g. .mean())")
            if v.is_complex():
                raise ValueError(f"StepSync ({owner._where()}): metric {k!r} is complex; pass a real value")
            parts.append(v.detach().reshape(()).to(device=device, dtype=torch.float64))
        else:
            try:
                x = float(v)
            except (TypeError, ValueError):
                raise TypeError(f"StepSync ({owner._where()}): metric {k!r} must be a tensor or a number, "
                                f"got {type(v).__name__}") from None
            parts.append(torch.tensor(x, dtype=torch.float64, device=device))
    return torch.stack(parts)


# --------------------------------------------------------------------------
# even_batches
# --------------------------------------------------------------------------

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
    from torch._C._distributed_c10d import _create_work_from_future

    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result([torch.tensor([value], dtype=torch.int64)])
    return _create_work_from_future(fut)


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
        shutdown = getattr(it, "_shutdown_workers", None)
        persistent = bool(getattr(self._iterable, "persistent_workers", False))
        if callable(shutdown) and not persistent:
            shutdown()
        close = getattr(it, "close", None)
        if callable(close) and not callable(shutdown):
            close()  # generators: run their finally blocks now

    def _set_join_mode(self, ranks_with_data: int, enable: bool) -> None:
        from torch.distributed.algorithms.join import _JoinConfig

        for j in self._joinables:
            # is_first_joinable=False: DDP must not run Join's own per-step
            # counting all_reduce; the step sync already counted.
            j._join_config = _JoinConfig(enable=enable, throw_on_early_termination=False, is_first_joinable=False) \
                if enable else _JoinConfig.construct_disabled_join_config()
            reducer = getattr(j, "reducer", None)
            if reducer is not None:
                # useStaticWorldSize=False: divide by our count; True: back to the world size.
                reducer._set_forward_pass_work_handle(_count_work(ranks_with_data), not enable)

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
