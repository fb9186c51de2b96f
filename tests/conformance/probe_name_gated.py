#!/usr/bin/env python
"""Exercises, on guard and on gloo, the features that distributed_test.py only
tests when ``BACKEND == "gloo"`` (so its tests skip for any other backend name).

The suite cannot be told that guard serves CPU tensors through gloo: these tests
are gated by string comparisons with the backend name. This probe runs the same
kinds of calls (our own code, not the suite's) through ``guard`` and through
``gloo`` and prints one line per check::

    PYTHONPATH=$PWD python tests/conformance/probe_name_gated.py [--world-size 2] [--json out.json]

Each check names the suite tests it stands in for. Exit status 0 when every check
that passes on gloo also passes on guard.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _init(backend: str, rank: int, world: int, init_file: str, timeout: float = 60.0) -> None:
    dist.init_process_group(
        backend, init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=timeout)
    )


def check_sparse_all_reduce(rank: int, world: int) -> None:
    # test_sparse_all_reduce_sum: gloo reduces sparse COO tensors.
    idx = torch.tensor([[rank, world]], dtype=torch.long)
    val = torch.tensor([float(rank + 1), 1.0])
    t = torch.sparse_coo_tensor(idx, val, (world + 1,))
    dist.all_reduce(t)
    dense = t.to_dense()
    expect = torch.zeros(world + 1)
    for r in range(world):
        expect[r] += r + 1
    expect[world] = world
    torch.testing.assert_close(dense, expect)


def check_batch_isend_irecv(rank: int, world: int) -> None:
    # test_batch_isend_irecv_gloo / _gloo_tags
    ops, bufs = [], {}
    for peer in range(world):
        if peer == rank:
            continue
        bufs[peer] = torch.full((3,), -1.0)
        ops.append(dist.P2POp(dist.irecv, bufs[peer], peer, tag=peer))
        ops.append(dist.P2POp(dist.isend, torch.full((3,), float(rank)), peer, tag=rank))
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    for peer, b in bufs.items():
        torch.testing.assert_close(b, torch.full((3,), float(peer)))


def check_all_reduce_coalesced(rank: int, world: int) -> None:
    # test_all_reduce_coalesced_* (require_backend_is_available({"gloo"}))
    ts = [torch.full((2, 2), float(rank + 1)), torch.full((3,), complex(rank, 1), dtype=torch.cfloat)]
    dist.all_reduce_coalesced(ts)
    s = sum(r + 1 for r in range(world))
    torch.testing.assert_close(ts[0], torch.full((2, 2), float(s)))
    torch.testing.assert_close(ts[1], torch.full((3,), complex(sum(range(world)), world), dtype=torch.cfloat))


def check_work_future(rank: int, world: int) -> None:
    # test_accumulate_gradients_no_sync_allreduce_hook & co ("get_future is only
    # supported on mpi, nccl and gloo"): Work.get_future().then(...)
    t = torch.ones(4) * (rank + 1)
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    s = sum(r + 1 for r in range(world))
    torch.testing.assert_close(fut.wait(), torch.full((4,), 2.0 * s))


def check_ddp_allreduce_hook(rank: int, world: int) -> None:
    # DDP with a comm hook built on get_future (the gloo-gated DDP hook tests)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)

    def hook(state, bucket):
        return dist.all_reduce(bucket.buffer() / world, async_op=True).get_future().then(lambda f: f.value()[0])

    ddp.register_comm_hook(None, hook)
    x = torch.full((3, 4), float(rank))
    ddp(x).sum().backward()
    g = model.weight.grad.clone()
    ref = torch.zeros_like(g)
    for r in range(world):
        xr = torch.full((3, 4), float(r)).requires_grad_(False)
        w = model.weight.detach().clone().requires_grad_(True)
        (xr @ w.t() + model.bias.detach()).sum().backward()
        ref += w.grad / world
    torch.testing.assert_close(g, ref)


def check_ddp_logging_backend_name(rank: int, world: int) -> None:
    # test_ddp_logging_data_cpu compares backend_name with dist.get_backend()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    data = model._get_ddp_logging_data()
    assert data.get("backend_name") == dist.get_backend(), (data.get("backend_name"), dist.get_backend())


def check_monitored_barrier(rank: int, world: int) -> None:
    # test_monitored_barrier_gloo* (gloo-gated): all ranks arrive -> returns.
    # Public API: torch itself refuses every backend whose name is not "gloo".
    dist.monitored_barrier(timeout=timedelta(seconds=30))


def check_monitored_barrier_pg(rank: int, world: int) -> None:
    # The same through ProcessGroup.monitored_barrier, below torch's name check:
    # shows whether the backend's monitoredBarrier forward works.
    dist.group.WORLD.monitored_barrier(timedelta(seconds=30), wait_all_ranks=False)


def check_monitored_barrier_missing_rank(rank: int, world: int) -> None:
    # test_monitored_barrier_gloo / _failure_order: a rank that never arrives is
    # named in rank 0's error ("Rank 1 failed to pass monitoredBarrier").
    # Called through ProcessGroup.monitored_barrier (see check_monitored_barrier_pg).
    if rank == 0:
        try:
            dist.group.WORLD.monitored_barrier(timedelta(seconds=2), wait_all_ranks=False)
        except RuntimeError as e:
            if "Rank 1 failed to pass monitoredBarrier" not in str(e):
                raise AssertionError(f"error does not name rank 1: {str(e)[:300]}") from e
            return
        raise AssertionError("monitored_barrier returned although rank 1 never arrived")
    time.sleep(6)


def check_scatter_object_list(rank: int, world: int) -> None:
    # test_scatter_object_list (require_backend_is_available({"gloo"}))
    objs = [{"to": r, "payload": list(range(r + 1))} for r in range(world)] if rank == 0 else None
    out = [None]
    dist.scatter_object_list(out, objs, src=0)
    assert out[0] == {"to": rank, "payload": list(range(rank + 1))}, out[0]


def check_all_to_all(rank: int, world: int) -> None:
    # test_all_to_all_single_{equal,unequal}_split*, test_all_to_all*: gated on
    # MPI for CPU tensors, so they skip on gloo too although gloo implements both.
    # Unequal splits: rank r sends (p + 1) rows to rank p, each row filled with r.
    cols = 3
    send = torch.cat([torch.full((p + 1, cols), float(rank)) for p in range(world)])
    recv = torch.empty(world * (rank + 1), cols)
    dist.all_to_all_single(recv, send, [rank + 1] * world, [p + 1 for p in range(world)])
    expect = torch.cat([torch.full((rank + 1, cols), float(src)) for src in range(world)])
    torch.testing.assert_close(recv, expect)
    # Equal splits, no split lists.
    send = torch.arange(world * 2, dtype=torch.float) + 100 * rank
    recv = torch.empty(world * 2)
    dist.all_to_all_single(recv, send)
    expect = torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float) + 100 * src for src in range(world)])
    torch.testing.assert_close(recv, expect)
    # List form (gloo needs equal sizes): rank r sends 10 r + p to rank p.
    ins = [torch.full((2,), float(10 * rank + p)) for p in range(world)]
    outs = [torch.empty(2) for _ in range(world)]
    dist.all_to_all(outs, ins)
    for src, o in enumerate(outs):
        torch.testing.assert_close(o, torch.full((2,), float(10 * src + rank)))


def check_profiler_events(rank: int, world: int) -> None:
    # call_dist_op / test_*_profiler: for backends in PROFILING_SUPPORTED_BACKENDS
    # (gloo, nccl, mpi, ucc) the suite asserts one async profiler event named
    # "<dist.get_backend()>:all_reduce" per call; for other names it checks nothing.
    t = torch.ones(8)
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        dist.all_reduce(t)
    want = f"{dist.get_backend()}:all_reduce"
    names = sorted({e.name for e in prof.function_events if "all_reduce" in e.name})
    hits = [e for e in prof.function_events if e.name.endswith(want) or e.name.startswith(want)]
    if len(hits) != 1:
        raise AssertionError(f"expected 1 profiler event named {want!r}, found {len(hits)}; all_reduce events: {names}")


def check_barrier_timeout(rank: int, world: int) -> None:
    # test_barrier_timeout_full_group ("Only gloo backend supports timeouts"):
    # only rank 0 enters a barrier of a group with a 1 s timeout; it must raise
    # an error naming a timeout, about 1 s later (the suite allows 0.1 s early).
    g = dist.new_group(timeout=timedelta(seconds=1))
    if rank == 0:
        t0 = time.time()
        try:
            dist.barrier(g)
        except Exception as e:  # noqa: BLE001
            took = time.time() - t0
            import re

            if not re.search(" (Timed out|closed|timeout) ", str(e)):
                raise AssertionError(f"error does not match ' (Timed out|closed|timeout) ': {str(e)[:300]}") from e
            if took < 0.9:
                raise AssertionError(f"raised after {took:.2f}s, before the 1 s timeout") from e
            if took > 15:
                raise AssertionError(f"raised only after {took:.1f}s for a 1 s timeout") from e
            return
        raise AssertionError("barrier returned although rank 1 never joined")
    # Stay alive past the timeout, as the suite's ranks do: a rank that exits
    # closes its connections and turns the timeout into "connection reset".
    time.sleep(8)


CHECKS = {
    "sparse_all_reduce": (check_sparse_all_reduce, "test_sparse_all_reduce_sum"),
    "batch_isend_irecv": (check_batch_isend_irecv, "test_batch_isend_irecv_gloo, test_batch_isend_irecv_gloo_tags"),
    "all_reduce_coalesced": (check_all_reduce_coalesced, "test_all_reduce_coalesced_{sum,product,min,max,...}"),
    "work_get_future": (check_work_future, "test_accumulate_gradients_no_sync_allreduce_*hook"),
    "ddp_allreduce_hook": (check_ddp_allreduce_hook, "gloo-gated DDP comm hook tests"),
    "ddp_logging_backend_name": (check_ddp_logging_backend_name, "test_ddp_logging_data_cpu"),
    "monitored_barrier": (check_monitored_barrier, "test_monitored_barrier_gloo*"),
    "monitored_barrier_pg": (check_monitored_barrier_pg, "test_monitored_barrier_gloo (ProcessGroup method)"),
    "monitored_barrier_missing_rank": (check_monitored_barrier_missing_rank,
                                       "test_monitored_barrier_gloo, _failure_order, _wait_all_ranks"),
    "scatter_object_list": (check_scatter_object_list, "test_scatter_object_list"),
    "all_to_all": (check_all_to_all, "test_all_to_all*, test_all_to_all_single_* (MPI-gated on CPU: skip on gloo too)"),
    "profiler_events": (check_profiler_events, "profiling assertions of call_dist_op, test_*_profiler"),
    "barrier_timeout": (check_barrier_timeout, "test_barrier_timeout_full_group / _global"),
}


def _worker(rank: int, world: int, backend: str, name: str, init_file: str, q) -> None:
    if backend == "guard":
        import torch_ext  # noqa: F401
    try:
        _init(backend, rank, world, init_file)
        fn, _ = CHECKS[name]
        fn(rank, world)
        q.put((rank, "passed", ""))
    except Exception as e:  # noqa: BLE001
        q.put((rank, "failed", f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"))
        traceback.print_exc()
    finally:
        # Flush the queue's feeder thread, then leave without destroy_process_group
        # (after a timeout the peers are not in step and it could block).
        sys.stdout.flush()
        sys.stderr.flush()
        q.close()
        q.join_thread()
        os._exit(0)


def run_check(backend: str, name: str, world: int, limit: float = 90.0) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init_file = tempfile.mktemp(prefix="probe-init-")
    procs = [ctx.Process(target=_worker, args=(r, world, backend, name, init_file, q)) for r in range(world)]
    t0 = time.time()
    for p in procs:
        p.start()
    results = {}
    while len(results) < world and time.time() - t0 < limit:
        try:
            r, status, msg = q.get(timeout=1)
            results[r] = (status, msg)
        except Exception:  # noqa: BLE001
            if all(not p.is_alive() for p in procs) and q.empty():
                break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    failed = {r: m for r, (s, m) in results.items() if s != "passed"}
    if len(results) < world:
        missing = sorted(set(range(world)) - set(results))
        failed.update({r: "no result (crashed or hung)" for r in missing})
    return {
        "status": "passed" if not failed else "failed",
        "reason": "; ".join(f"rank {r}: {m}" for r, m in sorted(failed.items())),
        "seconds": round(time.time() - t0, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--json", default="")
    ap.add_argument("-k", action="append", default=[], help="only checks whose name contains this")
    args = ap.parse_args()
    out: dict[str, dict] = {}
    bad = 0
    for name, (_, stands_for) in CHECKS.items():
        if args.k and not any(k in name for k in args.k):
            continue
        row = {"stands_for": stands_for}
        for backend in ("gloo", "guard"):
            row[backend] = run_check(backend, name, args.world_size)
        out[name] = row
        if row["gloo"]["status"] == "passed" and row["guard"]["status"] != "passed":
            bad += 1
        print(f"{name:28s} gloo={row['gloo']['status']:7s} guard={row['guard']['status']:7s} "
              f"{row['guard'].get('reason', '')}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "world_size": args.world_size, "checks": out}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
