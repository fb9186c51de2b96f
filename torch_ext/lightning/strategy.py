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
``LightningModule.log`` (once, on the class; it records only for modules trained
by this strategy) to remember, per metric name, the code object and line of the
user's ``self.log`` call and the hook it ran in (a dict store, no strings built),
and runs each ``reduce`` Lightning asks for a logged metric
inside ``torch_ext.label("metric 'val_loss' logged with sync_dist=True",
origin=...)``: reports then name the metric and that line, with a hint. A torchmetrics
metric logged as an object (``self.log("val_acc", self.acc)``) syncs itself when Lightning
computes it at epoch end; its line is remembered too, and the sync (labelled by
``torch_ext._libraries``' torchmetrics wrapper) names the logged name and that line.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import os
import sys
import weakref
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
from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

import torch_ext
from torch_ext import GuardOptions, _compat, _libraries

__all__ = ["GuardDDPStrategy"]

_LIGHTNING_DIR = os.path.dirname(os.path.abspath(lightning.__file__)) + os.sep
_RESULT_FILE = os.path.join("logger_connector", "result.py")

TORCHMETRICS_LOG_HINT = (
    "a torchmetrics metric logged with self.log(name, metric) is synced across all ranks when Lightning computes "
    "it at the end of the epoch: update and log it on every rank (not under `if self.trainer.is_global_zero:`)"
)

METRIC_SYNC_HINT = (
    "a metric logged with sync_dist=True on some ranks only (e.g. under `if self.trainer.is_global_zero:`, or a "
    "self.log_dict key that only some ranks' batches produce) makes those ranks wait in its sync while the others "
    "never join: log it on every rank (a neutral value where a rank has none), or log it with rank_zero_only=True "
    "and without sync_dist"
)


class GuardDDPStrategy(DDPStrategy):
    """DDP on ``backend="guard"``, with Lightning's backend-specific behaviour
    taken from the wrapped backend (gloo on CPU, NCCL on CUDA).

    Accepts every :class:`~lightning.pytorch.strategies.DDPStrategy` argument, plus
    ``guard_options`` (a :class:`torch_ext.GuardOptions`) for the process group and
    ``log_stragglers``: log :func:`torch_ext.stragglers` as metrics
    (``straggler/rank``, ``straggler/extra_ms_per_step``, ``straggler/share``, ...,
    see :meth:`torch_ext.StragglerReport.metrics`) every ``log_stragglers`` training
    steps (``True``: 50), from rank 0 (the analyst; no store call).
    """

    strategy_name = "ddp_guard"

    def __init__(self, *args: Any, guard_options: GuardOptions | None = None, log_stragglers: bool | int = False,
                 **kwargs: Any) -> None:
        backend = kwargs.pop("process_group_backend", None) or "guard"
        if backend != "guard":
            raise ValueError(f"GuardDDPStrategy runs on process_group_backend='guard', got {backend!r}")
        if guard_options is not None and not isinstance(guard_options, GuardOptions):
            raise TypeError(f"guard_options must be a torch_ext.GuardOptions, got {type(guard_options).__name__}")
        super().__init__(*args, process_group_backend="guard", **kwargs)
        self._guard_options = guard_options
        every = 50 if log_stragglers is True else int(log_stragglers or 0)
        if every < 0:
            raise ValueError(f"log_stragglers must be True, False or a number of steps >= 1, got {log_stragglers!r}")
        self._log_stragglers_every = every
        self._destroy_registered = False
        # Where each sync_dist metric was last logged: {name: (code, line, hook)}.
        self._log_origins: dict[str, tuple[CodeType, int, str]] = {}

    # --- what does guard wrap here? -------------------------------------------
    def inner_backend(self, device: torch.device | str | None = None) -> str | None:
        """Name of the backend ``guard`` wraps for ``device`` (default: the root device)."""
        if not _distributed_is_initialized():
            return None
        dev = torch.device(device) if device is not None else self.root_device
        names = torch_ext._C._inner_names(_compat.group_backend(_compat.default_group(), torch.device("cpu")))
        return names.get(dev.type)

    def _remember_log_origin(self, name: str, hook: str) -> None:
        """Called by LightningModule.log for sync_dist=True: the user's line, kept as a
        code object and a line number (``self.log_dict`` goes through ``self.log``)."""
        f = _first_frame_outside_lightning()
        if f is not None:
            self._log_origins[name] = (f.f_code, f.f_lineno, hook)

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
            with _metric_label(self):
                summed = super().reduce(tensor, group=group, reduce_op="sum")
            return summed / world
        with _metric_label(self):
            return super().reduce(tensor, group=group, reduce_op=reduce_op)

    def setup(self, trainer: Any) -> None:
        super().setup(trainer)
        # For the torchmetrics labeller: Lightning computes a logged torchmetrics metric
        # at epoch end without the strategy on the stack.
        global _current
        _current = weakref.ref(self)
        _install_log_wrapper()
        if self._log_stragglers_every and not any(isinstance(c, StragglerMetrics) for c in trainer.callbacks):
            trainer.callbacks.append(StragglerMetrics(self._log_stragglers_every))
        if self.inner_backend() == "gloo":
            # Lightning evaluates under no_grad rather than inference_mode on gloo.
            for loop in _evaluation_loops(trainer):
                loop.inference_mode = False


class StragglerMetrics(Callback):
    """Logs :func:`torch_ext.stragglers` as ``straggler/...`` metrics every ``every``
    training steps, on rank 0 (the group's analyst: its own figures, no store call);
    ``GuardDDPStrategy(log_stragglers=...)`` adds it."""

    def __init__(self, every: int = 50) -> None:
        self.every = max(1, int(every))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_rank != 0 or not _distributed_is_initialized() or (batch_idx + 1) % self.every:
            return
        metrics = torch_ext.stragglers().metrics()
        pl_module.log_dict(metrics, rank_zero_only=True, on_step=True, on_epoch=False)


# --- which line logged a metric ------------------------------------------------
#
# LightningModule.log is wrapped once, on the class, by a module-level function:
# nothing lands in the module's __dict__ (torch.save(model) pickles it, EMA/SWA
# callbacks deepcopy it), and the wrapper records only when the module's trainer
# runs a GuardDDPStrategy. The origins live on that strategy.


def _install_log_wrapper() -> None:
    if getattr(LightningModule.log, "_torch_ext_wrapped", False):
        return
    log = LightningModule.log

    @functools.wraps(log)
    def logged(self: Any, name: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        # sync_dist=True: Lightning syncs the value; a torchmetrics metric syncs itself.
        if kwargs.get("sync_dist") or _is_torchmetric(value):
            trainer = getattr(self, "_trainer", None)
            strategy = getattr(trainer, "strategy", None)
            if isinstance(strategy, GuardDDPStrategy):
                strategy._remember_log_origin(name, getattr(self, "_current_fx_name", None) or "")
        return log(self, name, value, *args, **kwargs)

    logged._torch_ext_wrapped = True  # type: ignore[attr-defined]
    LightningModule.log = logged  # type: ignore[method-assign]


_current: Any = None  # weakref to the GuardDDPStrategy set up last


def _is_torchmetric(value: Any) -> bool:
    tm = sys.modules.get("torchmetrics")
    return tm is not None and isinstance(value, tm.Metric)


def _torchmetrics_label(frame: Any, class_name: str) -> Any:
    """The label of a torchmetrics metric Lightning computes at epoch end (its result
    frame calls compute()): the name it was logged as, and that self.log line."""
    code = frame.f_code
    if code.co_name != "compute" or not code.co_filename.endswith(_RESULT_FILE):
        return None
    meta = getattr(frame.f_locals.get("self"), "meta", None)
    name = getattr(meta, "name", None)
    if not isinstance(name, str):
        return None
    strategy = _current() if _current is not None else None
    where = strategy._log_origins.get(name) if isinstance(strategy, GuardDDPStrategy) else None
    origin = torch_ext.Origin(where[0], where[1]) if where is not None else None
    hook = (where[2] if where is not None else "") or getattr(meta, "fx", "") or ""
    return torch_ext.label(f"metric {name!r} ({class_name}, torchmetrics) logged with self.log", origin=origin,
                           hint=TORCHMETRICS_LOG_HINT, metric=name, hook=hook, library="torchmetrics")


def _first_frame_outside_lightning() -> Any:
    f = sys._getframe(2)
    while f is not None and (f.f_code.co_filename.startswith(_LIGHTNING_DIR) or f.f_code.co_filename == __file__):
        f = f.f_back
    return f


def _metric_label(strategy: "GuardDDPStrategy") -> Any:
    """``torch_ext.label`` for the metric whose sync called ``reduce`` (found in
    Lightning's result frames, a few frames out), or a no-op context."""
    f = sys._getframe(2)
    for _ in range(4):
        if f is None:
            break
        if f.f_code.co_name in ("compute", "forward", "update") and f.f_code.co_filename.endswith(_RESULT_FILE):
            meta = getattr(f.f_locals.get("self"), "meta", None)
            name = getattr(meta, "name", None)
            if isinstance(name, str):
                hook = getattr(meta, "fx", "") or ""
                where = strategy._log_origins.get(name)
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
_libraries.register_torchmetrics_labeller(_torchmetrics_label)
