"""A process group's guard backend and the guard's view of it, read through ``_C``.

Below ``backend`` (which creates guard groups) and ``_ddp`` (which reads their
ledgers on the error path), so that both can ask without importing each other.
"""
from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

from torch_ext import _compat
from torch_ext._core import _C


def guard_backend(group: dist.ProcessGroup | None) -> Any:
    """``group``'s guard backend (the default group's for None); TypeError naming the fix for any other backend."""
    pg = group if group is not None else _compat.default_group()
    backend = _compat.group_backend(pg, torch.device("cpu"))
    if not _C._is_guard(backend):
        raise TypeError(
            f"group was created with backend '{dist.get_backend(pg)}', not 'guard': "
            "use init_process_group(backend='guard') or new_group(..., backend='guard')"
        )
    return backend


def group_state(group: dist.ProcessGroup | None = None, max_entries: int = 0) -> dict[str, Any]:
    """The guard's view of ``group``: identity, progress and its ledger (a dict).

    Under ``check="verify"`` (world size > 1) it has ``"verifier"``: the check
    rounds run so far (``rounds``), the collectives verified by the check they
    carried themselves (``in_band``), and the last collective verified and issued.
    """
    backend = guard_backend(group)
    state = json.loads(_C._group_json(backend, max_entries))
    stats = _C._verifier_stats(backend)
    if stats is not None:
        state["verifier"] = stats
    return state
