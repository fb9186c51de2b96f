"""DDP with a parameter that gets no gradient on one rank (find_unused_parameters=False).

Launched once per rank by test_paths.py. At step 3 rank 1's forward skips
layer ``b``: its reducer never issues the gradient bucket holding ``b`` (nor
the buckets after it), and its next forward raises DDP's own "Expected to have
finished reduction in the prior iteration" RuntimeError, uncaught. Rank 0
issued both buckets and waits for rank 1 in the first. What must follow DDP's
error on rank 1's stderr: which buckets it issued and which one holds it back;
rank 0 gets a CollectiveFailureError naming rank 1 with what it raised, and its
own all_reduce lines name the bucket.
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_ext  # noqa: F401 - registers the guard backend


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, skip: bool) -> torch.Tensor:
        x = self.a(x)
        return x if skip else self.b(x)


dist.init_process_group("guard")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(Net(), bucket_cap_mb=0.0001)  # one bucket per layer
for step in range(6):
    loss = model(torch.randn(4, 8), skip=(rank == 1 and step == 3)).sum()
    loss.backward()
dist.destroy_process_group()
