"""The guard's own cost per collective in instructions, counted by callgrind (issue 70).

Timings of a 5 us call move by a fifth between runs on a shared machine; instruction counts do
not. For each group (torch's no-op ``fake`` backend, and ``guard`` over it at the defaults) this
runs one process under ``valgrind --tool=callgrind --separate-threads=yes`` twice, with a short
and a long loop of ``all_reduce(float32[1])`` after the same warm-up, and differences the main
thread's counts: imports, group creation and every other thread drop out. Needs valgrind
(``apt-get install valgrind``); about 3 minutes per group on 2 cores.

    python benchmarks/instructions.py
    python benchmarks/instructions.py --calls 1000 11000 --keep /tmp/cg   # keep the profiles

The kept profiles compare per function with ``callgrind_annotate``. PYTHONHASHSEED is fixed:
the interpreter's dict probes depend on string hashes, which moved a run's count by up to 370
instructions per call.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

_LOOP = """
import sys, torch, torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")
import torch_ext
which, warm, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
g = dist.new_group([0], backend="fake") if which == "fake" else dist.new_group(
    [0], backend="guard", pg_options=torch_ext.GuardOptions(inner="cpu:fake"))
t = torch.ones(1)
for _ in range(warm):
    dist.all_reduce(t, group=g)
for _ in range(n):
    dist.all_reduce(t, group=g)
dist.destroy_process_group()
"""


def _main_thread_total(path: str) -> int:
    with open(path) as f:
        for line in f:
            m = re.match(r"(?:summary|totals):\s+(\d+)", line)
            if m:
                return int(m.group(1))
    raise RuntimeError(f"{path}: no totals line (did valgrind finish?)")


def _count(which: str, warm: int, calls: int, out_dir: str, loop: str) -> int:
    prefix = os.path.join(out_dir, f"{which}.{calls}.out")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    proc = subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={prefix}",
                           sys.executable, loop, which, str(warm), str(calls)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"valgrind {which} {calls} calls failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return _main_thread_total(prefix + "-01")  # thread 1: the main thread


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, nargs=2, default=[2000, 22000], metavar=("SHORT", "LONG"),
                    help="the two loop lengths differenced (default 2000 22000)")
    ap.add_argument("--warm", type=int, default=2000, help="calls before either loop (default 2000)")
    ap.add_argument("--keep", metavar="DIR", help="write the callgrind profiles there (default: a temporary folder)")
    args = ap.parse_args()
    short, long_ = args.calls
    if long_ <= short:
        ap.error("--calls: the second loop must be longer than the first")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    out_dir = args.keep or tempfile.mkdtemp(prefix="torch_ext_cg_")
    os.makedirs(out_dir, exist_ok=True)
    loop = os.path.join(out_dir, "loop.py")
    with open(loop, "w") as f:
        f.write(_LOOP)
    import torch

    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}; main thread's instructions per "
          f"all_reduce(float32[1]), ({long_} - {short} calls) after {args.warm}")
    per_call = {}
    for which in ("fake", "guard"):
        a, b = (_count(which, args.warm, n, out_dir, loop) for n in (short, long_))
        per_call[which] = (b - a) / (long_ - short)
        print(f"  {'guard over fake' if which == 'guard' else 'fake':<16} {per_call[which]:10,.0f}", flush=True)
    added = per_call["guard"] - per_call["fake"]
    print(f"  guard adds       {added:10,.0f}  ({added / per_call['fake']:+.1%})")
    print(f"profiles: {out_dir}")


if __name__ == "__main__":
    main()
