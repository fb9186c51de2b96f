"""``nccl_sim``: a CPU process-group backend with NCCL's host semantics.

Test how a training loop written for NCCL behaves (a hang, a mismatch, a rank
that runs ahead) on a CPU-only machine, alone or under the guard::

    import torch_ext.testing.nccl_sim as nccl_sim      # registers "nccl_sim"

    dist.init_process_group("guard", ...)               # with TORCH_EXT_INNER=cpu:nccl_sim
    # or GuardOptions(inner="cpu:nccl_sim"), or init_process_group("nccl_sim") alone
    dist.all_reduce(t)                                  # queued on the stream; returns at once
    nccl_sim.synchronize()                              # where CUDA would sync (.item(), .cpu())
    print(t)

Point by point against ProcessGroupNCCL (``../shared/DESIGN.md`` section 6):

==============================  ==========================================  ==========================================
behaviour                       NCCL                                        nccl_sim
==============================  ==========================================  ==========================================
issue                           enqueues the kernel, returns                queues on the group's stream thread, returns
order                           one NCCL stream per communicator            one stream thread per process group
``work.wait()``                 current stream waits; host goes on          returns at once (raises if already failed)
``is_completed()`` & co.        end-event query                             the stream has run the exchange
``get_future()``                complete at enqueue, callbacks stream-      complete once the data is there (CPU code
                                ordered after the kernel                    has no stream to be ordered on)
data                            moved by the kernel                         moved by a private gloo group (real data
                                                                            between real processes)
a peer that never comes         kernel spins forever                        the stream waits forever
sync point                      ``torch.cuda.synchronize()``, ``.item()``   :func:`synchronize` (no timeout of its own)
release of a stuck stream       ``abort()``/``shutdown()`` (ncclCommAbort)  ``abort()``/``shutdown()``: the pending
                                                                            operations fail, blocked hosts wake
an operation fails              the communicator is in error                the same: everything after it fails
host far ahead                  blocks when the launch queue is full        blocks when ``TORCH_EXT_NCCL_SIM_QUEUE``
                                                                            (1024) operations are queued
coalescing / group calls        one NCCL group: sends and recvs pair        one stream operation: the same
recv from any source            refused                                     refused
ReduceOp.AVG / PREMUL_SUM       supported                                   AVG (sum, then divide) / refused at issue
==============================  ==========================================  ==========================================

The one difference a user's code sees: results live in host memory, so code
that reads them must call :func:`synchronize` first where CUDA would have
synchronised implicitly (``.item()``, ``.cpu()``, ``print``).

Fault switches (environment, read once per process group; the Nth operation of
the default group's stream, counting from 1):

- ``TORCH_EXT_NCCL_SIM_STALL=RANK:N``: that rank's stream stops before its Nth
  operation and runs nothing more until aborted, while its host goes on issuing
  (a hung kernel).
- ``TORCH_EXT_NCCL_SIM_FAIL=RANK:N``: that operation fails on that rank's
  stream (an NCCL asynchronous error); everything after it fails too.
- ``TORCH_EXT_NCCL_SIM_SLOW=RANK:MS``: every operation of that rank's stream
  takes MS milliseconds longer (a slow GPU or link).
- ``TORCH_EXT_NCCL_SIM_QUEUE=N``: operations a stream holds before issuing
  blocks the host (default 1024).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import Backend, PrefixStore

from torch_ext import _compat
from torch_ext._core import _C

BACKEND_NAME = "nccl_sim"

# How long synchronize() waits, after the stream reported an abort or an error,
# for the guard's verdict (its report and typed error) to arrive.
_VERDICT_WAIT_S = 30.0

__all__ = ["BACKEND_NAME", "register", "synchronize", "pending"]


def _create(dist_opts: Any, pg_options: Any) -> Any:
    """Creator registered with ``Backend.register_backend(extended_api=True)``."""
    timeout = dist_opts.timeout
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    rank, size = dist_opts.group_rank, dist_opts.group_size
    label = str(dist_opts.group_id)
    transport = dist.ProcessGroupGloo(PrefixStore("nccl_sim/", dist_opts.store), rank, size, timeout)
    # The fault switches name operations of the default group (torch names it "0").
    return _C._nccl_sim_create(transport, rank, size, f'"{label}"', label == "0")


def register() -> None:
    """Registers ``nccl_sim`` with torch.distributed (done when this module is imported)."""
    if BACKEND_NAME.upper() in _compat.backend_plugins():
        return
    Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])


def _sim_and_guard(pg: dist.ProcessGroup) -> tuple[Any, Any] | None:
    """(nccl_sim backend, guard backend or None) of ``pg``'s CPU backend, or None."""
    try:
        backend = _compat.group_backend(pg, torch.device("cpu"))
    except RuntimeError:
        return None
    if _C._is_nccl_sim(backend):
        return backend, None
    if _C._is_guard(backend):
        inner = _C._inner(backend, "cpu")
        if inner is not None and _C._is_nccl_sim(inner):
            return inner, backend
    return None


def _targets(group: dist.ProcessGroup | None) -> list[tuple[Any, Any]]:
    groups = [group] if group is not None else _compat.process_groups()
    out = [t for t in (_sim_and_guard(g) for g in groups) if t is not None]
    if group is not None and not out:
        raise TypeError(
            f"group uses backend '{dist.get_backend(group)}', which runs no nccl_sim stream: create it with "
            "backend='nccl_sim', or backend='guard' with TORCH_EXT_INNER=cpu:nccl_sim"
        )
    return out


def synchronize(group: dist.ProcessGroup | None = None) -> None:
    """The stand-in for ``torch.cuda.synchronize()``: blocks until this rank's
    stream has run every operation issued so far on ``group`` (None: every
    nccl_sim group of this process, as CUDA's synchronizes the device), with no
    timeout of its own.

    Raises once the communicator was aborted or one of its operations failed.
    Under the guard with ``check="verify"`` (the default) it also waits until
    what was issued is known to agree across ranks, and raises
    ``CollectiveMismatchError`` instead of returning over a difference. Under
    the guard the error is the guard's own (``CollectiveTimeoutError``,
    ``CollectiveMismatchError``, ``CollectiveFailureError`` ...) with its
    report, naming the collective the stream was stuck in.
    """
    for sim, guard in _targets(group):
        try:
            _C._nccl_sim_synchronize(sim)
        except Exception:
            if guard is None:
                raise
            # The guard aborted the stream (or is about to fail the group for
            # the failure the stream saw): raise its typed error and report.
            _C._raise_failure(guard, _VERDICT_WAIT_S)
            raise
        if guard is not None:
            # check="verify" gates the sync point, as it would gate the compute
            # stream on a GPU: what synchronize() makes readable is released only
            # once every rank is known to have issued the same collectives.
            _C._await_verdicts(guard)


def pending(group: dist.ProcessGroup | None = None) -> int:
    """Operations issued on ``group``'s stream (None: every nccl_sim group) and not yet run."""
    return sum(_C._nccl_sim_pending(sim) for sim, _ in _targets(group))


register()
