"""Reading a failure as values (``err.report``), for an experiment tracker or an alert.

    python examples/report_facts.py

A metric reduced on rank 0 only (the classic ``if rank == 0: dist.reduce(...)``)
makes the ranks' collectives differ. Each rank catches the guard's error and
writes one JSON line from ``err.report``: the error's kind, the collective, and
what each rank issued from which line, read as fields instead of parsed from
the text. That line is what you would send to a tracker or an alerting hook;
then the rank stops training, its error handled.
"""
import json
import sys

import torch
import torch.distributed as dist

import torch_ext
from _run import run_example


def log_metric(loss: torch.Tensor) -> None:
    dist.reduce(loss, dst=0)  # only rank 0 gets here


def train() -> None:
    rank = dist.get_rank()
    try:
        for step in range(100):
            loss = torch.ones(1) * step
            if rank == 0 and step == 3:
                log_metric(loss)
            dist.all_reduce(torch.ones(16))  # the gradient sync
    except torch_ext.GuardError as err:
        r = err.report
        facts = {"rank": rank, "error": r.error, "group": r.group, "collective": r.seq,
                 "issued": [{"rank": row.rank, "op": row.op, "at": row.site} for row in r.rows]}
        # One write: the ranks share the terminal, and print() may write the end of line apart.
        sys.stdout.write(json.dumps(facts) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    run_example(train, nprocs=3)
