"""PyTorch #174844's shape: rank 1 all_gathers 6 elements, the others 4, in the default check mode.

Launched once per rank by test_paths.py (torch_ext.testing.launch_script). gloo
terminates the rank that receives more bytes than it expects (its transport
thread's EnforceNotMet: no Python runs after it); the others must still get
CollectiveMismatchError describing every rank's call, and the terminated
rank's stderr must say why it dies. Each rank that raises writes its error to
OUT/rank<r>.json.
"""
import json
import os
import sys

import torch
import torch.distributed as dist

import torch_ext

dist.init_process_group("guard")
rank, world = dist.get_rank(), dist.get_world_size()
n = 6 if rank == 1 else 4
try:
    for _ in range(3):
        dist.all_reduce(torch.ones(2))
    out = torch.zeros(n * world)
    dist.all_gather_into_tensor(out, torch.ones(n))
    dist.barrier()
except torch_ext.GuardError as e:
    with open(os.path.join(os.environ["OUT"], f"rank{rank}.json"), "w") as f:
        json.dump({"type": type(e).__name__, "message": str(e)}, f)
    sys.exit(1)
