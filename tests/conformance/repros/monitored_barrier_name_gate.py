#!/usr/bin/env python
"""dist.monitored_barrier() refuses guard by name; the forward itself works.

torch.distributed.monitored_barrier starts with
``if get_backend(group) != Backend.GLOO: raise ValueError("monitored_barrier is
only implemented for GLOO backend.")``, so on a guard group it raises although
``GuardBackend::monitoredBarrier`` forwards to the inner gloo backend. Called one
level lower, ``group.monitored_barrier(timeout, wait_all_ranks)`` (the method the
public function ends in) works on guard, including naming the rank that did not
arrive. Suite tests concerned: test_monitored_barrier_gloo, _gloo_subgroup,
_gloo_rank_0_timeout, _failure_order, _wait_all_ranks (all gated on "gloo").

    PYTHONPATH=$PWD python tests/conformance/repros/monitored_barrier_name_gate.py

Exits 1 while dist.monitored_barrier refuses guard.
"""
import os
import sys
import tempfile
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, init: str, q) -> None:
    import torch_ext  # noqa: F401

    dist.init_process_group("guard", init_method=f"file://{init}", rank=rank, world_size=2)
    out = {}
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=10))
        out["public"] = "ok"
    except Exception as e:  # noqa: BLE001
        out["public"] = f"{type(e).__name__}: {e}"
    try:
        dist.group.WORLD.monitored_barrier(timedelta(seconds=10), wait_all_ranks=False)
        out["method"] = "ok"
    except Exception as e:  # noqa: BLE001
        out["method"] = f"{type(e).__name__}: {e}"
    q.put((rank, out))
    q.close()
    q.join_thread()
    os._exit(0)


def main() -> int:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = tempfile.mktemp()
    ps = [ctx.Process(target=worker, args=(r, init, q)) for r in range(2)]
    for p in ps:
        p.start()
    res = dict(q.get(timeout=120) for _ in ps)
    for p in ps:
        p.join(timeout=30)
    for r in sorted(res):
        print(f"rank {r}: dist.monitored_barrier -> {res[r]['public']}")
        print(f"rank {r}: ProcessGroup.monitored_barrier -> {res[r]['method']}")
    return 0 if all(v["public"] == "ok" for v in res.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
