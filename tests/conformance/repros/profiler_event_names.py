#!/usr/bin/env python
"""Profiler events of guarded collectives carry the inner backend's name.

distributed_test.py's ``call_dist_op`` (used by the all_reduce / broadcast /
reduce / all_gather ... tests) and the ``test_*_profiler`` p2p tests assert, for
backends in PROFILING_SUPPORTED_BACKENDS (gloo, nccl, mpi, ucc), exactly one
async profiler event named ``f"{dist.get_backend()}:{op}"`` per call. For guard
they check nothing (the list is by name), which is why those tests pass on guard.
If guard were listed, they would fail: under guard the only event is the inner
backend's ``gloo:all_reduce``; nothing is named ``guard:all_reduce``.

Whether guard should add its own event (``GuardWork`` is constructed without a
profiling title) is a design choice for the backend's owner; this script shows
the current behaviour.

    PYTHONPATH=$PWD python tests/conformance/repros/profiler_event_names.py

Exits 1 when no "guard:all_reduce" event exists.
"""
import sys
import tempfile

import torch
import torch.distributed as dist


def main() -> int:
    import torch_ext  # noqa: F401

    dist.init_process_group("guard", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    t = torch.ones(4)
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        dist.all_reduce(t)
    names = sorted({e.name for e in prof.function_events if "all_reduce" in e.name})
    want = f"{dist.get_backend()}:all_reduce"
    print(f"dist.get_backend()={dist.get_backend()!r}; all_reduce events: {names}; looking for {want!r}")
    dist.destroy_process_group()
    return 0 if want in names else 1


if __name__ == "__main__":
    sys.exit(main())
