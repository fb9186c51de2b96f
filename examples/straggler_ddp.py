"""A straggler named while the job runs: one rank is 20% slower, nothing hangs.

    python examples/straggler_ddp.py [step|backward|validation|balanced] [--steps N]

Four CPU ranks train a small DDP model. Each step "computes" for 40 ms (a
sleep, so the four processes do not fight over this machine's cores), and
rank 2 is slower:

- step:       rank 2 takes 8 ms (20%) longer per step, before its forward;
- backward:   rank 2's backward takes 8 ms longer. DDP overlaps its gradient
              all_reduce with backward, so timing sections around forward and
              backward cannot see this; the other ranks' waits do;
- validation: every 10 steps, 3 validation batches with a metric all_reduce;
              rank 2 takes 30 ms longer on each, training is balanced;
- balanced:   nobody is slow (no straggler may be named).

No instrumentation: the guard times every collective on every rank, and the
group's rank 0 logs a warning naming the straggler, with the time the others
lost per step and the line where they waited. Rank 0 prints what
torch_ext.stragglers() returns at the end, as one JSON line (STRAGGLERS ...);
the other ranks print whom it names there (read from the store).
"""
import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_ext
from _run import run_example

MODE = next((a for a in sys.argv[1:] if a in ("step", "backward", "validation", "balanced")), "step")
STEPS = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 60
SLOW_RANK = 2
COMPUTE_S = 0.040
EXTRA_S = 0.2 * COMPUTE_S  # 20% more per step


class SlowBackward(torch.autograd.Function):
    """Identity forward; its backward takes `delay` longer (a slower backward kernel)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, delay: float) -> torch.Tensor:
        ctx.delay = delay
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        time.sleep(ctx.delay)
        return grad, None


class Net(nn.Module):
    def __init__(self, backward_delay: float) -> None:
        super().__init__()
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 1)
        self.backward_delay = backward_delay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if self.backward_delay:
            h = SlowBackward.apply(h, self.backward_delay)
        return self.b(h)


def validate(model: nn.Module, rank: int) -> None:
    with torch.no_grad():
        for _ in range(3):
            time.sleep(0.010 + (0.030 if rank == SLOW_RANK else 0.0))
            metric = model(torch.randn(8, 32)).mean().reshape(1)
            dist.all_reduce(metric)  # the validation metric


def _say(line: str) -> None:
    # One write: the ranks share stdout, and print() may write the end of the line apart.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def train() -> None:
    rank = dist.get_rank()
    torch.set_num_threads(1)  # four ranks share this machine's cores
    torch.manual_seed(0)
    slow = rank == SLOW_RANK
    model = DDP(Net(EXTRA_S if slow and MODE == "backward" else 0.0))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    first_named = None
    start = time.monotonic()
    for step in range(1, STEPS + 1):
        time.sleep(COMPUTE_S + (EXTRA_S if slow and MODE == "step" else 0.0))  # data and forward compute
        loss = model(torch.randn(16, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()  # DDP's gradient all_reduce
        opt.step()
        if MODE == "validation" and step % 10 == 0:
            validate(model, rank)
        if rank == 0 and first_named is None and torch_ext.stragglers().straggler is not None:
            first_named = step
    if rank != 0:  # what rank 0 last wrote to the store when whom it names changed
        named = torch_ext.stragglers().straggler
        _say(f"[rank{rank}] torch_ext.stragglers() here names {f'rank {named.rank}' if named else 'nobody'}")
    if rank == 0:
        report = torch_ext.stragglers()
        out = {"mode": MODE, "steps": STEPS, "first_named_at_step": first_named,
               "step_s": (time.monotonic() - start) / STEPS,
               "injected_s_per_step": EXTRA_S if MODE in ("step", "backward") else None,
               "stragglers": [s.__dict__ for s in report.stragglers],
               "collectives_per_step": report.collectives_per_step, "analysed_up_to": report.analysed_up_to,
               "wait_shares": report.wait_shares()}
        _say("STRAGGLERS " + json.dumps(out))


if __name__ == "__main__":
    run_example(train, nprocs=4)
