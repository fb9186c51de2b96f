"""The GPU check and banner shared by the benchmarks' ``--device cuda`` options."""
from __future__ import annotations

import sys

import torch


def require(flag: str, gpus: int = 1) -> None:
    """Exits with one line naming what is missing when fewer than ``gpus`` CUDA devices are usable."""
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have >= gpus:
        return
    if torch.version.cuda is None:
        why = f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)"
    else:
        why = f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees {have} CUDA device(s)"
    sys.exit(f"error: {flag} needs {gpus} CUDA device(s): {why}; run it on a machine with NVIDIA GPUs "
             "and a CUDA build of torch, or leave the option out to measure on CPU")


def banner() -> str:
    """torch, CUDA and NCCL versions and the GPU model, on one line."""
    nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
    nccl_s = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    gpus = f"{len(names)} x {names[0]}" if len(set(names)) == 1 else ", ".join(names)
    return f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl_s}, GPU: {gpus}"
