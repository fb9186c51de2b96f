"""A branch every rank takes together: torch_ext.agree before an optional module.

A multimodal batch may or may not hold images. Deciding on each rank's own batch
(``if batch_has_images: vision_tower(...)``) issues the tower's collectives on some
ranks only: the ranks part (a hang on NCCL, a mismatch report under the guard).
Agreeing first costs one small all_reduce and keeps every rank on the same path:
the ranks without images run the tower on zeros and drop its output. A loop that
already syncs each step with a StepSync (stop, metrics) votes in that same
all_reduce instead (``decide={"tower": ...}``, then ``out.any("tower")``): the
second loop below.

    torchrun --nproc-per-node 2 examples/agree_branch.py
    python examples/agree_branch.py            # spawns 2 CPU processes itself
"""
from __future__ import annotations

import torch
import torch.distributed as dist

import torch_ext
from _run import run_example


def vision_tower(images: torch.Tensor) -> torch.Tensor:
    feats = images.mean(dim=1)
    dist.all_reduce(feats)  # stands for the tower's own collectives (FSDP's all_gathers, a sync-BN)
    return feats


def train() -> None:
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(rank)
    ran = 0
    for step in range(20):
        batch_has_images = bool(torch.rand(1, generator=gen) < 0.3)  # this rank's own data
        if torch_ext.agree(batch_has_images, "any"):  # one decision, the same on every rank
            images = torch.randn(4, 16, generator=gen) if batch_has_images else torch.zeros(4, 16)
            feats = vision_tower(images)
            ran += 1
            if not batch_has_images:
                del feats  # ran only to stay in step with the ranks that have images
    total = torch_ext.agree(ran, "max")
    print(f"rank {rank}: ran the vision tower on {ran} of 20 steps (every rank: {total})")

    # The same decision inside the step's own sync: no collective of its own.
    sync = torch_ext.StepSync()
    ran = 0
    for step in range(20):
        batch_has_images = bool(torch.rand(1, generator=gen) < 0.3)
        loss = torch.rand(1, generator=gen)
        out = sync(metrics={"loss": loss}, decide={"tower": batch_has_images})
        if out.any("tower"):  # True on every rank, or on none
            images = torch.randn(4, 16, generator=gen) if batch_has_images else torch.zeros(4, 16)
            vision_tower(images)
            ran += 1
    print(f"rank {rank}: with StepSync, ran the vision tower on {ran} of 20 steps, "
          f"mean loss {out.metric('loss'):.3f}")
    dist.barrier()  # reached by every rank: nobody is left waiting in a collective


if __name__ == "__main__":
    run_example(train)
