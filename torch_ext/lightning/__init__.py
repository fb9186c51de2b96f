"""Lightning integration (imported on demand: ``import torch_ext.lightning``)."""
from __future__ import annotations

from torch_ext.lightning.early_stopping import EarlyStopping

__all__: list[str] = ["EarlyStopping"]
