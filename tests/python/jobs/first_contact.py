"""A user's script as a newcomer writes it: no logging set-up, one slow rank, one mismatched collective.

    python first_contact.py plain|configured MARK_DIR      (3 ranks: torchrun, or env:// per rank)

With ``configured`` it calls ``logging.basicConfig`` with a format of its own
first, as an application that configures logging does. Rank 2 validates alone
until the hang has been reported (TORCH_EXT_WARN_AFTER): a logging filter,
which changes nothing in the output, marks the report in a file. Then rank 1
calls broadcast where ranks 0 and 2 call all_reduce: every rank raises
CollectiveMismatchError and, uncaught, ends with its traceback.
"""
import logging
import os
import sys
import time

import torch
import torch.distributed as dist

import torch_ext  # noqa: F401  (registers "guard")

mode, marks = sys.argv[1], sys.argv[2]
if mode == "configured":
    logging.basicConfig(level=logging.WARNING, format="APP|%(name)s|%(levelname)s|%(message)s")
REPORTED = os.path.join(marks, "hang_reported")


def mark_report(record: logging.LogRecord) -> bool:
    if "has not arrived" in record.getMessage():
        open(REPORTED, "w").close()
    return True  # a filter that lets everything through: not a handler, not a format


logging.getLogger("torch_ext").addFilter(mark_report)


def validate() -> None:
    # Ends once the lowest waiting rank has logged the hang report.
    deadline = time.monotonic() + 60
    while not os.path.exists(REPORTED):
        if time.monotonic() > deadline:
            raise SystemExit("no hang report within 60 s")
        time.sleep(0.05)


dist.init_process_group("guard")
rank = dist.get_rank()
x = torch.ones(4)
dist.all_reduce(x)
if rank == 2:
    validate()
dist.all_reduce(x)  # collective #2: ranks 0-1 wait here for rank 2
if rank == 1:
    dist.broadcast(x, src=0)  # collective #3, the bug
else:
    dist.all_reduce(x)
dist.destroy_process_group()
