"""Accelerate job: rank-0-only gather (the "log the metric on the main process" bug).

    torchrun --nproc-per-node 2 accelerate_job.py
"""
import torch
import torch.distributed as dist
from accelerate import Accelerator

import torch_ext  # noqa: F401  (registers "guard")


def evaluate(accelerator, model):
    loss = model(torch.ones(2, 4)).pow(2).mean()
    if accelerator.is_main_process:
        accelerator.gather(loss.detach())  # LINE:gather_rank0
    return loss


def main():
    # On CPU Accelerate insists on "gloo": the guard group is created first and reused.
    dist.init_process_group("guard")
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(4, 1))
    for step in range(3):
        accelerator.wait_for_everyone()
    evaluate(accelerator, model)
    dist.destroy_process_group()
    print(f"rank {accelerator.process_index} done", flush=True)


if __name__ == "__main__":
    main()
