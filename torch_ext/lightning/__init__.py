"""Lightning integration: ``import torch_ext.lightning`` registers ``strategy="ddp_guard"``."""
from __future__ import annotations

from torch_ext.lightning.strategy import GuardDDPStrategy

__all__: list[str] = ["GuardDDPStrategy"]
