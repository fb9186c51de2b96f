"""Classic bug, as DDP meets it: a parameter without a gradient on one rank.

    python examples/bugs/ddp_unused_parameter.py

A model with a branch the forward skips on some inputs (an auxiliary head, a
mixture-of-experts layer no token reached, a layer frozen on one rank): with
``find_unused_parameters=False`` (DDP's default) the reducer waits for a
gradient that never comes, so it never issues the gradient bucket holding that
parameter, nor any bucket after it (DDP issues them in order). Here rank 1's
step 3 skips ``head``. Plain gloo: rank 0 hangs in the gradient all_reduce
until gloo's timeout, while rank 1's next forward raises DDP's own
"Expected to have finished reduction in the prior iteration" naming parameter
indices (NCCL hangs the same way).

Under the guard, with nothing set:
- rank 1's DDP error is followed by what the guard knows
  (``torch_ext.explain(e)``; an uncaught one is followed by it at exit): which of
  its last backward's buckets it issued, the bucket holding the rest back with
  its parameters, and the collective from which rank 0 waits for it;
- rank 0 raises CollectiveFailureError out of ``loss.backward()`` once rank 1
  has ended, naming rank 1, what it raised, and each collective it never issued
  with its DDP bucket and parameters.
"""
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from _launch import launch


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, skip_head: bool) -> torch.Tensor:
        x = self.body(x).relu()
        return x if skip_head else self.head(x)


def train(rank: int, world: int) -> None:
    torch.manual_seed(0)
    model = DDP(Net(), bucket_cap_mb=0.0001)  # one bucket per layer, to show them
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        loss = model(torch.randn(8, 16), skip_head=(rank == 1 and step == 3)).pow(2).mean()
        loss.backward()  # rank 0's 4th raises CollectiveFailureError once rank 1 has ended
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    launch(train, 2)
