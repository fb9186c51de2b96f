"""A training loop whose rank 0 fails, launched once per rank as ``python fault_job.py``.

Used by test_store_loss.py through harness.launch_script, which starts the ranks
the way SLURM, mpirun or Kubernetes do (plain env://, rank 0's process hosts the
TCPStore) or the way torchrun does (the store in the launcher). Settings:

  FAULT    none | raise | kill | stop | gloo_abort: what rank 0 does before its
           4th all_reduce (raise an exception, SIGKILL itself, SIGSTOP itself, or
           receive a float64 all_reduce against its float32 one, which gloo
           answers by terminating the receiving process)
  CATCH    1: a rank that gets a GuardError returns normally (else it propagates)
  DESTROY  1: call destroy_process_group() before the end
  OUT      folder for per-rank records (fault/error/done JSON)
  OUTLIVE  1: ranks but 0, after their loop, wait until the group fails for the
           store rank 0's exit took along (a rank still saving a checkpoint
           when the host ends), and record it ("outlived" JSON)
"""
import json
import os
import signal
import time

import torch
import torch.distributed as dist

import torch_ext

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
fault = os.environ.get("FAULT", "none")
out = os.environ["OUT"]


def record(name: str, **fields) -> None:
    with open(os.path.join(out, f"{name}{rank}.json"), "w") as f:
        json.dump(dict(fields, t=time.time()), f)


dist.init_process_group("guard")
try:
    for step in range(20):
        dtype = torch.float32
        if step == 3 and fault != "none":
            if rank == 0:
                record("fault")
                if fault == "raise":
                    raise RuntimeError("rank 0 failed in its training step (injected)")
                if fault == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if fault == "stop":
                    os.kill(os.getpid(), signal.SIGSTOP)
            if fault == "gloo_abort" and rank == 1:
                dtype = torch.float64  # gloo's ring sends from rank 1 to rank 0: rank 0 receives too much
        dist.all_reduce(torch.ones(4, dtype=dtype))
    record("done")
    if os.environ.get("OUTLIVE") == "1" and rank != 0:
        deadline = time.monotonic() + 60
        while torch_ext.failure() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # polling the guard's state: it has no event to wait on from Python
        record("outlived", failure=(torch_ext.failure() or ("", ""))[0])
except torch_ext.GuardError as e:
    record("error", type=type(e).__name__, message=str(e))
    if os.environ.get("CATCH") != "1":
        raise
if os.environ.get("DESTROY") == "1":
    dist.destroy_process_group()
