"""Two ranks; rank 1 stays away from the first all_reduce until the hang report at warn_after has
been written (a dump appears), so its own dump holds its main thread's stack. test_warm.py runs it as
a script and as ``python -m``, fresh and warm: the stack must start at this program's top level."""
import os
import time

import torch
import torch.distributed as dist

import torch_ext  # noqa: F401 - registers the guard backend


def _away(dump: str) -> None:
    end = time.monotonic() + 60
    # os.access and time.sleep are C functions: no frame of theirs can stand above _away in the dump
    # (os.path.exists is Python's, and a dump taken inside it showed <frozen genericpath> innermost).
    while not os.access(dump, os.F_OK) and time.monotonic() < end:
        time.sleep(0.05)  # polling for this rank's dump of the report, not a guess at how long it takes


dist.init_process_group("guard")
if dist.get_rank() == 1:
    _away(os.path.join(os.environ["TORCH_EXT_DUMP_DIR"], "rank1.json"))
dist.all_reduce(torch.ones(2))
dist.destroy_process_group()
