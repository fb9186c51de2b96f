"""``ddp_guard``: Lightning's DDP strategy on the ``guard`` backend.

``DDPStrategy(process_group_backend="guard")`` trains, but Lightning branches on
the literal backend names "nccl" and "gloo" in four places, and with "guard" it
takes the wrong branch each time:

==========================  =====================================  ==============================
Lightning behaviour         keyed on                               what goes wrong with "guard"
==========================  =====================================  ==============================
barrier with device_ids     ``get_backend() == "nccl"``            NCCL barrier without device ids
destroy group at exit       ``backend == "nccl"`` in init          NCCL group never destroyed
mean reduce as SUM / world  ``get_backend(group) == "gloo"``       gloo rejects ReduceOp.AVG
no_grad for evaluation      ``get_backend() == "gloo"``            inference_mode on gloo
==========================  =====================================  ==============================

:class:`GuardDDPStrategy` decides each of them from the backend that ``guard``
actually wraps for the device in use, so a run behaves as it would on that
backend. Registered in Lightning's strategy registry as ``"ddp_guard"``::

    import torch_ext.lightning
    Trainer(strategy="ddp_guard", accelerator="cpu", devices=2)

Metric syncs name the line that logged them. Lightning syncs an epoch-level
``self.log(..., sync_dist=True)`` at the end of the epoch, from its loop, when the
user's ``validation_step`` is no longer on the stack. The strategy wraps the
module's ``log`` (on the instance) to remember, per metric name, the code object
and line of the user's ``self.log`` call and the hook it ran in (a dict store,
no strings built), and runs each ``reduce`` Lightning asks for a logged metric
inside ``torch_ext.label("metric 'val_loss' logged with sync_dist=True",
origin=...)``: reports then name the metric and that line, with a hint.
"""
from __future__ import annotations

import atexit
import os
import sys
from types import CodeType
from typing import Any

import lightning
import torch
import torch.distributed as dist
from lightning.fabric.utilities.distributed import (
    _destroy_dist_connection,
    _distributed_is_initialized,
    _init_dist_connection,
)
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

import torch_ext
from torch_ext import GuardOptions, _compat

__all__ = ["GuardDDPStrategy"]

_LIGHTNING_DIR = os.path.dirname(os.path.abspath(lightning.__file__)) + os.sep
_RESULT_FILE = os.path.join("logger_connector", "result.py")

METRIC_SYNC_HINT = (
    "a metric logged with sync_dist=True on some ranks only (e.g. under `if self.trainer.is_global_zero:`) makes "
    "those ranks wait in its sync while the others never join: log it on every rank, or log it with "
    "rank_zero_only=True and without sync_dist"
)


class GuardDDPStrategy(DDPStrategy):
    """DDP on ``backend="guard"``, with Lightning's backend-specific behaviour
    taken from the wrapped backend (gloo on CPU, NCCL on CUDA).

    Accepts every :class:`~lightning.pytorch.strategies.DDPStrategy` argument, plus
    ``guard_options`` (a :class:`torch_ext.GuardOptions`) for the process group.
    """

    strategy_name = "ddp_guard"

    def __init__(self, *args: Any, guard_options: GuardOptions | None = None, **kwargs: Any) -> None:
        backend = kwargs.pop("process_group_backend", None) or "guard"
        if backend != "guard":
            raise ValueError(f"GuardDDPStrategy runs on process_group_backend='guard', got {backend!r}")
        if guard_options is not None and not isinstance(guard_options, GuardOptions):
            raise TypeError(f"guard_options must be a torch_ext.GuardOptions, got {type(guard_options).__name__}")
        super().__init__(*args, process_group_backend="guard", **kwargs)
        self._guard_options = guard_options
        self._destroy_registered = False

    # --- what does guard wrap here? -------------------------------------------
    def inner_backend(self, device: torch.device | str | None = None) -> str | None:
        """Name of the backend ``guard`` wraps for ``device`` (default: the root device)."""
        if not _distributed_is_initialized():
            return None
        dev = torch.device(device) if device is not None else self.root_device
        names = torch_ext._C._inner_names(_compat.group_backend(_compat.default_group(), torch.device("cpu")))
        return names.get(dev.type)

    # --- the four branches ------------------------------------------------------
    def setup_distributed(self) -> None:
        if self._guard_options is None:
            super().setup_distributed()
        else:
            # DDPStrategy.setup_distributed with pg_options added (its **kwargs go to DDP).
            reset_seed()
            self.set_world_ranks()
            self._process_group_backend = "guard"
            assert self.cluster_environment is not None
            device_id = self.root_device if self.root_device.type != "cpu" else None
            _init_dist_connection(self.cluster_environment, "guard", timeout=self._timeout, device_id=device_id,
                                  pg_options=self._guard_options)
        # Lightning registers the exit-time destroy only for "nccl".
        if self.inner_backend() == "nccl" and not self._destroy_registered:
            atexit.register(_destroy_dist_connection)
            self._destroy_registered = True

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        if not _distributed_is_initialized():
            return
        if self.inner_backend() == "nccl":
            dist.barrier(device_ids=self.determine_ddp_device_ids())
        else:
            dist.barrier()

    def reduce(self, tensor: Any, group: Any | None = None, reduce_op: Any = "mean") -> Any:
        if (
            isinstance(tensor, torch.Tensor)
            and isinstance(reduce_op, str)
            and reduce_op.lower() in ("mean", "avg")
            and self.inner_backend(tensor.device) == "gloo"
        ):
            # gloo has no ReduceOp.AVG: sum, then divide, as Lightning does for gloo.
            world = dist.get_world_size(group) if _distributed_is_initialized() else 1
            with _metric_label(self.lightning_module):
                summed = super().reduce(tensor, group=group, reduce_op="sum")
            return summed / world
        with _metric_label(self.lightning_module):
            return super().reduce(tensor, group=group, reduce_op=reduce_op)

    def setup(self, trainer: Any) -> None:
        super().setup(trainer)
        _record_log_origins(self.lightning_module)
        if self.inner_backend() == "gloo":
            # Lightning evaluates under no_grad rather than inference_mode on gloo.
            for loop in _evaluation_loops(trainer):
                loop.inference_mode = False


# --- which line logged a metric ------------------------------------------------

_ORIGINS_ATTR = "_torch_ext_log_origins"  # on the module: {name: (code, line, hook)}


def _record_log_origins(module: Any) -> None:
    """Wraps ``module.log`` (on the instance, once) to remember where each
    ``sync_dist=True`` metric was logged: the innermost frame outside Lightning
    (``self.log_dict`` goes through ``self.log``) as a code object and a line."""
    if module is None or getattr(module, _ORIGINS_ATTR, None) is not None:
        return
    origins: dict[str, tuple[CodeType, int, str]] = {}
    object.__setattr__(module, _ORIGINS_ATTR, origins)
    log = module.log  # the bound method of the class

    def logged(name: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("sync_dist"):
            f = sys._getframe(1)
            while f is not None and f.f_code.co_filename.startswith(_LIGHTNING_DIR):
                f = f.f_back
            if f is not None:
                origins[name] = (f.f_code, f.f_lineno, getattr(module, "_current_fx_name", None) or "")
        return log(name, value, *args, **kwargs)

    object.__setattr__(module, "log", logged)


def _metric_label(module: Any) -> Any:
    """``torch_ext.label`` for the metric whose sync called ``reduce`` (found in
    Lightning's result frames, a few frames out), or a no-op context."""
    import contextlib

    f = sys._getframe(2)
    for _ in range(4):
        if f is None:
            break
        if f.f_code.co_name in ("compute", "forward", "update") and f.f_code.co_filename.endswith(_RESULT_FILE):
            meta = getattr(f.f_locals.get("self"), "meta", None)
            name = getattr(meta, "name", None)
            if isinstance(name, str):
                hook = getattr(meta, "fx", "") or ""
                where = (getattr(module, _ORIGINS_ATTR, None) or {}).get(name)
                origin = None
                if where is not None:
                    origin = torch_ext.Origin(where[0], where[1])
                    hook = where[2] or hook
                return torch_ext.label(f"metric {name!r} logged with sync_dist=True", origin=origin,
                                       hint=METRIC_SYNC_HINT, metric=name, hook=hook)
            break
        f = f.f_back
    return contextlib.nullcontext()


def _evaluation_loops(trainer: Any) -> list[Any]:
    loops = [trainer.validate_loop, trainer.test_loop, trainer.predict_loop]
    fit_val = getattr(getattr(trainer.fit_loop, "epoch_loop", None), "val_loop", None)
    if fit_val is not None:
        loops.append(fit_val)
    return [loop for loop in loops if hasattr(loop, "inference_mode")]


def register(registry: Any = StrategyRegistry) -> None:
    """Adds ``"ddp_guard"`` to Lightning's strategy registry (done at import)."""
    if GuardDDPStrategy.strategy_name not in registry:
        registry.register(
            GuardDDPStrategy.strategy_name,
            GuardDDPStrategy,
            description="DDP on torch_ext's guard backend (mismatch detection, hang reports)",
        )


register()
