"""A DDP training loop on CPU whose rank 1 differs, run once per rank (``python verify_ddp.py CASE OUT``).

Used by test_verify.py through harness.launch_script, with the guard's DEFAULT
settings (check=verify). DDP checks at construction that every rank's parameters
have the same shapes (and broadcasts rank 0's values), so a model that differs in
shape is DDP's own error there, before any step. The cases are differences that
construction lets through, so the first gradient bucket's all_reduce differs:

  larger_param  rank 1's Linear takes 4 inputs instead of 3 (one bucket of 10
                gradients vs 8), with ``init_sync=False`` (DDP's option to skip the
                construction check and broadcast, for models known to be equal,
                e.g. all loaded from one checkpoint)
  bucket_cap    the same Linear(2, 2) everywhere, but rank 1 is configured with
                ``find_unused_parameters=True`` and a tiny ``bucket_cap_mb``: its
                gradients go out in two buckets (bias float32[2], weight
                float32[4]), the others' in one (float32[6])

The models are tiny on purpose: gloo itself aborts the process (std::terminate in
its I/O thread: "Received data size doesn't match expected size") on most
all_reduces whose element counts differ, since the op runs while the check does.
10 vs 8 and 2 or 4 vs 6 elements on 3 ranks are counts it lets through (measured),
so what is tested is the guard's verdict, not gloo's abort.

Each rank writes OUT/ddp{rank}.json: how far it got (steps whose optimizer.step()
ran), the error it got (type and message), and whether its parameters still equal
the initial ones. The error is then re-raised: the process must end non-zero.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_ext

case, out = sys.argv[1], sys.argv[2]
dist.init_process_group("guard")
rank = dist.get_rank()
odd = rank == 1
print(torch_ext.describe(), flush=True)
torch.manual_seed(0)

features = {"larger_param": 4 if odd else 3, "bucket_cap": 2}[case]
model = nn.Linear(features, 2)
options = {}
if case == "larger_param":
    options["init_sync"] = False
elif odd:
    options.update(find_unused_parameters=True, bucket_cap_mb=1e-6)
ddp = DDP(model, **options)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
initial = [p.detach().clone() for p in model.parameters()]

record = {"steps_applied": 0, "error_type": None, "error": None, "step_failed": None}
try:
    for step in range(3):
        x = torch.randn(5, features)
        loss = ddp(x).pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        record["steps_applied"] += 1
except Exception as e:
    record.update(error_type=type(e).__name__, error=str(e), step_failed=step,
                  mismatch=isinstance(e, torch_ext.CollectiveMismatchError),
                  dist_backend_error=isinstance(e, dist.DistBackendError),
                  failure_kind=(torch_ext.failure() or ("", ""))[0])
    raise
finally:
    record["params_unchanged"] = all(torch.equal(a, p.detach()) for a, p in zip(initial, model.parameters()))
    with open(os.path.join(out, f"ddp{rank}.json"), "w") as f:
        json.dump(record, f)
dist.destroy_process_group()
