"""Every private torch API torch_ext uses, one small function each, and the torch releases it supports.

torch may rename or remove underscore names in any release. They are reached
only through this module, so a torch upgrade that breaks one breaks it here,
in one place, with the reason it is used written next to it.
"""
from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

# -- supported releases -------------------------------------------------------

# The torch releases torch_ext supports, (major, minor) of the oldest and the
# newest, both included: those csrc/ compiles against (csrc/guard/TorchCompat.h,
# checked by scripts/check_torch_headers.sh), as pyproject.toml declares
# (torch>=2.11,<2.16). ``import torch_ext`` refuses any other (torch_ext/_extension.py).
SUPPORTED_TORCH = ((2, 11), (2, 15))


# -- process groups -----------------------------------------------------------

def default_group() -> dist.ProcessGroup:
    """Wraps ``distributed_c10d._get_default_group()``: the default group as an object (``group=None`` resolved)."""
    return dist.distributed_c10d._get_default_group()


def process_groups() -> list[dist.ProcessGroup]:
    """Wraps ``distributed_c10d._world.pg_map``: every process group of this process not destroyed yet."""
    return list(dist.distributed_c10d._world.pg_map)


def group_backend(pg: dist.ProcessGroup, device: torch.device) -> Any:
    """Wraps ``ProcessGroup._get_backend(device)``: the c10d Backend a group runs ``device`` tensors on.

    Raises RuntimeError when the group has no backend for that device type.
    """
    return pg._get_backend(device)


def group_device_types(pg: dist.ProcessGroup) -> list[torch.device]:
    """Wraps ``ProcessGroup._device_types``: the device types a group has a backend for."""
    return list(pg._device_types)


def torch_release() -> tuple[int, int]:
    """(major, minor) of the running torch."""
    major, minor = (int(n) for n in re.findall(r"\d+", torch.__version__)[:2])
    return major, minor


# torch 2.15 made setSequenceNumberForGroup() a deprecated no-op that warns
# (sequence numbers start at 0 on every rank): not called from there on.
SEQUENCE_NUMBERS_START_AT_ZERO = torch_release() >= (2, 15)


def set_sequence_number(pg: Any) -> None:
    """Wraps ``ProcessGroup._set_sequence_number_for_group()``: what ``new_group`` does to the backends it
    creates, before torch 2.15 (a no-op there, which only warns)."""
    if not SEQUENCE_NUMBERS_START_AT_ZERO:
        pg._set_sequence_number_for_group()


def default_timeout(backend: str) -> timedelta:
    """Wraps ``distributed_c10d._get_default_timeout(backend)``: torch's default collective timeout for a backend."""
    return dist.distributed_c10d._get_default_timeout(backend)


# -- creating inner backends --------------------------------------------------

def set_nccl_timeout(opts: Any, timeout: timedelta) -> None:
    """Wraps ``ProcessGroupNCCL.Options._timeout``: the only way to give NCCL options a timeout."""
    opts._timeout = timeout


def ucc_process_group(store: dist.Store, rank: int, size: int, timeout: timedelta) -> Any:
    """Wraps ``torch._C._distributed_c10d.ProcessGroupUCC``: torch.distributed does not export it."""
    from torch._C._distributed_c10d import ProcessGroupUCC  # type: ignore[attr-defined]

    return ProcessGroupUCC(store, rank, size, timeout)


def backend_plugins() -> dict[str, Any]:
    """Wraps ``Backend._plugins``: the backends registered with ``Backend.register_backend``, by upper-case name.

    torch has no public listing of them.
    """
    return dist.Backend._plugins


def torchcomms_takes(backend: str) -> str | None:
    """Wraps ``distributed_c10d._use_torchcomms_enabled()`` and ``_torchcomms_handles_backend()``: what sends
    ``backend``'s process groups to ``torchcomms.new_comm`` instead of its registered creator, or None.

    From torch 2.13, with torchcomms installed and TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 (or
    ``torch.distributed.config.use_torchcomms``), torch creates every backend but ``fake`` through torchcomms;
    2.15 sends only the backends torchcomms has built or registered, and lets any other plugin through.
    """
    c10d = dist.distributed_c10d
    enabled = getattr(c10d, "_use_torchcomms_enabled", None)
    if enabled is None or not enabled():
        return None
    handles = getattr(c10d, "_torchcomms_handles_backend", None)
    if handles is not None and not handles(backend):
        return None
    if os.environ.get("TORCH_DISTRIBUTED_USE_TORCHCOMMS"):
        return f"TORCH_DISTRIBUTED_USE_TORCHCOMMS={os.environ['TORCH_DISTRIBUTED_USE_TORCHCOMMS']}"
    return "torch.distributed.config.use_torchcomms = True"


def mark_flight_recorder_native(backend: str, inner: set[str]) -> bool:
    """From torch 2.15: Flight Recorder's c10d hook leaves ``backend``'s groups alone, if ``inner`` record natively.

    2.15 attaches a hook recording every op of a group to Flight Recorder unless
    every backend of the group is in ``distributed_c10d._FR_SELF_RECORDING_BACKENDS``
    (the ones that record their own ops: gloo, nccl-legacy, ...). For a guard
    group that hook's entries stay "scheduled" for good (no completion reaches
    it) and repeat what an inner backend that records natively has recorded,
    with state and duration. Where an inner backend does not (2.15's nccl2), the
    hook's entries are the only ones: kept. Before 2.15 the set does not exist.
    Returns whether ``backend`` is marked.
    """
    native = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if not isinstance(native, set) or not inner <= native:
        return False
    native.add(backend)
    return True


def distributed_backend_options() -> Any:
    """Wraps ``distributed_c10d._DistributedBackendOptions()``: what creators registered with ``extended_api`` take."""
    return dist.distributed_c10d._DistributedBackendOptions()


# -- DDP and Join (even_batches, policy="join") ------------------------------

def work_from_future(fut: torch.futures.Future) -> Any:
    """Wraps ``torch._C._distributed_c10d._create_work_from_future``: a C++ Work completed by ``fut``.

    DDP's reducer reads the count of joined ranks from such a Work.
    """
    from torch._C._distributed_c10d import _create_work_from_future

    return _create_work_from_future(fut)


def join_config(*, enable: bool, throw_on_early_termination: bool, is_first_joinable: bool) -> Any:
    """Wraps ``torch.distributed.algorithms.join._JoinConfig(...)``: the join state ``Join`` gives a Joinable."""
    from torch.distributed.algorithms.join import _JoinConfig

    return _JoinConfig(enable=enable, throw_on_early_termination=throw_on_early_termination,
                       is_first_joinable=is_first_joinable)


def disabled_join_config() -> Any:
    """Wraps ``_JoinConfig.construct_disabled_join_config()``: a Joinable's state outside ``Join``."""
    from torch.distributed.algorithms.join import _JoinConfig

    return _JoinConfig.construct_disabled_join_config()


def set_join_config(joinable: Any, config: Any) -> None:
    """Wraps ``Joinable._join_config``: sets what ``Join.__enter__`` would, without Join's extra all_reduce."""
    joinable._join_config = config


def set_forward_pass_work_handle(reducer: Any, work: Any, use_static_world_size: bool) -> None:
    """Wraps ``Reducer._set_forward_pass_work_handle``: how DDP learns the count of ranks still training."""
    reducer._set_forward_pass_work_handle(work, use_static_world_size)


def ddp_grad_buckets(module: Any) -> list[tuple[int, int, int, torch.dtype, list[torch.Tensor]]]:
    """Wraps ``DistributedDataParallel.reducer`` and ``Reducer._get_zeros_like_grad_buckets``: the
    reducer's current gradient buckets as ``(index, count, numel, dtype, parameters)``, for naming the
    bucket of a report's all_reduce (torch_ext/_ddp.py). The only public reader of the layout; it
    allocates a zeroed copy of each bucket (freed at once), which is why it runs on the error path only."""
    grad_buckets = module.reducer._get_zeros_like_grad_buckets()
    return [(b.index(), len(grad_buckets), b.buffer().numel(), b.buffer().dtype, list(b.parameters()))
            for b in grad_buckets]


# -- DataLoader ---------------------------------------------------------------

def worker_shutdown(iterator: Any) -> Callable[[], None] | None:
    """Wraps ``_MultiProcessingDataLoaderIter._shutdown_workers``: joins a DataLoader iterator's workers now.

    None for iterators without workers (and anything that is not a DataLoader iterator).
    """
    shutdown = getattr(iterator, "_shutdown_workers", None)
    return shutdown if callable(shutdown) else None


# -- DataLoader iterators (torch_ext/epochs.py) --------------------------------

def dataloader_iter_class() -> type:
    """Wraps ``torch.utils.data.dataloader._BaseDataLoaderIter``: the base of every
    DataLoader iterator, whose ``_reset`` runs once per epoch (persistent workers
    too) and whose ``__next__`` raises ``StopIteration`` when the epoch's data ends."""
    return torch.utils.data.dataloader._BaseDataLoaderIter


def batches_yielded(it: Any) -> int:
    """Wraps ``_BaseDataLoaderIter._num_yielded``: batches (or samples) yielded this epoch."""
    return int(it._num_yielded)


def index_sampler(it: Any) -> tuple[Any, bool]:
    """Wraps ``_BaseDataLoaderIter._index_sampler`` and ``_auto_collation``: the batch
    sampler (True) or sampler (False) the iterator draws from, or (None, False)."""
    return getattr(it, "_index_sampler", None), bool(getattr(it, "_auto_collation", False))


def all_gather_single(output: Any, input: Any, group: Any = None) -> None:
    """``dist.all_gather_single`` (torch 2.13+; ``all_gather_into_tensor`` warns there), else the old name."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(output, input, group=group)
