"""Jobs under torchrun (tests/python/test_torchrun_summary.py), at the default settings.

``mismatch``: rank 1 syncs a tensor of another size at step 3. ``fork``: each rank forks a child (as a
DataLoader does for its workers) and ends it with SIGTERM: the child dies of it, as it would without the
guard (its launcher-stop handler belongs to the process that installed it). ``lightning``: a Lightning
Trainer (GuardDDPStrategy, 3 CPU devices) whose rank 1 is killed at step 5. ``stopped CTL``: 2 ranks, rank 0
waits in #2 while rank 1 computes, until torchrun itself is stopped (SIGTERM, as a job's cancel sends it).
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import torch_ext  # noqa: F401  (registers the "guard" backend)


def _fork_and_terminate() -> None:
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    ended = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
    print(f"rank {dist.get_rank()}: forked child ended by {ended}", flush=True)


def _lightning_killed() -> None:
    import lightning as L

    from torch_ext.lightning import GuardDDPStrategy

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, i):
            if i == 5 and self.global_rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.randn(200, 4), batch_size=4)
    trainer = L.Trainer(accelerator="cpu", devices=3, strategy=GuardDDPStrategy(), max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(), data)


def _stopped(ctl: str) -> None:
    """Rank 1 stays in Python after #1; rank 0 waits in #2 for it until torchrun is stopped."""
    x = torch.ones(4)
    dist.all_reduce(x)
    rank = dist.get_rank()
    with open(os.path.join(ctl, f"ready{rank}.tmp"), "w") as f:
        f.write(f"{os.getpid()} {os.environ['MASTER_PORT']}")
    os.rename(os.path.join(ctl, f"ready{rank}.tmp"), os.path.join(ctl, f"ready{rank}"))
    if rank == 1:
        while True:
            time.sleep(0.05)  # a rank-local step that outlasts the job: the test stops torchrun meanwhile
    dist.all_reduce(x)


def main(mode: str) -> None:
    if mode == "lightning":
        _lightning_killed()
        return
    dist.init_process_group("guard")
    if mode == "fork":
        _fork_and_terminate()
        dist.destroy_process_group()
        return
    if mode == "stopped":
        _stopped(sys.argv[2])
        return
    rank = dist.get_rank()
    x = torch.ones(4)
    for step in range(200):
        y = torch.ones(5) if mode == "mismatch" and step == 3 and rank == 1 else x
        dist.all_reduce(y)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
