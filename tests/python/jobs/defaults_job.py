"""Hangs with no TORCH_EXT_* setting at all: what each rank sees, and when (test_verdicts_at_defaults).

Launched once per rank by launch_script (plain env://, or the store in the
launcher as under torchrun), on backend "guard" with its defaults. Settings:

  SCENARIO  crossed     3 ranks: rank 0 all_reduces on dp then mp, ranks 1,2 on mp
                        then dp (torchrec#4149): a certain deadlock
            p2p         2 ranks: both receive from the other first (two pipeline
                        stages): sends and receives that can never pair
            pipeline    4 ranks: two pipeline stages (pp pairs 0-2, 1-3) of two
                        data-parallel replicas (dp 0,1 and 2,3); 2 waits for 0
                        (recv), 0 for 1 (dp), 1 for 3 (recv), 3 for 2 (dp): a
                        certain deadlock across dp and pp
            gone        3 ranks: rank 2 SIGKILLs itself in the loop's 3rd step
            checkpoint  2 ranks, 3 epochs: rank 0 "checkpoints" CKPT_S seconds at
                        the end of each epoch while rank 1 waits in a barrier
            async       2 ranks: rank 0 issues dp's all_reduce with async_op=True
                        and computes ASYNC_S seconds before mp's, rank 1 issues mp
                        then dp: the waits look like a cycle for a while, but rank
                        0 is not blocked in its wait: not a deadlock
            raised      2 ranks: rank 1 raises ValueError in its 3rd step, uncaught,
                        while rank 0 is in the step's all_reduce
            unused      2 ranks, DDP: rank 1 leaves a parameter out of its loss
                        (find_unused_parameters=False): its next forward raises
                        DDP's "Expected to have finished reduction", uncaught
            stall       2 ranks on nccl_sim (TORCH_EXT_NCCL_SIM_STALL set by the
                        test): both in the same collective, rank 1's stream stalled
  OUT       folder for one JSON record per rank: how it ended, its warnings
"""
import json
import logging
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

import torch_ext

rank = world = 0
records: list[dict] = []
begun = time.monotonic()  # when the collective expected to hang was issued (reset by each scenario)


class Records(logging.Handler):
    """The guard's warnings and errors, with when they came (seconds after `begun`)."""

    def emit(self, record: logging.LogRecord) -> None:
        records.append({"level": record.levelname, "after": time.monotonic() - begun, "text": record.getMessage()})
        if scenario == "stall" and "its stream has not begun it" in record.getMessage():
            finish({"named": True})  # the report came: done (a stall on nccl_sim lasts until abort_after)


def finish(extra: dict) -> None:
    with open(os.path.join(os.environ["OUT"], f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "records": records, **extra}, f)
    sys.stdout.flush()
    sys.stderr.flush()
    if extra.get("named"):
        os._exit(0)


def mark() -> None:
    global begun
    begun = time.monotonic()


def dp_and_mp() -> tuple:
    """Groups "dp" and "mp" over every rank; the clock starts once all have them."""
    dp = dist.new_group(list(range(world)), backend="guard", group_desc="dp")
    mp = dist.new_group(list(range(world)), backend="guard", group_desc="mp")
    dist.barrier()
    mark()
    return dp, mp


def crossed() -> None:
    dp, mp = dp_and_mp()
    if rank == 0:
        dist.all_reduce(torch.ones(4), group=dp)
        dist.all_reduce(torch.ones(2), group=mp)
    else:
        dist.all_reduce(torch.ones(2), group=mp)
        dist.all_reduce(torch.ones(4), group=dp)


def p2p() -> None:
    dist.barrier()
    mark()
    buf = torch.zeros(3)
    dist.recv(buf, src=1 - rank)  # both stages receive first
    dist.send(torch.ones(3), dst=1 - rank)


def pipeline_groups(rank: int) -> tuple:
    """This rank's data-parallel group (dp: 0,1 and 2,3) and pipeline pair (pp: 0-2 and 1-3)."""
    dp = [dist.new_group(r, backend="guard", group_desc="dp") for r in ([0, 1], [2, 3])][rank // 2]
    pp = [dist.new_group(r, backend="guard", group_desc="pp") for r in ([0, 2], [1, 3])][rank % 2]
    return dp, pp


def pipeline_step(rank: int, dp, pp, t: torch.Tensor) -> None:
    """2 waits for 0 (recv), 0 for 1 (dp), 1 for 3 (recv), 3 for 2 (dp): a certain deadlock."""
    if rank == 0:
        dist.all_reduce(t, group=dp)
        dist.send(t, 2, group=pp)
    elif rank == 1:
        dist.recv(t, 3, group=pp)
        dist.all_reduce(t, group=dp)
    elif rank == 2:
        dist.recv(t, 0, group=pp)
        dist.all_reduce(t, group=dp)
    else:
        dist.all_reduce(t, group=dp)
        dist.send(t, 1, group=pp)


def pipeline() -> None:
    dp, pp = pipeline_groups(rank)
    dist.barrier()
    mark()
    pipeline_step(rank, dp, pp, torch.ones(3))


def gone() -> None:
    for step in range(6):
        if step == 3:
            mark()
            if rank == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(torch.ones(4))


def checkpoint() -> None:
    for epoch in range(3):
        for _ in range(4):
            dist.all_reduce(torch.ones(4))
        if rank == 0:
            time.sleep(float(os.environ.get("CKPT_S", "11")))  # stands for torch.save of a large model
        dist.barrier()


def async_ops() -> None:
    dp, mp = dp_and_mp()
    if rank == 0:
        work = dist.all_reduce(torch.ones(4), group=dp, async_op=True)
        time.sleep(float(os.environ.get("ASYNC_S", "12")))  # computing, with dp's all_reduce in flight
        dist.all_reduce(torch.ones(2), group=mp)
        work.wait()
    else:
        dist.all_reduce(torch.ones(2), group=mp)
        dist.all_reduce(torch.ones(4), group=dp)


def raised() -> None:
    for step in range(6):
        if step == 3:
            mark()
            if rank == 1:
                raise ValueError(f"batch {step} of shard 7 is empty")  # a data bug, on one rank
        dist.all_reduce(torch.ones(4))


class TwoHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
        return self.a(x) + (self.b(x) if use_b else 0)


def unused() -> None:
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(TwoHeads())
    for step in range(4):
        if step == 1:
            mark()
        model(torch.ones(2, 4), use_b=rank == 0).sum().backward()


def stall() -> None:
    for _ in range(8):
        dist.all_reduce(torch.ones(4))
    mark()
    dist.all_reduce(torch.ones(4))


SCENARIOS = {"crossed": crossed, "p2p": p2p, "pipeline": pipeline, "gone": gone, "raised": raised, "unused": unused,
             "checkpoint": checkpoint, "async": async_ops, "stall": stall}
scenario = os.environ.get("SCENARIO", "")  # imported by test_cross_group_waits for pipeline_step

if __name__ == "__main__":
    logging.getLogger("torch_ext").addHandler(Records())
    dist.init_process_group("guard")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        SCENARIOS[scenario]()
    except torch_ext.GuardError as e:
        finish({"error": type(e).__name__, "after": time.monotonic() - begun, "message": str(e)})
        sys.exit(4)
    finish({"ok": True, "after": time.monotonic() - begun})
    dist.destroy_process_group()
