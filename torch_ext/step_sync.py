"""One collective per step: early stop, has-data, metric means and decisions, on every rank at once.

:class:`StepSync` answers these questions with ONE all_reduce
(``torch.ops.torch_ext.step_sync``): does any rank want to stop, do all ranks
still have data, what are the cross-rank means of a few metrics, and how did the
ranks vote on a few named decisions (``decide={"run_tower": has_images}``: the
branches every rank must take together, as :func:`torch_ext.agree` decides them
one collective each).
:func:`torch_ext.uneven.even_batches` builds on it so that a loop over per-rank
data of unknown or unequal length ends on every rank at the same step.

Why not ``broadcast`` the decision from rank 0? Because the other ranks must be
waiting in the matching broadcast: a rank that decides to stop and ``break``\\ s
leaves the rest blocked in their next collective (and some backends, SageMaker's
SMDDP among them, implement all_reduce but not broadcast). Here every rank calls
the same collective every step, and every rank reads the same answer.
"""
from __future__ import annotations

import zlib
from typing import Any, Callable, Mapping, Sequence, Union

import torch
import torch.distributed as dist

from torch_ext import ops
from torch_ext.backend import _backends_by_device

__all__ = ["StepSync", "StepSyncResult", "PendingStepSync"]

StopLike = Union[None, bool, int, torch.Tensor, Callable[[], Any], Any]
MetricValue = Union[torch.Tensor, float, int]

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

    __slots__ = ("counts", "sums", "keys", "decisions", "world_size", "_signature", "_host", "_owner", "_means")

    def __init__(self, counts: torch.Tensor, sums: torch.Tensor, keys: tuple[str, ...], world_size: int,
                 signature: float | None, owner: StepSync, host: list | None = None,
                 decisions: tuple[str, ...] = ()) -> None:
        #: int64 ``[ranks that want to stop, ranks that have data]``.
        self.counts = counts
        #: float64 metric sums over the ranks (a leading signature slot on the first call).
        self.sums = sums
        #: The metric names, in order.
        self.keys = keys
        #: The decision names, in order (their vote counts follow the metric sums).
        self.decisions = decisions
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
                    f"StepSync ({self._owner._where()}): the ranks sent different metric or decision names; this "
                    f"rank sent metrics {list(self.keys)} and decisions {list(self.decisions)}. Every rank must pass "
                    "the same names in the same order (a rank without data may pass no metrics once the names are "
                    "known, or declare them with StepSync(metrics=[...], decisions=[...]))."
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
                sums = sums[:len(self.keys)]  # the decisions' votes follow
                if sums.is_cuda:
                    means = sums / self.counts[1].to(torch.float64)
                else:
                    means = sums / float(host[1]) if host[1] else torch.full_like(sums, float("nan"))
                self._means = dict(zip(self.keys, means.unbind()))
        return self._means

    def votes(self, name: str) -> int:
        """How many ranks voted for decision ``name`` (a true value in ``decide={name: ...}``)."""
        if name not in self.decisions:
            raise KeyError(f"StepSync ({self._owner._where()}): no decision named {name!r}; synced decisions are "
                           f"{list(self.decisions)}")
        self._read()  # validates the names on the first call
        at = (1 if self._signature is not None else 0) + len(self.keys) + self.decisions.index(name)
        return int(self.sums[at].item())

    def any(self, name: str) -> bool:
        """True on every rank when at least one rank voted for decision ``name``; False on every rank otherwise."""
        return self.votes(name) > 0

    def all(self, name: str) -> bool:
        """True on every rank when every rank voted for decision ``name``; False on every rank otherwise."""
        return self.votes(name) == self.world_size

    def metric(self, name: str) -> float:
        """The cross-rank mean of one metric as a Python float."""
        if name not in self.keys:
            raise KeyError(f"StepSync ({self._owner._where()}): no metric named {name!r}; synced metrics are "
                           f"{list(self.keys)}")
        return float(self.metrics[name])

    def __repr__(self) -> str:
        host = self._read()
        metrics = {k: float(v) for k, v in self.metrics.items()}
        votes = f", votes={ {k: self.votes(k) for k in self.decisions} }" if self.decisions else ""
        return (f"StepSyncResult(stop={host[0] > 0}, ranks_stopping={int(host[0])}, "
                f"ranks_with_data={int(host[1])}/{self.world_size}, metrics={metrics}{votes})")


class PendingStepSync:
    """A step sync whose all_reduce is in flight; :meth:`wait` returns its result.

    On CUDA the counts are copied to pinned host memory on a side stream as soon
    as the collective ends, so reading the decision one step later does not wait
    for the compute queued after it.
    """

    __slots__ = ("_packed", "_keys", "_decisions", "_signature", "_owner", "_result", "_side", "_event", "_host",
                 "_tensors")

    def __init__(self, packed: torch.Tensor, keys: tuple[str, ...], signature: float | None,
                 owner: StepSync, decisions: tuple[str, ...] = ()) -> None:
        self._packed = packed
        self._keys = keys
        self._decisions = decisions
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
                                          self._owner, host, self._decisions)
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
        device: device of the packed buffer. Default: chosen from the group's
            backends, so that it is the same on every rank (ranks packing on
            different devices could reach different backends): the current
            CUDA device if the group has a CUDA backend of its own (``nccl``, a
            ``cuda:nccl`` mix, ``guard`` wrapping NCCL) and CUDA is available,
            else CPU (gloo, which also serves CUDA tensors through the host,
            counts as a CPU backend). Values on another device are moved there.

    Every rank of the group must call the sync the same number of times, with
    the same metric names. A rank with ``has_data=False`` contributes zeros to
    the metrics; means are taken over the ranks that had data. Metric values
    may be 1-element tensors (any real dtype; accumulated in float64; they may
    require grad, the sync does not take part in autograd) or numbers.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, *, metrics: Sequence[str] | None = None,
                 decisions: Sequence[str] | None = None, device: torch.device | str | None = None) -> None:
        self.group = group
        self._keys: tuple[str, ...] | None = tuple(metrics) if metrics is not None else None
        if self._keys is not None and len(set(self._keys)) != len(self._keys):
            raise ValueError(f"StepSync: metric names must be unique, got {list(self._keys)}")
        self._decisions: tuple[str, ...] | None = tuple(decisions) if decisions is not None else None
        if self._decisions is not None and len(set(self._decisions)) != len(self._decisions):
            raise ValueError(f"StepSync: decision names must be unique, got {list(self._decisions)}")
        self._device = torch.device(device) if device is not None else None
        self._name: str | None = None
        self._world = 0
        self._rank = 0
        self._default_device: torch.device | None = None
        self._verified = False  # have the ranks compared metric names yet?
        self._flags: dict[tuple[torch.device, bool, bool], torch.Tensor] = {}
        self._zeros: dict[tuple[torch.device, int], torch.Tensor] = {}  # (device, length): metrics', votes' zeros

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
        """The device every rank packs on, decided from the group's backends (see :func:`_device_for`)."""
        if self._default_device is None:
            pg = self.group if self.group is not None else dist.group.WORLD
            backends = _backends_by_device(pg)
            if _device_for(backends, torch.cuda.is_available()) == "cuda":
                self._default_device = torch.device("cuda", torch.cuda.current_device())
            elif "cpu" in backends:
                self._default_device = torch.device("cpu")
            else:
                served = ", ".join(f"{d}:{n}" for d, n in sorted(backends.items())) or "none"
                raise RuntimeError(
                    f"StepSync ({self._where()}): the group has no backend for CPU tensors (it has {served}) and "
                    "CUDA is not available here; pass device=... naming a device the group serves"
                )
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

    def _votes(self, decide: Mapping[str, Any] | None, device: torch.device) -> tuple[tuple[str, ...], torch.Tensor]:
        """The decision names and this rank's votes (0/1, float64; a declared decision not passed: 0)."""
        if decide:
            names = tuple(decide)
            if self._decisions is not None and names != self._decisions:
                raise ValueError(
                    f"StepSync ({self._where()}): decision names changed from {list(self._decisions)} to "
                    f"{list(names)}; every call must pass the same names in the same order (or none: no vote)")
            votes = torch.stack([(_flag_tensor(_as_flag(decide[k], f"decide[{k!r}]", self), device) != 0)
                                 .to(torch.float64) for k in names])
            if self._decisions is None:
                self._decisions = names
            return names, votes
        names = self._decisions or ()
        return names, self._zero_metrics(device, len(names))

    def _pack(self, stop: Any, has_data: Any, metrics: Mapping[str, MetricValue] | None,
              decide: Mapping[str, Any] | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...], float | None, tuple[str, ...]]:
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

        decisions, votes = self._votes(decide, device)
        names = keys + (("\x1e",) + decisions if decisions else ())  # the decisions' names are compared too
        signature = _metric_signature(names) if names and not self._verified else None
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
        if decisions:  # votes count whatever has_data says: a rank without data still decides
            values = torch.cat([values.to(torch.float64), votes])
        if signature is not None:
            values = torch.cat([torch.tensor([signature], dtype=torch.float64, device=device),
                                values.to(torch.float64)])
            self._verified = True
        if keys and self._keys is None:
            self._keys = keys  # remembered only once a call with them was valid
        return flags, values, keys, signature, decisions

    def _zero_metrics(self, device: torch.device, k: int) -> torch.Tensor:
        t = self._zeros.get((device, k))
        if t is None:
            t = self._zeros[(device, k)] = torch.zeros(k, dtype=torch.float64, device=device)
        return t

    # -- public API --------------------------------------------------------
    def __call__(self, stop: StopLike = False, has_data: Any = True,
                 metrics: Mapping[str, MetricValue] | None = None,
                 decide: Mapping[str, Any] | None = None) -> StepSyncResult:
        """Runs the sync now (blocking) and returns the agreed :class:`StepSyncResult`.

        ``stop`` and ``has_data`` may be bools, 1-element tensors (read on their
        device, no host sync), callables or objects with ``is_set()``; so may the
        values of ``decide`` (this rank's vote on each named decision: read the
        agreed answer with ``result.any(name)`` / ``result.all(name)``).
        """
        flags, values, keys, signature, decisions = self._pack(stop, has_data, metrics, decide)
        counts, sums = torch.ops.torch_ext.step_sync.default(flags, values, self._name)
        return StepSyncResult(counts, sums, keys, self._world, signature, self, decisions=decisions)

    def start(self, stop: StopLike = False, has_data: Any = True,
              metrics: Mapping[str, MetricValue] | None = None,
              decide: Mapping[str, Any] | None = None) -> PendingStepSync:
        """Launches the sync without waiting; read it later with ``.wait()``.

        Metric values are copied into the packed buffer when ``start`` runs, so
        their tensors may be reused right after. Every started sync must be
        waited on (on every rank) before the group is destroyed.
        """
        flags, values, keys, signature, decisions = self._pack(stop, has_data, metrics, decide)
        packed = torch.ops.torch_ext.step_sync_start.default(flags, values, self._name)
        return PendingStepSync(packed, keys, signature, self, decisions)

    def __repr__(self) -> str:
        name = self._name or "<unresolved>"
        return f"StepSync(group={name!r}, metrics={list(self._keys) if self._keys else []})"


def _device_for(backends: Mapping[str, str], cuda_available: bool) -> str:
    """``"cuda"`` if the group has a CUDA backend of its own and CUDA is available, else ``"cpu"``.

    ``backends`` maps device type to backend name (:func:`torch_ext.backend._backends_by_device`).
    "Of its own": not the group's CPU backend too. gloo registers itself for CUDA as
    well and reduces CUDA tensors through host copies, so a gloo group packs on CPU.
    """
    cuda = backends.get("cuda")
    if cuda is not None and cuda != backends.get("cpu") and cuda_available:
        return "cuda"
    return "cpu"


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
