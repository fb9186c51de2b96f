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
  fsdp     no difference: 40 each of all_gather_into_tensor (float32, bfloat16) and
           reduce_scatter_tensor (float32 SUM and AVG, int64 MAX), FSDP2's two collectives
  alltoall no difference: 30 uneven all_to_all_single, each followed by carried all_reduces
           waited before it
  one      no difference: one-element all_reduces (float32, float64, int32 wrapping), any world;
           at world 2 also integer MAX and MIN, and floating MAX/MIN with NaNs and zeros of both
           signs beside a plain gloo group's (their bits)
  future   no difference: async all_reduces read through get_future() (and then()), or only
           polled with is_completed(), never waited
  inflight no difference: 30 times, 8 async float32[16] all_reduces in flight at once, then waited
  onecount float32[1] against float32[2] (int64 at more than two ranks)
  onedtype float32[1] against float64[1] (int32 against int64 at more than two ranks)
  oneop    float32[1] SUM against int32[1] MAX (at two ranks both packed in one int64)
  flagop   float32[1] MAX against float32[1] MIN (at three ranks and more both keyed, the same two int64 words)
  flagdtype float32[1] MAX against int32[1] MAX (keyed alike)
  gather   all_gather_into_tensor of float32[4] against float32[6]
  scatter  reduce_scatter_tensor of int64 SUM against MAX
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
    world = dist.get_world_size()
    if kind == "fsdp":
        got = record["fsdp"] = []
        for i in range(40):
            for dtype in (torch.float32, torch.bfloat16):
                out = torch.zeros(3 * world, dtype=dtype)
                dist.all_gather_into_tensor(out, torch.full((3,), float(rank + i), dtype=dtype))
                got.append(out.float().tolist())
            for op, dtype in ((dist.ReduceOp.SUM, torch.float32), (dist.ReduceOp.AVG, torch.float32),
                              (dist.ReduceOp.MAX, torch.int64)):
                out = torch.zeros(2, dtype=dtype)
                inp = torch.arange(2 * world, dtype=dtype) + rank + i
                dist.reduce_scatter_tensor(out, inp, op=op)
                got.append(out.float().tolist())
    if kind == "alltoall":
        got = record["alltoall"] = []
        send = [1, 2] if rank == 0 else [3, 4]  # rank 0 sends 1 to itself and 2 to rank 1; rank 1 sends 3 and 4
        recv = [1, 3] if rank == 0 else [2, 4]
        for i in range(30):
            # Not waited before the all_reduces: their in-band agreement covers it, and
            # waits for a round to have compared its pairing.
            out = torch.zeros(sum(recv))
            work = dist.all_to_all_single(out, torch.full((sum(send),), float(10 * rank + i)),
                                          output_split_sizes=recv, input_split_sizes=send, async_op=True)
            sums = []
            for _ in range(2):
                t = torch.full((4,), float(rank + i))
                dist.all_reduce(t)
                sums.append(t.tolist())
            work.wait()
            got += [out.tolist()] + sums
    if kind == "one":
        got = record["one"] = []
        step = 0.1 if world == 2 else 0.25  # among more than two ranks: sums exact in any order
        for i in range(40):
            for dtype, value in ((torch.float32, step * (rank + i)), (torch.float64, step * (rank + i)),
                                 (torch.int32, 2**31 - 1 if rank == 0 else i)):
                t = torch.tensor([value], dtype=dtype)
                dist.all_reduce(t)
                got.append(t.item())
            if world == 2:  # integer MAX/MIN (an early-stop flag): the pair exchange's too
                for dtype, op, value in ((torch.int64, dist.ReduceOp.MAX, 1000 * rank + i),
                                         (torch.int32, dist.ReduceOp.MIN, -rank - i)):
                    t = torch.tensor([value], dtype=dtype)
                    dist.all_reduce(t, op=op)
                    got.append(t.item())
        if world == 2:  # floating MAX/MIN: a NaN against a number, 0 against -0, as plain gloo picks
            plain = dist.new_group(backend="gloo")
            bits = record["one_bits"] = []
            cases = [(dtype, n) for dtype in (torch.float32, torch.float64) for n in (1, 2, 3, 5, 9, 1000)]
            for dtype, n in cases:  # n: where gloo's ring splits the elements between the two ranks
                as_int = torch.int32 if dtype == torch.float32 else torch.int64
                nan = torch.tensor([float("nan")], dtype=dtype).view(as_int) + 1 + rank  # a payload per rank
                pattern = torch.tensor([0.0, -0.0, float("nan"), 1.0, -float("inf")], dtype=dtype)
                if rank == 1:
                    pattern = torch.tensor([-0.0, 0.0, 2.0, float("nan"), float("inf")], dtype=dtype)
                for op in (dist.ReduceOp.MAX, dist.ReduceOp.MIN):
                    t = torch.cat([nan.view(dtype), pattern]).repeat(n // 6 + 1)[:n]
                    u = t.clone()
                    dist.all_reduce(t, op=op)
                    dist.all_reduce(u, op=op, group=plain)
                    bits.append([t.view(as_int).tolist(), u.view(as_int).tolist()])
    if kind == "future":
        got = record["future"] = []
        for i in range(20):
            t = torch.tensor([float(rank + i)])
            fut = dist.all_reduce(t, async_op=True).get_future()
            got.append(fut.then(lambda f: f.value()[0].item() * 2).wait())
            u = torch.full((3,), float(rank + i))
            work = dist.all_reduce(u, async_op=True)
            deadline = time.monotonic() + 30
            while not work.is_completed():  # polled only: completes without a wait()
                assert time.monotonic() < deadline, "an all_reduce polled with is_completed() never completed"
                time.sleep(0.001)
            got.append(u.tolist())
    if kind == "inflight":
        got = record["inflight"] = []
        for i in range(30):
            ts = [torch.full((16,), float(rank + i + j)) for j in range(8)]
            works = [dist.all_reduce(t, async_op=True) for t in ts]
            for w in works:
                w.wait()
            got.append([t[0].item() for t in ts])
    n = 200 if kind == "none" else 3
    for i in range(n):
        t = torch.full((4,), float(rank + i))
        dist.all_reduce(t)
        record.setdefault("sums", []).append(float(t[0]))
    t0 = time.monotonic()  # the odd collective
    # Among more than two ranks only an integer element carries one word (a floating one waits for rounds).
    one_dtype = torch.float32 if world == 2 else torch.int64
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
    elif kind == "onecount":
        a = torch.ones(2 if odd else 1, dtype=one_dtype)
        dist.all_reduce(a)
    elif kind == "onedtype":
        a = torch.ones(1, dtype=torch.float64 if odd else torch.float32) if world == 2 else \
            torch.ones(1, dtype=torch.int64 if odd else torch.int32)
        dist.all_reduce(a)
    elif kind == "oneop":
        a = torch.ones(1, dtype=torch.int32 if odd else torch.float32)
        dist.all_reduce(a, op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)
    elif kind == "flagop":
        a = torch.full((1,), float(rank))
        dist.all_reduce(a, op=dist.ReduceOp.MIN if odd else dist.ReduceOp.MAX)
    elif kind == "flagdtype":
        a = torch.full((1,), rank, dtype=torch.int32 if odd else torch.float32)
        dist.all_reduce(a, op=dist.ReduceOp.MAX)
    elif kind == "gather":
        a = torch.ones(6 if odd else 4)
        dist.all_gather_into_tensor(torch.zeros(a.numel() * 2), a)
    elif kind == "scatter":
        a = torch.ones(4, dtype=torch.int64)  # an integer reduce_scatter carries its check
        dist.reduce_scatter_tensor(a[:2], torch.ones(4, dtype=torch.int64),
                                   op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)
    elif kind == "dtype":
        a = torch.ones(4, dtype=torch.float64 if odd else torch.float32)
        dist.all_reduce(a)
    if kind not in ("none", "fsdp", "alltoall", "one", "future"):
        record["read"] = a.tolist()[:8]
    record["verifier"] = torch_ext.group_state()["verifier"]
except torch_ext.GuardError as e:
    record.update(error=type(e).__name__, message=str(e), after_s=time.monotonic() - t0)
with open(os.path.join(os.environ["OUT"], f"rank{rank}.json"), "w") as f:
    json.dump(record, f)
sys.exit(1 if "error" in record else 0)
