"""A send/recv ping-pong under each check mode, against plain gloo (issue 40's pairing).

    python benchmarks/p2p.py                       # 1 and 1024 float32, 7 rounds of 300
    python benchmarks/p2p.py --sizes 16 --iters 1000 --rounds 9

Two ranks; rank 0 sends and then receives, rank 1 receives and then sends back,
every result waited for at once: what a pipeline stage's activations and
gradients do each micro-batch, with nothing to overlap. Every rank creates a
plain ``gloo`` group and ``guard`` groups wrapping gloo in ``verify`` (the
default: each receive is released once its sender's pairing words came and
pair, modes/verify/P2PPairing), ``async`` (no pairing) and ``strict`` (each
sender's fingerprint through the store before the receive); a round times
``--iters`` round trips on each group in turn (shuffled order, after a
barrier), and the ratio to gloo is taken per round. Prints the median
[quartiles] over rounds of microseconds per round trip and of each mode's ratio.
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import _modes  # noqa: E402
import _ranks  # noqa: E402

MODES = _modes.MODES


def _round_trips(rank: int, t: torch.Tensor, group, n: int) -> None:
    for _ in range(n):
        if rank == 0:
            dist.send(t, 1, group=group)
            dist.recv(t, 1, group=group)
        else:
            dist.recv(t, 0, group=group)
            dist.send(t, 0, group=group)


def _body(rank: int, world: int, store, sizes: list[int], iters: int, rounds: int) -> dict:
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    times = _modes.time_modes(_modes.groups(), sizes, iters, rounds,
                              lambda t, group, n: _round_trips(rank, t, group, n))
    dist.destroy_process_group()
    return {"times": times}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 1024], help="float32 elements")
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    times = _ranks.run(_body, 2, args.sizes, args.iters, args.rounds)[0]["times"]
    print(f"world 2: {args.rounds} rounds of {args.iters} send/recv round trips per mode "
          "(median [quartiles] over rounds)")
    _modes.print_table(times, args.sizes, MODES)


if __name__ == "__main__":
    main()
