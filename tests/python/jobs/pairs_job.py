"""Four ranks in two pairs, each pair creating "its" group (issue 67).

Launched once per rank by test_join.py (torch_ext.testing.launch_script, both ways):
  MODE     "right":     every rank calls new_group([0, 1]) and new_group([2, 3]), as torch asks, and
                        works in its own pair;
           "own":       each rank calls new_group with its own pair's list only, at once (each node
                        creating a group of its own ranks: torch gives both the same name, and the
                        two pairs meet in one group's store keys);
           "staggered": as "own", but ranks 2 and 3 create theirs after ranks 0 and 1 have created
                        theirs and are training in it (a barrier of the default group in between).
  BACKEND  the default group's backend ("guard" unless set; "gloo" records plain gloo's behaviour).
Each rank writes OUT/rank<r>.json: its pair's sums, or the error it raised (type, message, and
seconds since its pair's group could first have known: its own creation, or for ranks 0 and 1
when staggered, the barrier after which ranks 2 and 3 create theirs).
"""
import json
import os
import sys
import time

rank = int(os.environ["RANK"])

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import torch_ext  # noqa: E402,F401  (registers "guard")

mode = os.environ.get("MODE", "own")
out_path = os.path.join(os.environ["OUT"], f"rank{rank}.json")
mine = [0, 1] if rank < 2 else [2, 3]
record = {"rank": rank, "members": mine}
dist.init_process_group(os.environ.get("BACKEND", "guard"))
t0 = time.monotonic()
try:
    if mode == "right":
        groups = {0: dist.new_group([0, 1]), 2: dist.new_group([2, 3])}
        group = groups[mine[0]]
    elif mode == "staggered" and rank >= 2:
        dist.barrier()  # ranks 0 and 1 have created theirs and run in it
        t0 = time.monotonic()
        group = dist.new_group(mine)
    else:
        group = dist.new_group(mine)
    sums = []
    if mode == "staggered" and rank < 2:
        t = torch.full((4,), float(rank))
        dist.all_reduce(t, group=group)
        sums.append(float(t[0]))
        dist.barrier()  # now ranks 2 and 3 create theirs
        t0 = time.monotonic()
        # Training goes on in the pair's group; a run that is not ended ends here.
        while time.monotonic() - t0 < 60:
            t = torch.full((4,), float(rank))
            dist.all_reduce(t, group=group)
            sums.append(float(t[0]))
    else:
        for i in range(5):
            t = torch.full((4,), float(rank + i))
            dist.all_reduce(t, group=group)
            sums.append(float(t[0]))
    record["sums"] = sums
    dist.destroy_process_group()
except Exception as e:  # noqa: BLE001 - the test reads which error, and when
    record.update(error=type(e).__name__, message=str(e), after_s=time.monotonic() - t0)
    with open(out_path, "w") as f:
        json.dump(record, f)
    print(f"[rank {rank}] {type(e).__name__} after {time.monotonic() - t0:.1f} s:\n{e}", flush=True)
    sys.exit(3)
with open(out_path, "w") as f:
    json.dump(record, f)
