"""Post-mortem of a hang with the tools people already use: Flight Recorder, Perfetto, a browser.

    python examples/post_mortem.py

Four CPU ranks train for a while (a gradient all_reduce every step, a broadcast
every 5 steps, a metrics all_gather every 10); at step 23 rank 3's data loader
stalls. The guard reports after 2 s, every rank writes its dump to
post_mortem/dumps, and after 4 s the collective fails on every live rank. Then
this script runs what you would run afterwards:

    python -m torch_ext.diagnose post_mortem/dumps --fr post_mortem/fr \\
        --trace post_mortem/trace.json --html post_mortem/report.html
    torchfrtrace post_mortem/fr -p torch_ext_fr_rank_

and prints both. Open post_mortem/trace.json in ui.perfetto.dev (or
chrome://tracing) and post_mortem/report.html in a browser.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bugs"))
from _launch import launch  # noqa: E402  (starts the ranks; a failing rank does not take the others down)

OUT = "post_mortem"
STALL_AT, STEPS = 23, 30


def load_batch(rank: int, step: int) -> torch.Tensor:
    if rank == 3 and step == STALL_AT:
        time.sleep(6)  # a stuck data loader (a slow disk, a dead worker...)
    return torch.ones(256)


def train(rank: int, world: int) -> None:
    for step in range(1, STEPS + 1):
        grads = load_batch(rank, step) * rank
        dist.all_reduce(grads)  # the gradient sync of every step
        if step % 5 == 0:
            dist.broadcast(torch.zeros(16), src=0)  # e.g. the learning rate schedule from rank 0
        if step % 10 == 0:
            metrics = [torch.zeros(4) for _ in range(world)]
            dist.all_gather(metrics, torch.full((4,), float(rank)))


def main() -> None:
    dumps = os.path.join(OUT, "dumps")
    launch(train, 4, TORCH_EXT_WARN_AFTER="2", TORCH_EXT_ABORT_AFTER="4", TORCH_EXT_DUMP_DIR=dumps)
    fr, trace, html = os.path.join(OUT, "fr"), os.path.join(OUT, "trace.json"), os.path.join(OUT, "report.html")
    cmd = [sys.executable, "-m", "torch_ext.diagnose", dumps, "--fr", fr, "--trace", trace, "--html", html]
    print("\n$ python -m torch_ext.diagnose", " ".join(cmd[3:]), flush=True)
    subprocess.run(cmd, check=True)
    # torchfrtrace is the console script of this module, from the installed torch.
    cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", fr, "-p", "torch_ext_fr_rank_"]
    print(f"\n$ torchfrtrace {fr} -p torch_ext_fr_rank_", flush=True)
    subprocess.run(cmd, check=True, stderr=subprocess.STDOUT)


if __name__ == "__main__":
    main()
