"""check="verify": a small waited all_reduce carries its own check (modes/verify/InBandCheck).

Real processes launched as SLURM or mpirun would (plain env://, rank 0's
process hosts the store), at the guard's default settings. A loop of waited
small all_reduces is verified without check rounds; and a carried all_reduce
that meets another collective (which gloo cannot pair, or would end a process
for) still gives every rank CollectiveMismatchError within seconds, with both
calls, and no rank reads its result.
"""
from __future__ import annotations

import json
import struct

import pytest

from harness import launch_script

JOB = ["tests/python/jobs/in_band_job.py"]
DEFAULTS = {"TORCH_EXT_WARN_AFTER": "", "TORCH_EXT_ABORT_AFTER": ""}  # "": the guard's defaults


def _launch(tmp_path, kind: str, world: int = 2) -> tuple[list, list[dict], str]:
    results = launch_script(JOB, world, store="rank0", timeout=90,
                            env={"OUT": str(tmp_path), "KIND": kind, **DEFAULTS})
    text = "\n".join(r.describe() for r in results)
    records = []
    for r in results:
        path = tmp_path / f"rank{r.rank}.json"
        assert path.exists(), text
        records.append(json.loads(path.read_text()))
    return results, records, text


def _f32(x: float) -> float:
    """x rounded to float32 (a float32 AVG: the exact sum divided by W, rounded once)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _every_rank_read(results, records: list[dict], text: str, key: str, want: list) -> list[dict]:
    """Asserts every rank ended with status 0 having read `want` under `key`; returns their verifier stats."""
    for r, rec in zip(results, records):
        assert r.returncode == 0 and "error" not in rec, text
        assert rec[key] == want, text
    return [rec["verifier"] for rec in records]


@pytest.mark.timeout(120)
def test_a_loop_of_waited_small_all_reduces_is_verified_in_band_without_rounds(tmp_path):
    results, records, text = _launch(tmp_path, "none")
    for r, rec in zip(results, records):
        assert r.returncode == 0 and "error" not in rec, text
        assert rec["sums"] == [float(1 + 2 * i) for i in range(200)], text  # rank + i summed over ranks 0, 1
        v = rec["verifier"]
        assert v["in_band"] >= 190, (v, text)  # (the first may race the helper group's set-up)
        assert v["rounds"] <= 10, (v, text)
        assert v["verified_seq"] == v["issued_seq"] == 200, (v, text)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_fsdp2s_all_gather_and_reduce_scatter_are_verified_in_band_with_their_values(tmp_path, world):
    results, records, text = _launch(tmp_path, "fsdp", world)
    want = []
    for i in range(40):
        gathered = [float(r + i) for r in range(world) for _ in range(3)]
        want += [gathered, gathered]  # float32, then bfloat16 (small integers: exact)
        # Rank r's input is arange(2W) + r + i; this rank's chunk is elements [2 * rank, 2 * rank + 2).
        for op in ("sum", "avg", "max"):
            per_rank = [[float(j + r + i) for j in range(2 * world)] for r in range(world)]
            cols = list(zip(*per_rank))
            reduced = [sum(c) if op == "sum" else _f32(sum(c) / world) if op == "avg" else max(c) for c in cols]
            want.append(reduced)
    for r, rec in zip(results, records):
        assert r.returncode == 0 and "error" not in rec, text
        mine = [w[2 * r.rank:2 * r.rank + 2] if len(w) == 2 * world else w for w in want]
        assert rec["fsdp"] == mine, text
        v = rec["verifier"]
        # All 200 gathers and scatters carry their check, the floating reduce_scatters (SUM, AVG) too: gloo's
        # is an all_reduce of the input, carried in RingCarry's layout (the same order of additions).
        assert v["in_band"] >= 195, (v, text)
        assert v["verified_seq"] == v["issued_seq"], (v, text)


@pytest.mark.timeout(120)
def test_one_element_between_two_ranks_is_exchanged_and_reduced_as_its_dtype(tmp_path):
    import torch

    results, records, text = _launch(tmp_path, "one")
    want = []
    for i in range(40):
        for dtype in (torch.float32, torch.float64):
            # The dtype's own sum: computed here the way the inner backend does.
            want.append((torch.tensor([0.1 * i], dtype=dtype) + torch.tensor([0.1 * (1 + i)], dtype=dtype)).item())
        want.append((2**31 - 1 + i + 2**31) % 2**32 - 2**31)  # (2^31 - 1) + i wraps as an int32 sum does
        want += [1000 + i, -1 - i]  # int64 MAX, int32 MIN
    for v in _every_rank_read(results, records, text, "one", want):
        assert v["in_band"] >= 222 and v["rounds"] <= 10, (v, text)
    # Floating MAX/MIN, exchanged too: where neither operand is greater (a NaN
    # against a number, two NaNs of different payloads, 0 against -0), the
    # element keeps the operand plain gloo keeps, bit for bit.
    for rec in records:
        assert len(rec["one_bits"]) == 24, text  # float32/float64, six lengths, MAX and MIN
        for guarded, plain in rec["one_bits"]:
            assert guarded == plain, text
    assert records[0]["one_bits"] == records[1]["one_bits"], text


@pytest.mark.timeout(120)
def test_an_all_reduce_read_through_its_future_or_only_polled_completes_with_its_sum(tmp_path):
    # Between two ranks a small SUM is a pair exchange, carried by a summed
    # all_reduce whose future runs the reduction: read through get_future() (a
    # comm hook) or polled with is_completed() (never waited), it completes
    # all the same, once verified.
    results, records, text = _launch(tmp_path, "future")
    want = []
    for i in range(20):
        want += [2.0 * (1 + 2 * i), [float(1 + 2 * i)] * 3]
    for v in _every_rank_read(results, records, text, "future", want):
        assert v["in_band"] >= 40 and v["verified_seq"] == v["issued_seq"], (v, text)


@pytest.mark.timeout(120)
def test_carried_all_reduces_in_flight_together_start_no_rounds(tmp_path):
    # Eight carried all_reduces in flight at once (world 3: RingCarry), as a
    # program issues its metrics asynchronously: each gets its verdict with its
    # data. The completion of the first must not start rounds for the seven
    # behind it (it did: about one round per eight collectives).
    results, records, text = _launch(tmp_path, "inflight", world=3)
    want = [[float(sum(r + i + j for r in range(3))) for j in range(8)] for i in range(30)]
    for v in _every_rank_read(results, records, text, "inflight", want):
        assert v["in_band"] >= 235 and v["verified_seq"] == v["issued_seq"], (v, text)
        assert v["rounds"] <= 5, (v, text)


@pytest.mark.timeout(150)
def test_one_integer_element_among_four_ranks_carries_one_word(tmp_path):
    results, records, text = _launch(tmp_path, "one", world=4)
    want = []
    for i in range(40):
        exact = sum(0.25 * (r + i) for r in range(4))  # representable: any order of additions gives it
        want += [exact, exact, ((2**31 - 1) + 3 * i + 2**31) % 2**32 - 2**31]  # the int32 sum wraps
    for v in _every_rank_read(results, records, text, "one", want):
        # The 40 int32 sums carry one word (widened beside it); the 80 floating ones carry theirs where
        # gloo's ring leaves the element in its chunk (RingCarry: a widened float32 sum would round
        # differently from the inner backend's, test_exactness.py).
        assert v["in_band"] >= 118 and v["verified_seq"] == v["issued_seq"], (v, text)


@pytest.mark.timeout(120)
def test_carried_checks_after_uneven_all_to_alls_wait_for_the_rounds_pairing_and_never_hang(tmp_path):
    # An uneven all_to_all's pairing sums are compared by rounds only; the
    # carried all_reduces after it are released once a round got past it.
    results, records, text = _launch(tmp_path, "alltoall")
    for r, rec in zip(results, records):
        assert r.returncode == 0 and "error" not in rec, text
        want = []
        for i in range(30):
            # From rank 0 (value i): 1 element to itself, 2 to rank 1; from rank 1 (10 + i): 3 and 4.
            want.append([float(i)] + [10.0 + i] * 3 if r.rank == 0 else [float(i)] * 2 + [10.0 + i] * 4)
            want += [[float(1 + 2 * i)] * 4] * 2
        assert rec["alltoall"] == want, text
        v = rec["verifier"]
        assert v["verified_seq"] == v["issued_seq"] == 93, (v, text)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind,calls", [
    ("order", ("all_reduce(float32[4], SUM)", "broadcast(float32[4], src=0)")),
    ("big", ("all_reduce(float32[4], SUM)", "all_reduce(float32[40000], SUM)")),
    ("count", ("all_reduce(float32[4], SUM)", "all_reduce(float32[6], SUM)")),
    ("length", ("all_reduce(float32[4], SUM)", "all_reduce(float32[400], SUM)")),
    ("op", ("all_reduce(float32[4], SUM)", "all_reduce(float32[4], MAX)")),
    ("dtype", ("all_reduce(float32[4], SUM)", "all_reduce(float64[4], SUM)")),
    ("onecount", ("all_reduce(float32[1], SUM)", "all_reduce(float32[2], SUM)")),
    ("onedtype", ("all_reduce(float32[1], SUM)", "all_reduce(float64[1], SUM)")),  # packed, carried beside a word
    ("oneop", ("all_reduce(float32[1], SUM)", "all_reduce(int32[1], MAX)")),  # both packed: the same bytes
    ("gather", ("all_gather_into_tensor(float32[4])", "all_gather_into_tensor(float32[6])")),
    ("scatter", ("reduce_scatter_tensor(int64[2], SUM)", "reduce_scatter_tensor(int64[2], MAX)")),
])
def test_a_carried_all_reduce_against_another_collective_fails_every_rank_typed(tmp_path, kind, calls):
    _fails_every_rank_typed(tmp_path, kind, calls, 2)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind,calls", [
    ("onecount", ("all_reduce(int64[1], SUM)", "all_reduce(int64[2], SUM)")),
    ("onedtype", ("all_reduce(int32[1], SUM)", "all_reduce(int64[1], SUM)")),  # the same carried bytes
])
def test_a_one_word_carry_among_four_ranks_against_another_collective_fails_every_rank_typed(tmp_path, kind, calls):
    _fails_every_rank_typed(tmp_path, kind, calls, 4)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind,calls", [
    ("count", ("all_reduce(float32[4], SUM)", "all_reduce(float32[6], SUM)")),  # the next chunk; widened segments
    ("op", ("all_reduce(float32[4], SUM)", "all_reduce(float32[4], MAX)")),  # the same carried length
    ("length", ("all_reduce(float32[4], SUM)", "all_reduce(float32[400], SUM)")),
])
def test_a_ring_carried_float_all_reduce_among_three_ranks_against_another_fails_every_rank_typed(tmp_path, kind,
                                                                                                   calls):
    _fails_every_rank_typed(tmp_path, kind, calls, 3)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind,calls", [
    ("flagop", ("all_reduce(float32[1], MAX)", "all_reduce(float32[1], MIN)")),  # the same two keyed words
    ("flagdtype", ("all_reduce(float32[1], MAX)", "all_reduce(int32[1], MAX)")),
])
def test_a_keyed_flag_among_three_ranks_against_another_fails_every_rank_typed(tmp_path, kind, calls):
    # A one-element MAX/MIN travels as keys inside two int64 words (KeyedPick): a MIN, or an int32, sends
    # gloo the same bytes; the check bits in the words tell, and no rank reads the mixed keys.
    _fails_every_rank_typed(tmp_path, kind, calls, 3)


def _fails_every_rank_typed(tmp_path, kind: str, calls: tuple[str, str], world: int) -> None:
    results, records, text = _launch(tmp_path, kind, world)
    assert len(results) == world, text
    for r, rec in zip(results, records):
        assert r.returncode == 1, text  # the job's own status: it caught the error
        assert "read" not in rec, f"rank {r.rank} read the result of a differing collective: {rec}\n{text}"
        assert rec.get("error") == "CollectiveMismatchError", text
        head = f'collective #4 on group "default_pg" ({world} ranks) differs across ranks'
        assert rec["message"].startswith(head), text
        assert all(c in rec["message"] for c in calls), rec["message"]
        # Not the watchdog's hang path (warn_after, minutes at the defaults): the check's verdict.
        assert rec["after_s"] < 15, text
        assert "terminate called" not in r.output, text
