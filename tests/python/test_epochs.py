"""Uneven data named at its first epoch (issue 39, torch_ext/epochs.py): the ranks'
batch counts of a DataLoader's epoch compared when its next epoch begins, warned
about once per loop when they differ and the next epoch begins at different
collectives; never for rank-local loops, nor for loops that realign (Join)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from harness import assert_all_ok, run_ranks
from torch_ext import epochs
from torch_ext._core import _C

WARNING = "uneven data: epoch"


def _loop(rank: int, world: int, per_epoch: list[int], epochs_per_rank: list[int], collectives: bool,
          catch_up: bool = False) -> dict:
    loader = DataLoader(list(range(per_epoch[rank])), batch_size=1)
    seen = 0
    for _ in range(epochs_per_rank[rank]):
        for batch in loader:
            if collectives:
                dist.all_reduce(torch.ones(1))
            seen += 1
        if catch_up:  # what Join does: the ranks that ran out shadow the others' collectives
            for _ in range(max(per_epoch) - per_epoch[rank]):
                dist.all_reduce(torch.zeros(1))
    dist.barrier()
    flushed = epochs._flush()
    dist.barrier()  # every rank's check has run before any rank reads the logs
    return {"seen": seen, "flushed": flushed}


def _logs(results) -> str:
    return "\n".join(r.log for r in results)


def test_uneven_counts_are_named_once_at_the_first_epoch():
    # Rank 0: 2 epochs of 3 batches, rank 1: 3 epochs of 2 (6 collectives each:
    # they pair, as uneven data's do, and no error ever comes).
    results = run_ranks(_loop, 2, [3, 2], [2, 3], True, timeout=90)
    values = assert_all_ok(results)
    assert all(v["flushed"] for v in values), values
    logs = _logs(results)
    assert logs.count(WARNING) == 1, logs
    assert "epoch 0 of the loop at test_epochs.py:" in logs and "in _loop" in logs, logs
    assert "gave the ranks different batch counts: rank 0: 3; rank 1: 2; epoch 1 began at different " \
           "collectives (rank 0 after #3; rank 1 after #2)" in logs, logs
    assert "(sampler SequentialSampler)" in logs, logs
    assert "TORCH_EXT_EPOCH_CHECK=0" in logs, logs


def test_even_counts_rank_local_loops_realigned_loops_and_the_setting_off_say_nothing():
    even = run_ranks(_loop, 2, [3, 3], [2, 2], True, timeout=90)
    joined = run_ranks(_loop, 2, [3, 2], [2, 2], True, True, timeout=90)
    # Uneven loaders that issue no collective (each rank evaluates its own shard): harmless.
    local = run_ranks(_loop, 2, [3, 2], [1, 1], False, timeout=90)
    off = run_ranks(_loop, 2, [3, 2], [2, 3], True, timeout=90, env={"TORCH_EXT_EPOCH_CHECK": "0"})
    for results in (even, joined, local, off):
        assert all(v["flushed"] for v in assert_all_ok(results))
        assert WARNING not in _logs(results), _logs(results)


def _store_keys_left(rank: int, world: int, epochs_run: int) -> dict:
    loader = DataLoader(list(range(2)), batch_size=1)
    for _ in range(epochs_run):
        for _batch in loader:
            dist.all_reduce(torch.ones(1))
    dist.barrier()
    flushed = epochs._flush()
    dist.barrier()  # every rank's worker is done
    w = epochs._watch
    left = []
    for loop in sorted(w.loops):
        for e in range(epochs_run):
            keys = [_C._epoch_record_key(loop, e, r) for r in range(world)] + [_C._epoch_claim_key(loop, e),
                                                                              _C._epoch_warned_key(loop)]
            left += [k for k in keys if w.store.check([k])]
    return {"flushed": flushed, "loops": len(w.loops), "left": sorted(set(left))}


def test_the_epoch_check_deletes_its_records():
    # 4 epochs: the records of epochs 0-2 went out (each when the next began) and were compared;
    # what stays is the last epoch's claim, one key per loop.
    results = run_ranks(_store_keys_left, 2, 4, timeout=90)
    values = assert_all_ok(results)
    for v in values:
        assert v["flushed"] and v["loops"] == 1, v
        assert len(v["left"]) == 1 and v["left"][0].endswith("/2/claim"), v
        assert v["left"][0].startswith("guard/epochs/"), v
