"""Classic bug: one rank skips a module, and look-alike collectives pass each other.

    python examples/bugs/skipped_module.py

A model gathers each module's sharded weights before using it, through one helper
(as FSDP-style code does). On step 3 rank 1's micro-batch has no image, so it skips
the vision tower: its gather of the text module's shard meets rank 0's gather of the
vision tower's. Both are all_gathers of float32[4]: the signature alone cannot tell
them apart, and by default their data are released (rank 0 reads rank 1's text
weights as vision weights). The error comes one collective later, where an
all_gather meets an all_reduce; the report aligns the ranks' call paths and names
the line where they parted (``vision = gather(...)``) and the rank that skipped it.

    python examples/bugs/skipped_module.py strict   # TORCH_EXT_CHECK=strict
    python examples/bugs/skipped_module.py paths    # the default, with TORCH_EXT_CALL_PATHS=on

In strict mode, and in the default mode with ``TORCH_EXT_CALL_PATHS=on``, the call
path is part of what the ranks compare: the paired gathers fail before either
rank reads the other's data, and the report shows the two lines.
"""
import sys

import torch
import torch.distributed as dist

from _launch import launch

SHARD = 4
# torch 2.13 renamed all_gather_into_tensor (the old name warns); older releases have only that.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def gather(shard: torch.Tensor) -> torch.Tensor:
    full = torch.empty(dist.get_world_size() * SHARD)
    all_gather_single(full, shard)
    return full


def step(rank: int, has_image: bool) -> float:
    weights = {"vision": torch.full((SHARD,), 10.0 + rank), "text": torch.full((SHARD,), 20.0 + rank)}
    seen = 0.0
    if has_image:
        vision = gather(weights["vision"])
        seen += float(vision.sum())
    text = gather(weights["text"])
    loss = torch.tensor([seen + float(text.sum())])
    dist.all_reduce(loss)
    return float(loss)


def train(rank: int, world: int) -> None:
    for i in range(5):
        has_image = not (rank == 1 and i == 3)  # rank 1's fourth micro-batch is text only
        loss = step(rank, has_image)
        if rank == 0:
            print(f"step {i}: loss {loss}", flush=True)


if __name__ == "__main__":
    settings = {"strict": {"TORCH_EXT_CHECK": "strict"}, "paths": {"TORCH_EXT_CALL_PATHS": "on"}}
    launch(train, 2, **settings.get(sys.argv[1] if len(sys.argv) > 1 else "", {}))
