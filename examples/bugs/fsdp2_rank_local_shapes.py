"""Classic bug: FSDP2 over a model whose shapes come from each rank's own config.

    python examples/bugs/fsdp2_rank_local_shapes.py

Rank 1 read an old config and built its middle layer wider. FSDP2 shards each
rank's parameters as they are, so the first forward's all_gather of that layer
differs in size across ranks. Every rank raises the same CollectiveMismatchError
before any data is read, and the report names the module FSDP2 was gathering,
its parameters, and each parameter's shape on each rank: rank 1's line shows the
wider weight.
"""
import torch
from torch.distributed.fsdp import fully_shard

from _launch import launch


def train(rank: int, world: int) -> None:
    hidden = 16 if rank == 1 else 8  # rank 1 read an old config
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, hidden),
                              torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(3):
        loss = net(torch.randn(4, 8)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    launch(train, 3)
