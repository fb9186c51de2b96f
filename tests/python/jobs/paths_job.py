"""A training loop on one of the paths training takes, with a fault on rank 1 at step 3.

Used by test_paths.py two ways: ``run_rank`` through torch_ext.testing.run_ranks
(ranks forked with torch preloaded: the matrix), and as a script launched once
per rank by launch_script (plain env:// with rank 0's process hosting the
TCPStore, or the store in the launcher as under torchrun), with these settings:

  TRAIN_PATH  direct | hooks | ddp | fsdp2 | lightning | accelerate: how the step's
              collectives are issued (dist.all_reduce; from post-accumulate-grad
              hooks inside loss.backward(), as ZeRO-3 does; DDP's reducer inside
              loss.backward(); FSDP2's all_gather/reduce_scatter; Lightning's
              ddp_guard strategy; Accelerate's prepare/backward)
  FAULT       none | mismatch | absent | dead | stall: what rank 1 does at step 3
              (an extra barrier, the others being in the step's collectives;
              stays away until the guard has given its verdict; SIGKILLs itself;
              nccl_sim only: its stream stops before the step's first collective,
              set by TORCH_EXT_NCCL_SIM_STALL, while its host goes on)
  FAULT_RANK  the rank with the fault (default 1)
  CATCH_EXIT  N: a rank that catches the torch_ext error exits with status N
              (the user's own exit status, which the guard must keep)
  OUT         folder for one JSON record per rank: how its training ended
"""
import json
import os
import signal
import sys
import time
import traceback

import torch
import torch.distributed as dist

import torch_ext

STEPS = 6
FAULT_STEP = 3
rank = world = 0
fault = "none"


def fault_point(step: int) -> None:
    """The fault of rank FAULT_RANK (default 1) at FAULT_STEP; the others go on into the step's collectives."""
    if step != FAULT_STEP or rank != int(os.environ.get("FAULT_RANK", "1")) or fault == "none":
        return
    if fault == "mismatch":
        dist.barrier()  # the others are in the step's collectives
    elif fault == "dead":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault == "absent":
        # Away (a rank-1-only evaluation, a slow checkpoint) until the guard has
        # ended the collective the others wait in; then this rank comes back
        # into a group that failed. Bounded: the test's deadline is further.
        deadline = time.monotonic() + 60
        while torch_ext.failure() is None and time.monotonic() < deadline:
            time.sleep(0.05)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * world + rank)
    return torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)


def steps(net: torch.nn.Module, opt: torch.optim.Optimizer, backward=None, after_backward=None) -> None:
    """The training loop the paths share: the fault, forward, backward, optimizer step."""
    for step in range(STEPS):
        fault_point(step)
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(net(x), y)
        (backward or torch.Tensor.backward)(loss)  # DDP: the gradient all_reduces run in its reducer, inside autograd
        if after_backward is not None:
            after_backward()
        opt.step()
        opt.zero_grad()


def train_direct() -> None:
    net = model()

    def all_reduce_grads() -> None:
        for p in net.parameters():
            dist.all_reduce(p.grad)  # the hand-written data parallelism

    steps(net, torch.optim.SGD(net.parameters(), lr=0.05), after_backward=all_reduce_grads)


def train_hooks() -> None:
    net = model()
    for p in net.parameters():
        # ZeRO-3 / ms-swift style: each gradient reduced from its own post-accumulate-grad hook, which
        # autograd runs inside loss.backward() as that gradient is ready.
        p.register_post_accumulate_grad_hook(lambda param: dist.all_reduce(param.grad))
    steps(net, torch.optim.SGD(net.parameters(), lr=0.05))


def train_ddp() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    net = DDP(model())
    steps(net, torch.optim.SGD(net.parameters(), lr=0.05))


def train_fsdp2() -> None:
    from torch.distributed.fsdp import fully_shard

    net = model()
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    steps(net, torch.optim.SGD(net.parameters(), lr=0.05))


def train_lightning() -> None:
    import lightning.pytorch as pl

    import torch_ext.lightning  # noqa: F401  (registers "ddp_guard")

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model()

        def training_step(self, data, step):
            fault_point(step)
            x, y = batch(step)
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    loader = torch.utils.data.DataLoader(list(range(STEPS * world)), batch_size=1)
    trainer = pl.Trainer(accelerator="cpu", devices=world, num_nodes=1, strategy="ddp_guard", max_epochs=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, use_distributed_sampler=True)
    trainer.fit(Model(), train_dataloaders=loader)


def train_accelerate() -> None:
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)  # takes the guard group initialised below
    net = model()
    net, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05))
    steps(net, opt, backward=acc.backward)


TRAIN = {"direct": train_direct, "hooks": train_hooks, "ddp": train_ddp, "fsdp2": train_fsdp2,
         "lightning": train_lightning, "accelerate": train_accelerate}


def train(path: str, fault_: str) -> None:
    """Trains on ``path`` with ``fault_`` on rank 1, then meets the others at a barrier.

    The default process group exists already (run_ranks, or the main below),
    except for Lightning, whose strategy creates it.
    """
    global rank, world, fault
    rank, world, fault = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), fault_
    TRAIN[path]()
    dist.barrier()


def outcome(e: BaseException | None) -> dict:
    """How a rank's training ended, as the test reads it."""
    if e is None:
        return {"ended": "done"}
    return {"ended": "raised", "type": f"{type(e).__module__}.{type(e).__name__}",
            "guard": isinstance(e, torch_ext.GuardError), "message": str(e),
            "failure": torch_ext.failure() is not None if dist.is_initialized() else None,
            "traceback": traceback.format_exc()}


def run_rank(rank_: int, world_: int, path: str, fault_: str) -> dict:
    """For torch_ext.testing.run_ranks (backend=None): one rank's training and how it ended."""
    if path != "lightning":
        dist.init_process_group("guard")
    try:
        train(path, fault_)
    except BaseException as e:  # noqa: B036 - every way out is an outcome
        return outcome(e)
    return outcome(None)


if __name__ == "__main__":
    if os.environ["TRAIN_PATH"] != "lightning":
        dist.init_process_group("guard")
    try:
        train(os.environ["TRAIN_PATH"], os.environ.get("FAULT", "none"))
        ended = outcome(None)
    except BaseException as e:  # noqa: B036
        ended = outcome(e)
        with open(os.path.join(os.environ["OUT"], f"rank{rank}.json"), "w") as f:
            json.dump(ended, f)
        if isinstance(e, torch_ext.GuardError) and os.environ.get("CATCH_EXIT"):
            sys.exit(int(os.environ["CATCH_EXIT"]))  # the user's own exit status
        raise
    with open(os.path.join(os.environ["OUT"], f"rank{rank}.json"), "w") as f:
        json.dump(ended, f)
