"""Plain torch.distributed script: rank 0 logs a global metric nobody else computes.

    torchrun --nproc-per-node 2 plain_job.py [--helper]

With --helper the collective goes through mylab/metrics.py (a package in the
working directory: user code, unless TORCH_EXT_LIBRARY_PACKAGES names it).
"""
import sys

import torch
import torch.distributed as dist

import torch_ext  # noqa: F401  (registers "guard")


def log_metric(value):
    t = torch.tensor([value])
    if "--helper" in sys.argv:
        from mylab.metrics import global_mean
        global_mean(t)  # LINE:helper_call
    else:
        dist.all_reduce(t)  # LINE:plain_reduce


def main():
    dist.init_process_group("guard")
    for step in range(3):
        dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 0:
        log_metric(1.0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
