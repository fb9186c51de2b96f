"""Classic bug, as DDP meets it: a bucket sampler gives one rank a batch fewer per epoch.

    python examples/bugs/ddp_uneven_steps.py

A hand-written multi-scale bucket sampler (NVlabs/Sana's aspect-ratio buckets,
WebDataset shards that do not divide evenly: the mission's sources) gives rank 1
seven batches per epoch and rank 0 eight. Nothing fails where it starts: the
ranks' gradient all_reduces keep pairing, rank 1's second epoch with rank 0's
first, and DDP averages gradients of different steps for three epochs. Plain
gloo then hangs at the end: rank 1 reaches the barrier before saving while
rank 0 is inside ``loss.backward()`` (NCCL hangs too).

Under the guard, with nothing set:
- at the end of epoch 0 a warning names the cause while the job still runs:
  each rank's batch count and the sampler (``TORCH_EXT_EPOCH_CHECK``);
- at the barrier both ranks raise CollectiveMismatchError, rank 0 from inside
  ``loss.backward()`` (the autograd engine rethrows it there), and the report
  shows how each rank got there: 22 gradient all_reduces on rank 0 against 21
  and the barrier on rank 1, and what that pattern means.
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Sampler, TensorDataset

from _launch import launch


class BucketSampler(Sampler):
    """Batches of one aspect-ratio bucket each, the buckets dealt out to ranks in turn:
    15 batches a epoch do not divide by 2 ranks, so rank 0 gets 8 and rank 1 gets 7."""

    def __init__(self, buckets: int, rank: int, world: int) -> None:
        self.mine = [b for b in range(buckets) if b % world == rank]

    def __iter__(self):
        for b in self.mine:
            yield list(range(16 * b, 16 * b + 16))

    def __len__(self) -> int:
        return len(self.mine)


def train(rank: int, world: int) -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16 * 15, 32))
    loader = DataLoader(data, batch_sampler=BucketSampler(15, rank, world))
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        for (x,) in loader:
            loss = model(x).pow(2).mean()
            loss.backward()  # rank 0's 22nd raises CollectiveMismatchError
            opt.step()
            opt.zero_grad()
    dist.barrier()  # everyone done before rank 0 saves
    if rank == 0:
        torch.save(model.module.state_dict(), "model.pt")


if __name__ == "__main__":
    launch(train, 2)
