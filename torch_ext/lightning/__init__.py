"""Lightning integration (imported on demand: ``import torch_ext.lightning``)."""
from __future__ import annotations

__all__: list[str] = []
