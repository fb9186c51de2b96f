"""Multi-scale training with aspect-ratio buckets: equal batch counts on every rank.

Three CPU processes (gloo) train a small conv net with DDP on images of four
shapes, with a bigger batch for smaller images. Per-rank bucketing (what Sana /
PixArt style samplers do) would give the ranks different batch counts, and the
rank with more batches would hang in DDP's all_reduce; torch_ext's
BucketBatchSampler plans the epoch globally and deals it, so every rank gets the
same count. Runs in a few seconds:

    python examples/multiscale_buckets.py
"""
from __future__ import annotations

import collections
import gc
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import torch_ext

# torch 2.13 renamed all_gather_into_tensor (the old name warns); older releases have only that.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

SHAPES = [(32, 64), (48, 48), (64, 32), (64, 64)]  # (height, width) buckets
WEIGHTS = [3, 8, 2, 1]                              # skewed: most images are square
BATCH = {(32, 64): 16, (48, 48): 12, (64, 32): 16, (64, 64): 8}
NUM_SAMPLES = 1000                                   # does not divide by 3 ranks
EPOCHS = 2


class ToyImages(Dataset):
    """Images whose shape is their bucket; pixels and labels derived from the index."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        picks = torch.multinomial(torch.tensor(WEIGHTS, dtype=torch.float), n, replacement=True, generator=g)
        self.shapes = [SHAPES[i] for i in picks.tolist()]

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, i: int):
        h, w = self.shapes[i]
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, h, w, generator=g), i % 2


def per_rank_bucketing_count(shapes, world: int, rank: int, epoch: int) -> int:
    """Batches a sampler that splits first and buckets per rank would yield (the bug)."""
    split = DistributedSampler(range(len(shapes)), num_replicas=world, rank=rank, seed=0)
    split.set_epoch(epoch)
    pending, batches = collections.Counter(), 0
    for i in split:
        pending[shapes[i]] += 1
        if pending[shapes[i]] == BATCH[shapes[i]]:
            pending[shapes[i]] = 0
            batches += 1
    return batches


def train(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    dataset = ToyImages(NUM_SAMPLES)
    sampler = torch_ext.BucketBatchSampler(dataset.shapes, BATCH, seed=0, policy="pad")
    sampler.check_consistent()  # one all_gather: every rank built the same plan
    loader = DataLoader(dataset, batch_sampler=sampler)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(8, 2),
    )
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        steps, shapes = 0, collections.Counter()
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            opt.zero_grad()
            loss.backward()  # DDP all_reduce: needs the same number of steps on every rank
            opt.step()
            steps += 1
            shapes[tuple(images.shape[2:])] += 1
        counts = torch.zeros(2 * world, dtype=torch.int64)
        mine = torch.tensor([steps, per_rank_bucketing_count(dataset.shapes, world, rank, epoch)])
        all_gather_single(counts, mine)
        ours, theirs = counts.view(world, 2).t().tolist()
        if rank == 0:
            print(f"epoch {epoch}: batches per rank with BucketBatchSampler {ours} (len {len(sampler)}), "
                  f"with per-rank bucketing {theirs}; rank 0 batch shapes {dict(shapes)}")
    # DDP holds the process group; drop it first, so the group is torn down by
    # destroy_process_group() rather than during interpreter shutdown (a gloo group
    # left to shutdown aborted a rank once in our CI: "terminate called without an
    # active exception").
    del model, opt
    gc.collect()
    dist.destroy_process_group()


def main() -> None:
    world = 3
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(world, port), nprocs=world, join=True)


if __name__ == "__main__":
    main()
