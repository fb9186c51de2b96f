"""A drop-in for Lightning's ``EarlyStopping`` whose cross-rank decision is ONE fused collective.

Lightning's callback decides on each rank, then calls
``strategy.reduce_boolean_decision`` (a barrier plus an all_reduce, then a host
read); every metric logged with ``sync_dist=True`` costs another barrier plus
all_reduce. This callback replaces the decision round trip with
``torch.ops.torch_ext.step_sync``, and lets the monitored metric (and others)
ride in that same collective instead of being synced at logging time.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch
import torch.distributed as dist
from lightning.pytorch.callbacks.early_stopping import EarlyStopping as _LightningEarlyStopping

from torch_ext.step_sync import StepSync

__all__ = ["EarlyStopping"]


class EarlyStopping(_LightningEarlyStopping):
    """Lightning's ``EarlyStopping`` (same arguments, same state, same checkpoints) on the fused op.

    Stops training on every rank at the same check: the stop decisions of all
    ranks are combined with one ``step_sync`` all_reduce ("any rank wants to
    stop"), exactly as Lightning's ``reduce_boolean_decision(all=False)`` does.

    Two keyword-only extras:

    Args:
        sync_metrics: names of logged metrics to average across ranks in the same
            collective. List the monitored metric here and log it with
            ``sync_dist=False``: its cross-rank mean (computed in float64, over
            all ranks) is then what the stopping criteria see, on every rank
            alike, and the separate ``sync_dist`` collectives are saved. The
            means are kept in :attr:`synced_metrics` (Python floats). Every rank
            must have logged these metrics; a rank that did not contributes NaN.
        group: process group to decide over (default: the default group, which
            is the one Lightning's DDP strategies train on).

    With a single process no collective is run, as in Lightning.
    """

    def __init__(self, *args: Any, sync_metrics: Sequence[str] = (), group: dist.ProcessGroup | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(sync_metrics, str):
            sync_metrics = (sync_metrics,)
        self.sync_metrics: tuple[str, ...] = tuple(dict.fromkeys(sync_metrics))
        self.group = group
        #: Cross-rank means of ``sync_metrics`` at the last check.
        self.synced_metrics: dict[str, float] = {}
        self._sync: StepSync | None = None

    def _step_sync(self, trainer: Any) -> StepSync | None:
        if trainer.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
            return None
        if self._sync is None:
            self._sync = StepSync(self.group, metrics=self.sync_metrics or None)
        return self._sync

    def _values(self, logs: dict[str, Any]) -> dict[str, torch.Tensor | float]:
        values: dict[str, torch.Tensor | float] = {}
        for name in self.sync_metrics:
            v = logs.get(name)
            if v is None:
                values[name] = math.nan  # still one value per name, so the ranks stay in step
            elif isinstance(v, torch.Tensor):
                values[name] = v.detach().squeeze()
            else:
                values[name] = float(v)
        return values

    def _run_early_stopping_check(self, trainer: Any) -> None:
        """Lightning's check, with the decision (and ``sync_metrics``) in one fused collective."""
        sync = self._step_sync(trainer)
        if sync is None:
            # One process: Lightning's own check; the "means" are the local values.
            super()._run_early_stopping_check(trainer)
            logs = trainer.callback_metrics
            if self.sync_metrics and not trainer.fast_dev_run and self.monitor in logs:
                self.synced_metrics = {k: float(v) for k, v in self._values(logs).items()}
            return

        logs = trainer.callback_metrics
        if trainer.fast_dev_run or not self._validate_condition_metric(logs):
            return
        current = logs[self.monitor].squeeze()
        values = self._values(logs)

        if self.monitor in self.sync_metrics:
            # The monitored value rides in the collective; every rank then
            # evaluates the criteria on the same mean and reaches the same
            # decision, so no second round trip is needed.
            out = sync(stop=False, metrics=values)
            self.synced_metrics = {k: float(v) for k, v in out.metrics.items()}
            mean = out.metrics[self.monitor].to(dtype=current.dtype if current.is_floating_point() else torch.float64)
            should_stop, reason = self._evaluate_stopping_criteria(mean.to(current.device))
            should_stop = should_stop or out.stop
        else:
            # Lightning's semantics: each rank decides on its own value, and the
            # job stops when any rank wants to.
            should_stop, reason = self._evaluate_stopping_criteria(current)
            out = sync(stop=should_stop, metrics=values or None)
            if values:
                self.synced_metrics = {k: float(v) for k, v in out.metrics.items()}
            should_stop = out.stop

        trainer.should_stop = trainer.should_stop or should_stop
        if should_stop:
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason_message = reason
        if reason and self.verbose:
            self._log_info(trainer, reason, self.log_rank_zero_only)
