"""Lightning integration.

``import torch_ext.lightning`` registers ``strategy="ddp_guard"`` (see
:class:`GuardDDPStrategy`) and provides :class:`BucketDataLoader`, a loader for
:class:`torch_ext.BucketBatchSampler` that Lightning does not re-wrap per rank,
and :class:`EarlyStopping`, Lightning's callback on the fused step sync.
"""
from __future__ import annotations

from torch_ext.lightning.data import BucketDataLoader
from torch_ext.lightning.early_stopping import EarlyStopping
from torch_ext.lightning.strategy import GuardDDPStrategy, StragglerMetrics

__all__: list[str] = ["BucketDataLoader", "EarlyStopping", "GuardDDPStrategy", "StragglerMetrics"]
