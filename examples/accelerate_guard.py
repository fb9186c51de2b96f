"""Hugging Face Accelerate on the guard backend: a Sana-style bucketed training loop (CPU, 2 ranks).

Accelerate creates its own process group unless one exists. On CPU it always
asks for "gloo" (passing ``InitProcessGroupKwargs(backend="guard")`` raises
"Your assigned backend guard is not available, please use gloo"), so the guard
is brought in by initialising the group first; ``Accelerator`` then reuses it.
``cpu=True`` matters on a machine without GPUs: without it Accelerate runs every
rank as a separate single-process job (``DistributedType.NO``), silently.

The loop: images in four aspect-ratio buckets, ``torch_ext.BucketBatchSampler``
planning the epoch, ``accelerator.prepare`` dealing its batches to the ranks,
DDP via Accelerate, a divergence check with ``set_trigger``/``check_trigger``,
``wait_for_everyone`` between epochs and an evaluation with
``gather_for_metrics``. Every collective runs through the guard, which would
turn a rank that falls out of step into an error naming it instead of a hang.

    python examples/accelerate_guard.py                            # starts 2 CPU ranks itself
    torchrun --nproc-per-node 2 examples/accelerate_guard.py       # or under torchrun

On GPUs, ``Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="guard")])``
is honoured as is (after ``import torch_ext``); see docs/architecture.md#accelerate.
"""
from __future__ import annotations

import gc
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset

import torch_ext

SHAPES = [(32, 64), (48, 48), (64, 32), (64, 64)]  # (height, width) buckets
WEIGHTS = [3, 8, 2, 1]                              # most images are square
BATCH = {(32, 64): 8, (48, 48): 6, (64, 32): 8, (64, 64): 4}
NUM_SAMPLES, NUM_EVAL, EPOCHS = 300, 50, 2
STOP_AT = (1, 5)  # (epoch, step) at which rank 1 "sees a NaN loss" and asks everyone to stop


class ToyImages(Dataset):
    """Images whose shape is their bucket; pixels and labels derived from the index."""

    def __init__(self, n: int, shapes=SHAPES, weights=WEIGHTS) -> None:
        g = torch.Generator().manual_seed(0)
        picks = torch.multinomial(torch.tensor(weights, dtype=torch.float), n, replacement=True, generator=g)
        self.shapes = [shapes[i] for i in picks.tolist()]

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, i: int):
        h, w = self.shapes[i]
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, h, w, generator=g), i % 2, i


def train() -> None:
    # 1. The guard first: Accelerate finds an initialised group and keeps it.
    dist.init_process_group("guard", timeout=timedelta(seconds=120))
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    assert dist.get_backend() == "guard" and accelerator.num_processes == dist.get_world_size()

    # 2. The global plan (num_replicas=1): accelerator.prepare deals its batch k to
    #    rank k % world, as BucketBatchSampler itself would. A per-rank sampler
    #    (the default num_replicas) would be dealt a second time: each rank would
    #    see only 1/world of its own batches.
    dataset = ToyImages(NUM_SAMPLES)
    sampler = torch_ext.BucketBatchSampler(dataset.shapes, BATCH, num_replicas=1, rank=0, seed=0)
    loader = DataLoader(dataset, batch_sampler=sampler)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(8, 2),
    )
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    model, opt, loader = accelerator.prepare(net, opt, loader)

    seen: set[int] = set()
    for epoch in range(EPOCHS):  # Accelerate calls set_epoch on the sampler (through sampler.sampler)
        steps = 0
        for images, labels, index in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            accelerator.backward(loss)  # DDP's all_reduce, through the guard
            opt.step()
            opt.zero_grad()
            steps += 1
            seen.update(index.tolist())
            if rank == 1 and (epoch, steps) == STOP_AT:
                accelerator.set_trigger()  # e.g. a NaN loss on one rank
            if accelerator.check_trigger():  # one all_reduce: every rank stops at the same step
                break
        accelerator.wait_for_everyone()
        print(f"[rank {rank}] epoch {epoch}: {steps} steps of {len(loader)}", flush=True)

    covered = accelerator.gather(torch.tensor([len(seen)]))  # an all_gather, through the guard
    everyone = [None] * accelerator.num_processes
    dist.all_gather_object(everyone, sorted(seen))
    union = set().union(*everyone)

    # 3. Evaluation: gather_for_metrics drops the samples Accelerate repeated to
    #    even out the last batch, so the totals are exact.
    eval_loader = accelerator.prepare(DataLoader(ToyImages(NUM_EVAL, [(48, 48)], [1]), batch_size=8))
    correct = total = 0
    model.eval()
    with torch.no_grad():
        for images, labels, _ in eval_loader:
            preds, targets = accelerator.gather_for_metrics((model(images).argmax(1), labels))
            correct += int((preds == targets).sum())
            total += len(targets)
    print(f"[rank {rank}] samples seen per rank {covered.tolist()}, together {len(union)} of {NUM_SAMPLES}; "
          f"eval gathered {total} of {NUM_EVAL} (accuracy {correct / total:.2f}); "
          f"accelerate backend label {accelerator.state.backend!r}, process group {dist.get_backend()!r}", flush=True)
    del model, opt, loader, eval_loader
    accelerator.free_memory()


def _worker(rank: int, world: int, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _run()


def _run() -> None:
    try:
        train()
    finally:
        gc.collect()  # DDP holds the process group: let it go before the group does
        if dist.is_initialized():
            dist.destroy_process_group()


def main(world: int = 2) -> None:
    if "RANK" in os.environ:  # torchrun
        _run()
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    mp.start_processes(_worker, args=(world, port), nprocs=world, start_method=method)


if __name__ == "__main__":
    main()
