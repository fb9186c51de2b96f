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
"""
from __future__ import annotations

import atexit
from typing import Any

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
            summed = super().reduce(tensor, group=group, reduce_op="sum")
            return summed / world
        return super().reduce(tensor, group=group, reduce_op=reduce_op)

    def setup(self, trainer: Any) -> None:
        super().setup(trainer)
        if self.inner_backend() == "gloo":
            # Lightning evaluates under no_grad rather than inference_mode on gloo.
            for loop in _evaluation_loops(trainer):
                loop.inference_mode = False


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
