"""check="verify" paces its rounds by the program's bursts (csrc/guard/modes/verify/Verifier.h).

By default a check round starts whenever a collective is issued and none is in
flight: DDP's bucket all_reduces then cost about one round each. When the
collectives come in bursts of one length separated by quiet gaps (DDP's buckets
of a step), the verifier predicts a burst's last collective and starts the round
there: one round per step. These tests check that the prediction happens, that
results stay those of plain gloo, and that a burst which ends before its
predicted end (nobody calling ``wait()``: only futures) still gets its verdict,
from the pacer thread, for matching and for mismatched collectives.

The pauses between steps stand for a data loader: they shape the bursts, nothing
waits on them.
"""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from harness import assert_all_ok, report, run_ranks

# The bursts are learned from the gaps between collectives: under the other tests' load a
# gap inside a burst can look like its end (a burst of 2 learned instead of 4, seen in a
# clean-clone CI run), so these run alone (scripts/test.sh's serial pass).
pytestmark = pytest.mark.serial

LAYERS = 8
STEPS = 16
PAUSE = 0.05  # s between steps ("loading data"): the quiet gap between bursts


@pytest.fixture(autouse=True)
def _default_mode(monkeypatch):
    monkeypatch.delenv("TORCH_EXT_CHECK", raising=False)  # verify, the default, is under test


def _ddp(rank: int, world: int) -> dict:
    import torch_ext

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(LAYERS)])
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=256 * 256 * 4 / 2**20)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    torch.manual_seed(1 + rank)
    x = torch.randn(16, 256)
    guarded = dist.get_backend() == "guard"
    per_step = []
    for _ in range(STEPS):
        time.sleep(PAUSE)
        before = torch_ext.group_state()["verifier"]["rounds"] if guarded else 0
        ddp(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if guarded:
            v = torch_ext.group_state()["verifier"]
            per_step.append((v["rounds"] - before, v["burst"]))
    return {"params": [p.detach().clone() for p in model.parameters()], "per_step": per_step,
            "buckets": int(ddp._get_ddp_logging_data().get("num_buckets_reduced", 0)),
            "failure": torch_ext.failure() if guarded else None}


def test_ddp_steps_get_one_check_round_each_once_the_bursts_are_learned():
    guarded = run_ranks(_ddp, 3, timeout=120)
    got = assert_all_ok(guarded)
    plain = assert_all_ok(run_ranks(_ddp, 3, backend="gloo", timeout=120))
    for rank in range(3):
        where = f"rank {rank}: {got[rank]['per_step']}\n{report(guarded)}"
        assert got[rank]["failure"] is None, where
        assert got[rank]["buckets"] == LAYERS, where
        # The same training as on plain gloo, bit for bit.
        for a, b in zip(got[rank]["params"], plain[rank]["params"]):
            assert torch.equal(a, b), where
        # Learned: some run of 4 steps predicted the burst of LAYERS bucket all_reduces and ran about
        # one round each (one more allowed in the run for a second gather); unpaced, a step takes
        # about one round per bucket.
        steps = got[rank]["per_step"]
        windows = [steps[i:i + 4] for i in range(len(steps) - 3)]
        assert any(all(burst == LAYERS for _, burst in w) and sum(r for r, _ in w) <= 5 for w in windows), where


# Past what an all_reduce carries its own check for (64 KiB, InBandCheck.h): these
# collectives are verified by the verifier's paced rounds, the subject here.
PACED = 16 * 1024 + 1


def _bursts(rank: int, world: int, mismatch: bool) -> dict:
    import torch_ext

    g = dist.group.WORLD
    sums = []

    def burst(n: int, ops=None) -> list:
        futs, tensors = [], []
        for i in range(n):
            t = torch.full((PACED,), float(rank + 1))
            tensors.append(t)
            op = ops[i] if ops else dist.ReduceOp.SUM
            futs.append(dist.all_reduce(t, op=op, group=g, async_op=True).get_future())
        for f in futs:
            f.wait()  # futures only: no wait() on the work tells the guard a result is wanted
        return [float(t[0]) for t in tensors]

    # Bursts of 4, learned after three. A stall inside one (a loaded machine: a gap longer than
    # quiet_us) teaches a shorter burst, which the next bursts unteach: the ranks go on until each
    # has learned 4, agreeing on a plain gloo group the verifier does not see (at most 16 bursts).
    side = dist.new_group(backend="gloo")
    for i in range(16):
        time.sleep(PAUSE)
        sums.append(burst(4))
        learned = torch_ext.group_state()["verifier"]
        done = torch.tensor([int(i >= 5 and learned["burst"] == 4)])
        dist.all_reduce(done, op=dist.ReduceOp.MIN, group=side)
        if done.item():
            break
    time.sleep(PAUSE)
    sums.append(burst(3))  # ends before the predicted end: the pacer checks it
    after = torch_ext.group_state()["verifier"]
    error = None
    if mismatch:
        for _ in range(4):  # learned again
            time.sleep(PAUSE)
            sums.append(burst(4))
        time.sleep(PAUSE)
        try:
            # Rank 1's second all_reduce takes the maximum: a mismatch in the middle of a
            # predicted burst. (Not a longer one: gloo aborts the process that receives more
            # bytes than it expects, at these sizes.)
            sums.append(burst(2, [dist.ReduceOp.SUM, dist.ReduceOp.MAX if rank == 1 else dist.ReduceOp.SUM]))
        except Exception as e:  # noqa: BLE001
            error = (type(e).__name__, str(e))
        # The guard cannot know that a future's error was read, so destroy_process_group()
        # raises the mismatch again rather than let a rank end quietly over it.
        try:
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001
            if type(e).__name__ != "CollectiveMismatchError":
                raise
    return {"sums": sums, "learned": learned, "after": after, "error": error}


def test_a_burst_cut_short_still_gets_its_verdict_from_the_pacer():
    results = run_ranks(_bursts, 3, False, timeout=60)
    expect = float(sum(range(1, 4)))
    for rank, got in enumerate(assert_all_ok(results)):
        where = f"rank {rank}: {got}\n{report(results)}"
        assert got["learned"]["burst"] == 4, where
        assert got["after"]["mispredictions"] >= 1 and got["after"]["burst"] == 0, where
        learning = len(got["sums"]) - 1
        assert 6 <= learning <= 16 and got["sums"] == [[expect] * 4] * learning + [[expect] * 3], where
        assert got["error"] is None, where


def test_a_mismatch_inside_a_predicted_burst_raises_on_every_rank_and_no_wrong_sum_is_read():
    results = run_ranks(_bursts, 3, True, timeout=60)
    expect = float(sum(range(1, 4)))
    for rank, got in enumerate(assert_all_ok(results)):
        where = f"rank {rank}: {got}\n{report(results)}"
        assert got["error"] is not None and got["error"][0] == "CollectiveMismatchError", where
        assert "MAX" in got["error"][1] and "SUM" in got["error"][1], where
        # Every burst read before the mismatch holds the right sums; the mismatched one was never read.
        learning = len(got["sums"]) - 5
        assert got["sums"] == [[expect] * 4] * learning + [[expect] * 3] + [[expect] * 4] * 4, where
