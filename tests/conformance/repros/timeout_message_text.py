#!/usr/bin/env python
"""A timed-out guard collective raises an error whose text never says "timed out".

Suite tests concerned (gated on BACKEND == "gloo" today, so they skip for guard):
test_barrier_timeout_full_group, test_barrier_timeout_group, test_barrier_timeout_global.
They run a barrier that only rank 0 enters, on a group with a 1 s timeout, and
expect ``assertRaisesRegex(Exception, " (Timed out|closed|timeout) ")`` no earlier
than 1 s (minus 0.1 s) after the call.

gloo raises ``DistBackendError: [...] Timed out waiting 1000ms for recv operation
to complete``. guard's watchdog fires first (abort_after defaults to the group's
timeout; the inner gloo gets timeout + 10 s), and raises
``torch_ext.CollectiveTimeoutError: collective #1 barrier() on group "1" has
waited 1.2 s ... aborting: the collective exceeded abort_after (1 s,
TORCH_EXT_ABORT_AFTER) ...``: the right type (a DistBackendError), on time, with
a far better report, but none of the words torch's tests (and users' retry
logic that greps gloo/NCCL messages) look for.

    PYTHONPATH=$PWD python tests/conformance/repros/timeout_message_text.py [guard|gloo]

Exits 1 when the error does not match the suite's pattern.
"""
import os
import re
import sys
import tempfile
import time
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp

PATTERN = " (Timed out|closed|timeout) "


def worker(rank: int, backend: str, init: str, q) -> None:
    if backend == "guard":
        import torch_ext  # noqa: F401
    dist.init_process_group(backend, init_method=f"file://{init}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    group = dist.new_group(timeout=timedelta(seconds=1))
    if rank == 0:
        t0 = time.time()
        try:
            dist.barrier(group)
            q.put(("no error", 0.0, ""))
        except Exception as e:  # noqa: BLE001
            q.put((type(e).__module__ + "." + type(e).__qualname__, time.time() - t0, str(e)))
    else:
        time.sleep(8)  # alive but absent, like the suite's rank 1
    q.close()
    q.join_thread()
    os._exit(0)


def main() -> int:
    backend = sys.argv[1] if len(sys.argv) > 1 else "guard"
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = tempfile.mktemp()
    ps = [ctx.Process(target=worker, args=(r, backend, init, q)) for r in range(2)]
    for p in ps:
        p.start()
    kind, took, text = q.get(timeout=120)
    for p in ps:
        p.join(timeout=30)
    matched = re.search(PATTERN, text) is not None
    print(f"backend={backend} raised {kind} after {took:.2f} s")
    print(f"matches {PATTERN!r}: {matched}")
    print("message:\n  " + "\n  ".join(text.strip().splitlines()[:6]))
    return 0 if matched and took >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
