"""One rank of a short Accelerate job on the guard that ends as examples/accelerate_guard.py ends.

Launched by tests/python/test_accelerate.py with plain env:// (rank 0's process hosts the
TCPStore, as the example's own start does): a prepared DDP model, a few steps, a trigger check,
``wait_for_everyone``, ``gather`` and ``gather_for_metrics``, then ``free_memory`` and
``destroy_process_group``. The test runs it ten times and reads each process's output: a rank
that leaves while the other still talks to the store must not print a C++ stack or a warning.
"""
from __future__ import annotations

import gc

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

import torch_ext  # noqa: F401  (registers the guard backend)


def main() -> None:
    dist.init_process_group("guard")
    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
    model, opt, loader = acc.prepare(model, opt, DataLoader(data, batch_size=4))
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        if acc.check_trigger():
            break
    acc.wait_for_everyone()
    seen = acc.gather(torch.tensor([len(loader)]))
    preds = acc.gather_for_metrics(torch.tensor([dist.get_rank()]))
    print(f"[rank {dist.get_rank()}] steps {seen.tolist()}, gathered {preds.tolist()}", flush=True)
    del model, opt, loader
    acc.free_memory()
    gc.collect()  # DDP holds the process group: let it go before the group does
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
