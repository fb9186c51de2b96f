"""Collectives issued from autograd hooks (issue 68): a ZeRO-style gradient reduction that each
parameter's post-accumulate-grad hook issues as backward reaches it (ms-swift PR#8102, DeepSpeed#7461).

The guard sees these collectives as any other: in the order backward reaches the parameters, from the
hook's line. A rank whose backward skips a module (no image in its batch, so no vision tower) issues
fewer of them, in another order: the ranks part at the first hook whose parameter differs, and
both raise CollectiveMismatchError out of loss.backward(), naming the hook's line. (Here the first
parted pair, vision.bias against text.bias, is float32[6] on both ranks: a look-alike the default
passes, README's "what the default cannot see"; the next pair differs in shape and fails.) DeepSpeed ZeRO-3
itself is not run here: it is not installed in CI, and its CPU accelerator is a separate setup.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from harness import assert_all_ok, run_ranks


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.text = torch.nn.Linear(8, 6)
        self.vision = torch.nn.Linear(4, 6)
        self.head = torch.nn.Linear(6, 1)

    def forward(self, x: torch.Tensor, image: torch.Tensor | None) -> torch.Tensor:
        h = self.text(x)
        if image is not None:  # only batches with an image run the vision tower
            h = h + self.vision(image)
        return self.head(torch.relu(h))


def reduce_grad(p: torch.Tensor) -> None:
    # ZeRO-style: each parameter's gradient is averaged across ranks as soon as it is accumulated.
    dist.all_reduce(p.grad)
    p.grad /= dist.get_world_size()


def _train(rank: int, world: int, skip_image_on: int) -> dict:
    torch.manual_seed(0)
    model = Model()
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(reduce_grad)
    torch.manual_seed(1 + rank)  # each rank its own batch
    out: dict = {}
    try:
        for step in range(2):
            image = None if rank == skip_image_on and step == 1 else torch.randn(3, 4)
            model.zero_grad()
            model(torch.randn(3, 8), image).sum().backward()
        out["grads"] = {n: p.grad.tolist() for n, p in model.named_parameters()}
    except Exception as e:  # noqa: BLE001 - what the rank's own code would catch
        out["error"] = (type(e).__name__, str(e))
    return out


@pytest.mark.timeout(120)
def test_hook_driven_reductions_give_gloos_bits_through_the_guard():
    guard = assert_all_ok(run_ranks(_train, 2, -1, timeout=60))
    plain = assert_all_ok(run_ranks(_train, 2, -1, backend="gloo", timeout=60))
    assert [v["grads"] for v in guard] == [v["grads"] for v in plain]
    assert guard[0]["grads"] == guard[1]["grads"]  # averaged: the same on every rank


@pytest.mark.timeout(120)
def test_a_rank_whose_backward_skips_a_module_fails_typed_on_every_rank_naming_the_hook():
    values = assert_all_ok(run_ranks(_train, 2, 1, timeout=60))
    for v in values:
        assert v.get("error", ("none",))[0] == "CollectiveMismatchError", v
    text = values[0]["error"][1]
    assert "test_hook_collectives.py" in text and "in reduce_grad" in text, text
    assert "rank 0: all_reduce(float32[6, 4], SUM)" in text and "rank 1: all_reduce(float32[6, 8], SUM)" in text, text
