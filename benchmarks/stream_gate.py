"""The stream gate on CUDA (csrc/guard/device/StreamGate.h): what holding a stream costs.

    python benchmarks/stream_gate.py --rounds 21      # a GPU machine; scripts/gpu.sh runs it

One process, one GPU, the gate alone (``_C._StreamGate``, no process group):
  - hold: host time of one ``hold()`` whose verdict is not in (one kernel launch on
    the current stream), against one small torch kernel launch (``x.add_(1)``) timed
    the same way, interleaved;
  - hold, verdict in: host time of a ``hold()`` that finds its verdict in (no launch);
  - release latency: from ``release()`` on the host to the held stream's next event
    being complete, as the host sees it by polling ``Event.query()`` (the poll is in
    the figure: a lower bound of what a kernel behind the gate waits);
  - poison: the same, for ``poison()`` filling a 4 MB float32 result.
Each figure: the median over ``--rounds`` rounds of a round's median, with quartiles.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

sys.path.insert(0, __import__("os").path.dirname(__file__))
import _cuda  # noqa: E402


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[1], q[0], q[2]


def host_us(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--holds", type=int, default=200, help="holds per round")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: benchmarks/stream_gate.py measures the stream gate on CUDA and needs a GPU "
                 f"and a CUDA build of torch (this is torch {torch.__version__}, no CUDA device)")
    from torch_ext import _C

    ok, why = _C._cuda_gate_available()
    if not ok:
        sys.exit(f"error: the stream gate cannot run on CUDA here: {why}")
    print(_cuda.banner())
    x = torch.ones(4, device="cuda")
    big = torch.ones(1 << 20, device="cuda")
    figures: dict[str, list[float]] = {k: [] for k in ("hold", "launch", "passed", "release", "poison")}
    seq = 0
    for _ in range(args.rounds):
        g = _C._StreamGate()
        torch.cuda.synchronize()
        # hold (a launch each) against a small torch kernel, interleaved in blocks.
        holds, launches = [], []
        for _ in range(5):

            def one_hold() -> None:
                nonlocal seq
                seq += 1
                g.hold(seq, [x])

            holds.append(host_us(one_hold, args.holds // 5))
            g.release(seq)
            torch.cuda.synchronize()
            launches.append(host_us(lambda: x.add_(1), args.holds // 5))
            torch.cuda.synchronize()
        figures["hold"].append(statistics.median(holds))
        figures["launch"].append(statistics.median(launches))
        figures["passed"].append(host_us(lambda: g.hold(1, [x]), args.holds))
        # release latency: one held stream at a time.
        lat = []
        for _ in range(20):
            seq += 1
            g.hold(seq, [x])
            ev = torch.cuda.Event()
            ev.record()
            if ev.query():  # the gate kernel must be running, not done
                raise SystemExit("error: the stream passed a gate before its release")
            t0 = time.perf_counter()
            g.release(seq)
            while not ev.query():
                pass
            lat.append((time.perf_counter() - t0) * 1e6)
        figures["release"].append(statistics.median(lat))
        # poison latency with a 4 MB fill.
        pg = _C._StreamGate()
        pg.hold(1, [big])
        ev = torch.cuda.Event()
        ev.record()
        t0 = time.perf_counter()
        pg.poison(1)
        while not ev.query():
            pass
        figures["poison"].append((time.perf_counter() - t0) * 1e6)
        big.fill_(1.0)
    names = {
        "hold": "hold(), verdict not in (one launch)",
        "launch": "x.add_(1) (one torch kernel launch)",
        "passed": "hold(), verdict in (no launch)",
        "release": "release() -> held stream's next event complete",
        "poison": "poison() -> 4 MB fill done, next event complete",
    }
    print(f"stream gate on CUDA, {args.rounds} rounds (median [q1, q3] of the rounds' medians, us):")
    for k, label in names.items():
        m, q1, q3 = quartiles(figures[k])
        print(f"  {label:<52} {m:8.2f} [{q1:.2f}, {q3:.2f}]")


if __name__ == "__main__":
    main()
