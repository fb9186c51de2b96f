"""A gradient hook's all_reduce against a grad-norm all_reduce of the same shape (issue 67).

Launched once per rank by test_call_paths.py (torch_ext.testing.launch_script). Both ranks
register a hook on a bias's gradient that all_reduces it (float32[1]) and all_reduce the
weight's grad norm (float32[1]) after each backward. On step 3 rank 1's batch leaves the bias
out, so its hook does not run: its norm all_reduce pairs with rank 0's hook all_reduce. Each
rank prints its norm per step and, on an error, its type; the exit status is 3 on an error.
"""
import os
import sys

import torch
import torch.distributed as dist

import torch_ext  # noqa: F401  (registers "guard")

rank = int(os.environ["RANK"])
dist.init_process_group("guard")
w = torch.nn.Parameter(torch.ones(1))
b = torch.nn.Parameter(torch.ones(1))


def sync_grad(g):
    dist.all_reduce(g)
    return g


b.register_hook(sync_grad)
try:
    for step in range(6):
        x = torch.tensor([float(step + 1)])
        use_bias = not (rank == 1 and step == 3)  # rank 1's batch leaves the bias out
        loss = (w * x + (b if use_bias else 0)).sum()
        loss.backward()
        norm = w.grad.norm().reshape(1)
        dist.all_reduce(norm)
        print(f"[rank {rank}] step {step}: grad norm {float(norm)}", flush=True)
        w.grad = None
        b.grad = None
    dist.destroy_process_group()
except Exception as e:  # noqa: BLE001 - the test reads which error
    print(f"[rank {rank}] raised {type(e).__name__}:\n{e}", flush=True)
    sys.exit(3)
