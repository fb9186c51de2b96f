"""A guard job whose ranks differ in a setting or a backend, as jobs launched per node do (issue 57).

Launched once per rank by test_join.py (torch_ext.testing.launch_script, both ways):
  RANK_ENV      JSON {rank: {VAR: value}}: this rank's own environment on top (a per-node env file)
  BACKEND_<r>   rank r's init_process_group backend ("guard" unless set)
  HOLD_<r>      rank r blocks before init_process_group until this file exists (a rank stuck before it)
Each rank writes OUT/rank<r>.json: its group's description and sums, or the error
it raised at init_process_group (type, message, seconds).
"""
import json
import os
import sys
import time

rank = int(os.environ["RANK"])
os.environ.update(json.loads(os.environ.get("RANK_ENV", "{}")).get(str(rank), {}))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import torch_ext  # noqa: E402

out_path = os.path.join(os.environ["OUT"], f"rank{rank}.json")
hold = os.environ.get(f"HOLD_{rank}")
if hold:
    end = time.monotonic() + 300
    while not os.path.exists(hold) and time.monotonic() < end:
        time.sleep(0.05)  # stuck before init_process_group, as a rank loading data might be
record = {"rank": rank}
t0 = time.monotonic()
try:
    dist.init_process_group(os.environ.get(f"BACKEND_{rank}", "guard"))
    record["describe"] = torch_ext.describe() if dist.get_backend() == "guard" else "plain"
    sums = []
    for i in range(20):
        t = torch.full((4,), float(rank + i))
        dist.all_reduce(t)
        sums.append(float(t[0]))
    flag = torch.tensor([rank], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    record["sums"] = sums + [int(flag)]
    dist.destroy_process_group()
except Exception as e:  # noqa: BLE001 - the test reads which error, and when
    record.update(error=type(e).__name__, message=str(e), after_s=time.monotonic() - t0)
    with open(out_path, "w") as f:
        json.dump(record, f)
    print(f"[rank {rank}] {type(e).__name__} after {time.monotonic() - t0:.1f} s:\n{e}", flush=True)
    sys.exit(3)
with open(out_path, "w") as f:
    json.dump(record, f)
