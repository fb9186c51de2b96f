"""Small Python objects across ranks, without numpy.

torch's ``all_gather_object`` reads its buffers back through ``Tensor.numpy()``,
and torch's CPU wheel does not depend on numpy: in an environment without it the
call fails ("Numpy is not available") after the collectives have run. torch_ext
needs no numpy, so its own cross-rank checks pickle into byte tensors here.
"""
from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed as dist

from torch_ext import _compat


def _device(group: Any) -> torch.device:
    """The device torch's object collectives use for ``group`` (the CPU where torch does not say)."""
    pick = getattr(dist.distributed_c10d, "_get_object_coll_device", None)
    return torch.device(pick(group) if pick is not None else "cpu")


def all_gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj`` of ``group``, in group rank order: two all_gathers (lengths, then the pickles)."""
    device = _device(group)
    world = dist.get_world_size(group)
    mine = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    lengths = torch.zeros(world, dtype=torch.int64, device=device)
    _compat.all_gather_single(lengths, torch.tensor([mine.numel()], device=device), group=group)
    sizes = lengths.tolist()
    width = max(sizes)
    padded = torch.zeros(width, dtype=torch.uint8, device=device)
    padded[:mine.numel()] = mine.to(device)
    everyone = torch.empty(world * width, dtype=torch.uint8, device=device)
    _compat.all_gather_single(everyone, padded, group=group)
    rows = everyone.cpu().view(world, width)
    return [pickle.loads(bytes(rows[r, :n].tolist())) for r, n in enumerate(sizes)]
