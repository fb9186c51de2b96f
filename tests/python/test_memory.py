"""The guard keeps no finished collective's tensors alive (FSDP2's pattern on gloo).

FSDP2 issues, every step and layer, an all_gather_into_tensor and a
reduce_scatter_tensor on fresh tensors. gloo's reduce_scatter work has no future,
so the guard polls it; it used to hold each such work (and its tensors) until
the watchdog's next poll and then until the kept-works count doubled, and works
waited through their future only stayed behind their futures: memory grew by
every step's gradients (FSDP2 on 2 ranks: +60 MB a step for 24 MB of parameters).
"""
from __future__ import annotations

import gc
import weakref

import torch
import torch.distributed as dist

from harness import assert_all_ok, report, run_ranks

ITERS = 200


def _loop(rank: int, world: int, how: str) -> dict:
    from torch_ext import _C

    alive = []
    n = 1 << 14
    for _ in range(ITERS):
        inp, out = torch.ones(n), torch.empty(world * n)
        if how == "reduce_scatter_wait":
            dist.reduce_scatter_tensor(inp, out, async_op=True).wait()
        elif how == "all_gather_future":
            dist.all_gather_into_tensor(out, inp, async_op=True).get_future().wait()
        else:
            dist.all_gather_into_tensor(out, inp)
        alive += [weakref.ref(inp), weakref.ref(out)]
        del inp, out
    dist.barrier()  # one more collective: the issuing thread frees what finished meanwhile
    gc.collect()
    return {"alive": sum(r() is not None for r in alive), "kept": _C._retired_works()[0]}


def test_finished_collectives_tensors_are_freed_not_kept_by_the_guard():
    for how in ("reduce_scatter_wait", "all_gather_future", "all_gather_sync"):
        results = run_ranks(_loop, 2, how, timeout=60)
        for rank, got in enumerate(assert_all_ok(results)):
            # The last few may still be kept (WorkRetirement scans once 16 are kept), none from
            # long ago: the count must not grow with ITERS.
            assert got["alive"] <= 40, f"{how}, rank {rank}: {got} of {2 * ITERS} tensors alive\n{report(results)}"
            assert got["kept"] <= 40, f"{how}, rank {rank}: {got}\n{report(results)}"
