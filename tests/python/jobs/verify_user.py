"""A user's script with one collective that differs across ranks, run once per rank.

Used by test_verify.py through harness.launch_script (``python verify_user.py CASE OUT``)
with the guard's DEFAULT settings (check=verify). Rank 1 is the odd one out. Each
rank reads the result of the differing collective and saves it to
OUT/result{rank}.pt, as a training script saves a checkpoint: under check=verify
no rank may get that far. The call sites carry ``# site:CASE:odd`` / ``# site:CASE:even``
markers; the test finds their line numbers in the report by them.

Cases:
  size       all_reduce float32[10] (rank 1) vs float32[8]: the issue's case
  dtype      all_reduce int32[8] (rank 1) vs float32[8] (same element size)
  op         broadcast(src=0) (rank 1) vs all_reduce, float32[8]
  all_gather all_gather of float32[3] per rank (rank 1) vs float32[2]
  last       as `size`, but the script never calls destroy_process_group:
             the differing collective is the last one before save-and-exit
  unwaited   as `size` with async_op=True, never waited, no destroy_process_group:
             the script ends normally and only the exit path can fail it
  unwaited_verdict_first
             as `unwaited`, but the script goes on until the guard's verdict is in
             (torch_ext.failure() is set: what a script busy with other work
             after the collective looks like) before it ends
  unwaited_destroy
             as `unwaited`, then destroy_process_group(), which must raise
  all_gather_bytes
             all_gather of float32[3] (rank 1) vs float32[2]: byte counts differ,
             which gloo answers by aborting a receiving process
  future     as `size` with async_op=True, read through work.get_future()
  then       as `size` with async_op=True, read in a then() callback
  poll       as `size` with async_op=True, read once work.is_completed() says so
"""
import os
import sys
import time

import torch
import torch.distributed as dist

import torch_ext

case, out = sys.argv[1], sys.argv[2]
dist.init_process_group("guard")
rank = dist.get_rank()
odd = rank == 1
print(torch_ext.describe(), flush=True)

# A matching collective first: the differing one is not the group's first.
warmup = torch.ones(4)
dist.all_reduce(warmup)
assert warmup.tolist() == [float(dist.get_world_size())] * 4


def step():
    if case in ("size", "last"):
        if odd:
            t = torch.ones(10)
            dist.all_reduce(t)  # site:size:odd
        else:
            t = torch.ones(8)
            dist.all_reduce(t)  # site:size:even
        return t
    if case == "dtype":
        if odd:
            t = torch.ones(8, dtype=torch.int32)
            dist.all_reduce(t)  # site:dtype:odd
        else:
            t = torch.ones(8)
            dist.all_reduce(t)  # site:dtype:even
        return t
    if case == "op":
        t = torch.full((8,), float(rank))
        if odd:
            dist.broadcast(t, src=0)  # site:op:odd
        else:
            dist.all_reduce(t)  # site:op:even
        return t
    if case == "all_gather":
        shape = (3, 2) if odd else (2, 3)
        parts = [torch.empty(shape) for _ in range(dist.get_world_size())]
        if odd:
            dist.all_gather(parts, torch.full(shape, float(rank)))  # site:all_gather:odd
        else:
            dist.all_gather(parts, torch.full(shape, float(rank)))  # site:all_gather:even
        return torch.cat([p.flatten() for p in parts])
    if case == "all_gather_bytes":
        n = 3 if odd else 2
        parts = [torch.empty(n) for _ in range(dist.get_world_size())]
        if odd:
            dist.all_gather(parts, torch.full((n,), float(rank)))  # site:all_gather_bytes:odd
        else:
            dist.all_gather(parts, torch.full((n,), float(rank)))  # site:all_gather_bytes:even
        return torch.cat(parts)
    if case in ("future", "poll", "then"):
        t = torch.ones(10 if odd else 8)
        if odd:
            work = dist.all_reduce(t, async_op=True)  # site:async:odd
        else:
            work = dist.all_reduce(t, async_op=True)  # site:async:even
        if case == "future":
            fut = work.get_future()
            fut.wait()
            return fut.value()[0]
        if case == "poll":
            while not work.is_completed():
                time.sleep(0.01)  # a user's polling loop
            return t
        seen = []
        done = work.get_future().then(lambda fut: seen.append(fut.value()[0].clone()))
        done.wait()
        return seen[0]
    if case in ("unwaited", "unwaited_verdict_first", "unwaited_destroy"):
        if odd:
            t = torch.ones(10)
            dist.all_reduce(t, async_op=True)  # site:unwaited:odd
        else:
            t = torch.ones(8)
            dist.all_reduce(t, async_op=True)  # site:unwaited:even
        return None
    raise ValueError(case)


result = step()
if case == "unwaited_verdict_first":
    deadline = time.monotonic() + 30
    while torch_ext.failure() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    # Only the kind: what the user is told must come from the guard itself.
    print(f"rank {rank}: the guard's verdict is in: {(torch_ext.failure() or ('none',))[0]}", flush=True)
if result is not None:
    torch.save(result.clone(), os.path.join(out, f"result{rank}.pt"))
print(f"rank {rank} reached the end of its script", flush=True)
if case not in ("last", "unwaited", "unwaited_verdict_first"):
    dist.destroy_process_group()
