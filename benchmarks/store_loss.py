"""Time to error and to exit when rank 0, hosting the store, fails (issue 9's table).

    python benchmarks/store_loss.py                      # every row, 3 ranks, async, 5 runs each
    python benchmarks/store_loss.py --rows stop --runs 10 --world 2 --check strict

Each run starts real interpreters the way SLURM/mpirun start ranks (plain env://,
rank 0's process hosts the TCPStore; tests/python/jobs/fault_job.py), lets rank 0
fail before its 4th all_reduce, and measures for every survivor the time from
the fault to its typed error and from its error to the end of its process.
Prints medians with quartiles. Goals: the store's loss named within about 2 s
(a refused or reset connection) or within TORCH_EXT_STORE_TIMEOUT (12 s by default) plus a
tick (a frozen host); every survivor's process ended within 10 s of its error.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from harness import launch_script  # noqa: E402

ROWS = ["raise", "kill", "stop", "gloo_abort"]


def quartiles(xs: list[float]) -> str:
    if len(xs) < 2:
        return f"{xs[0]:.2f}" if xs else "-"
    q = statistics.quantiles(xs, n=4)
    return f"{statistics.median(xs):.2f} [{q[0]:.2f}, {q[2]:.2f}]"


def run_row(fault: str, world: int, check: str, runs: int) -> dict:
    to_error, to_exit, types, first_lines, unended = [], [], set(), set(), 0
    for _ in range(runs):
        out = tempfile.mkdtemp(prefix="store_loss_")
        procs = launch_script(["tests/python/jobs/fault_job.py"], world, store="rank0", timeout=120,
                              wait_for=list(range(1, world)),
                              env={"FAULT": fault, "OUT": out, "TORCH_EXT_CHECK": check,
                                   "TORCH_EXT_WARN_AFTER": "4", "TORCH_EXT_ABORT_AFTER": "30"})
        with open(os.path.join(out, "fault0.json")) as f:
            t_fault = json.load(f)["t"]
        for p in procs[1:]:
            path = os.path.join(out, f"error{p.rank}.json")
            if p.returncode is None:
                unended += 1
            if not os.path.exists(path):
                continue
            with open(path) as f:
                err = json.load(f)
            to_error.append(err["t"] - t_fault)
            if p.ended_at is not None:
                to_exit.append(p.ended_at - err["t"])
            types.add(err["type"])
            first = err["message"].splitlines()[0]
            for words in ("is gone", "does not answer", "differs across ranks"):
                if words in first:
                    first_lines.add(words)
    return {"to_error": to_error, "to_exit": to_exit, "types": sorted(types), "first": sorted(first_lines),
            "unended": unended, "survivors": runs * (world - 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="+", default=ROWS, choices=ROWS)
    ap.add_argument("--world", type=int, default=3)
    ap.add_argument("--check", default="async", choices=["async", "strict"])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(f"rank 0 hosts the store (plain env://), {args.world} ranks, check={args.check}, {args.runs} runs per row")
    print("seconds, median [quartiles] over every survivor of every run")
    print(f"{'rank 0 ...':<12} {'fault -> typed error':<24} {'error -> process ended':<24} {'ended':<8} error")
    for row in args.rows:
        r = run_row(row, args.world, args.check, args.runs)
        ended = f"{r['survivors'] - r['unended']}/{r['survivors']}"
        print(f"{row:<12} {quartiles(r['to_error']):<24} {quartiles(r['to_exit']):<24} {ended:<8} "
              f"{', '.join(r['types'])} ({', '.join(r['first'])})", flush=True)


if __name__ == "__main__":
    main()
