"""Waited small all_reduces that carry their own check (check="verify", the default), then KIND.

Launched once per rank by test_in_band.py (torch_ext.testing.launch_script), at
the guard's default settings. Rank 1 is the odd one out at collective #4+:
  none     the same 200 all_reduces everywhere (each verified in band)
  order    all_reduce then broadcast, against broadcast then all_reduce
  big      a carried all_reduce against one too large to carry
  count    float32[4] against float32[6] (the same carried length)
  length   float32[4] against float32[400] (another carried length)
  op       SUM against MAX (the same carried length: the data mixes)
  dtype    float32 against float64
Each rank writes OUT/rank<r>.json: what it read, or the error it raised.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import torch_ext

dist.init_process_group("guard")
rank = dist.get_rank()
kind = os.environ["KIND"]
odd = rank == 1
record = {"rank": rank}
t0 = time.monotonic()
try:
    n = 200 if kind == "none" else 3
    for i in range(n):
        t = torch.full((4,), float(rank + i))
        dist.all_reduce(t)
        record.setdefault("sums", []).append(float(t[0]))
    t0 = time.monotonic()  # the odd collective
    a, b = torch.ones(4), torch.ones(4)
    if kind == "order":
        if odd:
            dist.broadcast(b, 0)
            dist.all_reduce(a)
        else:
            dist.all_reduce(a)
            dist.broadcast(b, 0)
    elif kind == "big":
        a = torch.ones(4 if not odd else 40000)
        dist.all_reduce(a)
    elif kind == "count":
        a = torch.ones(6 if odd else 4)
        dist.all_reduce(a)
    elif kind == "length":
        a = torch.ones(400 if odd else 4)
        dist.all_reduce(a)
    elif kind == "op":
        dist.all_reduce(a, op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)
    elif kind == "dtype":
        a = torch.ones(4, dtype=torch.float64 if odd else torch.float32)
        dist.all_reduce(a)
    if kind != "none":
        record["read"] = a.tolist()[:8]
    record["verifier"] = torch_ext.group_state()["verifier"]
except torch_ext.GuardError as e:
    record.update(error=type(e).__name__, message=str(e), after_s=time.monotonic() - t0)
with open(os.path.join(os.environ["OUT"], f"rank{rank}.json"), "w") as f:
    json.dump(record, f)
sys.exit(1 if "error" in record else 0)
