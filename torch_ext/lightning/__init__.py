"""Lightning integration (imported on demand: ``import torch_ext.lightning``)."""
from __future__ import annotations

from torch_ext.lightning.data import BucketDataLoader

__all__: list[str] = ["BucketDataLoader"]
