"""Typed wrappers of the ``torch.ops.torch_ext`` operators, with their fake kernels.

The kernels live in C++ (``csrc/ops``); this module documents them, gives them
Python signatures, and registers the fake (meta) implementations that let them
trace under ``torch.compile``.

The fused step collective packs ``[stop + 2**21 * has_data, metric_0..metric_{k-1}]``
into one float64 tensor and all_reduces it (SUM) once:

>>> counts, sums = torch_ext.fused_step_sync(torch.tensor([stop, has_data]), metrics, group_name)
>>> any_stop = counts[0] > 0; ranks_with_data = counts[1]; metric_sums = sums
"""
from __future__ import annotations

import torch
import torch.distributed as dist

# The wrappers are named fused_* because ``torch_ext.step_sync`` is the module of the
# Python API (StepSync; even_batches, built on it, is in ``torch_ext.uneven``).
__all__ = ["agree", "fused_step_sync", "fused_step_sync_start", "fused_step_sync_finish", "group_name_of"]

_HOWS = ("any", "all", "min", "max")


def group_name_of(group: dist.ProcessGroup | None = None) -> str:
    """The registered name of ``group`` (the default group when None), as the ops take it."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "torch_ext step sync needs an initialised process group: call "
            "torch.distributed.init_process_group(...) first (backend 'guard', 'gloo' or 'nccl')"
        )
    pg = group if group is not None else dist.group.WORLD
    if pg is None or pg == dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(
            f"rank {dist.get_rank()} is not a member of the group passed to step sync; "
            "call it only on the ranks of that group (new_group(ranks) returns NON_GROUP_MEMBER elsewhere)"
        )
    return pg.group_name


def fused_step_sync(flags: torch.Tensor, metrics: torch.Tensor, group_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """ONE all_reduce of the stop flag, the has-data flag and ``k`` metric values.

    Args:
        flags: 1-D tensor ``[stop, has_data]`` (any real dtype; non-zero means true).
        metrics: 1-D tensor of ``k`` values (``k`` may be 0), on the same device as
            ``flags``; accumulated in float64.
        group_name: ``group.group_name`` of the process group to reduce over.

    Returns:
        ``(counts, sums)``: ``counts`` is int64 ``[ranks that want to stop, ranks
        that have data]``; ``sums`` is float64 ``[k]``, the metric sums over all
        ranks. On CUDA the op only enqueues work (no host synchronisation). Not
        differentiable: outputs never require grad.
    """
    return torch.ops.torch_ext.step_sync.default(flags, metrics, group_name)


def fused_step_sync_start(flags: torch.Tensor, metrics: torch.Tensor, group_name: str) -> torch.Tensor:
    """Non-blocking :func:`fused_step_sync`: launches the all_reduce and returns its packed buffer.

    The buffer (float64 ``[1 + k]``: the two flags share slot 0) must not be read or modified before it is
    passed to :func:`fused_step_sync_finish` (or ``torch.ops._c10d_functional.wait_tensor``),
    which waits for the collective. Every rank of the group must start the same
    number of syncs in the same order, like any collective.
    """
    return torch.ops.torch_ext.step_sync_start.default(flags, metrics, group_name)


def fused_step_sync_finish(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Waits for the all_reduce started by :func:`fused_step_sync_start`; returns ``(counts, sums)``."""
    return torch.ops.torch_ext.step_sync_finish.default(packed)


def agree(value, how: str = "any", group: dist.ProcessGroup | None = None):
    """A decision every rank of ``group`` takes together: ONE all_reduce of each rank's ``value``.

    Decide from one rank's data and the ranks part: ``if has_images: vision_tower(x)`` issues the
    tower's collectives on some ranks only. Agree first, then branch on what every rank holds::

        if torch_ext.agree(batch_has_images, "any"):   # every rank runs the tower (zeros where it has none)
            feats = vision_tower(images)

    Args:
        value: a Python bool/int/float, or a 0-d/1-d real tensor (on a device the group serves).
        how: ``"any"``/``"all"``: true where any/every rank's value is non-zero (bool);
            ``"min"``/``"max"``: the smallest/largest value of any rank (the input's type).
        group: the process group (the default group when None).

    Returns:
        The agreed value: a Python scalar for a Python scalar, else a tensor of the same shape.
        Every rank of the group must call it, as any collective (under the guard it is checked
        like one, named at the caller's line).
    """
    if how not in _HOWS:
        raise ValueError(f"torch_ext.agree: how must be one of {', '.join(map(repr, _HOWS))}, got {how!r}")
    name = group_name_of(group)
    if isinstance(value, torch.Tensor):
        return torch.ops.torch_ext.agree.default(value, how, name)
    if not isinstance(value, (bool, int, float)):
        raise TypeError(f"torch_ext.agree: value must be a bool, int, float or tensor, got {type(value).__name__}")
    pg = group if group is not None else dist.group.WORLD
    device = "cuda" if dist.get_backend(pg) == "nccl" else "cpu"  # a CPU-less group reduces CUDA tensors only
    out = torch.ops.torch_ext.agree.default(torch.tensor(value, device=device), how, name).item()
    return bool(out) if how in ("any", "all") or isinstance(value, bool) else type(value)(out)


def _check_fake(flags: torch.Tensor, metrics: torch.Tensor) -> None:
    # The same checks (and words) as the C++ kernel, for traced and meta calls.
    op = "torch.ops.torch_ext.step_sync"
    torch._check(flags.dim() == 1 and flags.shape[0] == 2,
                 lambda: f"{op}: flags must be a 1-D tensor [stop, has_data] of 2 elements, got shape "
                         f"{list(flags.shape)}; build it as torch.tensor([stop, has_data])")
    torch._check(metrics.dim() == 1,
                 lambda: f"{op}: metrics must be a 1-D tensor of k values (k may be 0), got shape "
                         f"{list(metrics.shape)}; flatten it or stack one scalar per metric")
    torch._check(flags.device == metrics.device,
                 lambda: f"{op}: flags are on {flags.device} but metrics on {metrics.device}; put both on the "
                         "same device (the one the group reduces on)")


@torch.library.register_fake("torch_ext::step_sync")
def _step_sync_fake(flags: torch.Tensor, metrics: torch.Tensor, group_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    _check_fake(flags, metrics)
    counts = flags.new_empty((2,), dtype=torch.int64)
    sums = metrics.new_empty((metrics.shape[0],), dtype=torch.float64)
    return counts, sums


@torch.library.register_fake("torch_ext::step_sync_start")
def _step_sync_start_fake(flags: torch.Tensor, metrics: torch.Tensor, group_name: str) -> torch.Tensor:
    _check_fake(flags, metrics)
    return flags.new_empty((1 + metrics.shape[0],), dtype=torch.float64)


@torch.library.register_fake("torch_ext::step_sync_finish")
def _step_sync_finish_fake(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    torch._check(packed.dim() == 1 and packed.shape[0] >= 1 and packed.dtype == torch.float64,
                 lambda: "torch.ops.torch_ext.step_sync_finish: expected the float64 buffer returned by "
                         "step_sync_start (1-D, at least 1 element)")
    counts = packed.new_empty((2,), dtype=torch.int64)
    sums = packed.new_empty((packed.shape[0] - 1,), dtype=torch.float64)
    return counts, sums


@torch.library.register_fake("torch_ext::agree")
def _agree_fake(value: torch.Tensor, how: str, group_name: str) -> torch.Tensor:
    op = "torch.ops.torch_ext.agree"
    torch._check(how in _HOWS, lambda: f"{op}: how must be 'any', 'all', 'min' or 'max', got '{how}'")
    torch._check(value.dim() <= 1, lambda: f"{op}: value must be 0-d or 1-d (one decision, or a few)")
    return value.new_empty(value.shape, dtype=torch.bool if how in ("any", "all") else value.dtype)
