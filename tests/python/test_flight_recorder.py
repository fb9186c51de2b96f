"""Flight Recorder (torch's own record of each collective) sees the user's collectives under the user's group.

gloo records every collective it runs in Flight Recorder. Under ``guard`` the
inner gloo runs the user's collectives, so its entries must carry the user's
group name and description (``("0", "default_pg")``, a ``new_group``'s
``group_desc``), once each, and the guard's check collectives (verify's rounds
on its helper group) must be filed under a name of their own, never as the
user's. Real processes on gloo, at the default check mode.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from harness import assert_all_ok, report, run_ranks

CHECKS = ":torch_ext_check"


def _entries() -> list[dict]:
    dump = getattr(torch._C._distributed_c10d, "_dump_fr_trace_json", None)
    if dump is None:
        return []
    return json.loads(dump(True, False)).get("entries", [])


NEEDS_FR = pytest.mark.skipif(not hasattr(torch._C._distributed_c10d, "_dump_fr_trace_json"),
                              reason="this torch has no Flight Recorder JSON dump")


def _recorded(job, world: int):
    """Each rank's value from `job`, with the text to show where an assertion fails."""
    results = run_ranks(job, world, env={"TORCH_FR_BUFFER_SIZE": "1000"}, timeout=90)
    return [(v, f"rank {rank}: {v}\n{report(results)}") for rank, v in enumerate(assert_all_ok(results))]


def _job(rank: int, world: int) -> dict:
    tp = dist.new_group([0, 1, 2], group_desc="tp")
    for _ in range(5):
        dist.all_reduce(torch.ones(4))
    dist.broadcast(torch.ones(3), src=0)
    dist.all_reduce(torch.ones(2), group=tp)
    return {"entries": [(tuple(e["process_group"]), e["profiling_name"], e["collective_seq_id"])
                        for e in _entries()], "tp": dist.distributed_c10d._get_process_group_name(tp)}


@NEEDS_FR
def test_each_user_collective_is_recorded_once_under_its_group_and_checks_under_their_own():
    for v, where in _recorded(_job, 3):
        tp = v["tp"]
        users = [(name, seq) for group, name, seq in v["entries"] if group in {("0", "default_pg"), (tp, "tp")}]
        assert users == [("gloo:all_reduce", 1), ("gloo:all_reduce", 2), ("gloo:all_reduce", 3),
                         ("gloo:all_reduce", 4), ("gloo:all_reduce", 5), ("gloo:broadcast", 6),
                         ("gloo:all_reduce", 1)], where
        others = {group for group, _, _ in v["entries"]} - {("0", "default_pg"), (tp, "tp")}
        # The checks' own entries (none of the user's), and gloo's own barriers of new_group.
        assert others <= {("0" + CHECKS, "default_pg" + CHECKS), (tp + CHECKS, "tp" + CHECKS)}, where
        assert ("0", "") not in {group for group, _, _ in v["entries"]}, where


def _pair_job(rank: int, world: int) -> dict:
    for i in range(3):
        dist.all_reduce(torch.ones(1))  # a loss: one word
        dist.all_reduce(torch.ones(16), op=dist.ReduceOp.MAX)  # a metric vector: the hash and 8 words, as 16
    dist.broadcast(torch.ones(3), src=0)
    return {"entries": [(tuple(e["process_group"]), e["profiling_name"], e["collective_seq_id"],
                         e["input_dtypes"], e["input_sizes"]) for e in _entries()]}


@NEEDS_FR
def test_two_ranks_exchanges_are_recorded_once_each_as_the_all_reduce_that_carries_them():
    # Between two ranks a small all_reduce is a pair exchange carried by gloo's own all_reduce of
    # int64 words (PairExchange.h): recorded once, under the user's group, with the words' shape.
    want = []
    for i in range(3):
        want += [("gloo:all_reduce", 2 * i + 1, ["Long"], [[1]]), ("gloo:all_reduce", 2 * i + 2, ["Long"], [[16]])]
    want.append(("gloo:broadcast", 7, ["Float"], [[3]]))
    for v, where in _recorded(_pair_job, 2):
        users = [entry[1:] for entry in v["entries"] if entry[0] == ("0", "default_pg")]
        assert users == want, where
