"""Hangs at the defaults: nothing set, what ends and when (issue 38).

A wait that can never complete (a certain wait-for cycle, a member gone) ends
on every live rank within seconds, typed; a wait that may still resolve (a rank
computing, a stream that has not started) is named within 15 s and never ended
early; a wait that recurs at one call site is named once. Every case runs real
programs (tests/python/jobs/defaults_job.py) with no TORCH_EXT_* deadline set:
warn_after and abort_after are the guard's defaults (10 s, and the group's
timeout: 30 minutes).

The scenarios mostly wait (10 s and more each), so they run side by side, once
per module: each test reads its own scenario's records.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading

import pytest

import torch_ext
from harness import launch_script

# One worker runs the module: its scenarios start once, side by side (the fixture below).
# slow: its fixture runs nine jobs (a minute); started first, it does not end the run alone (conftest.py).
pytestmark = [pytest.mark.xdist_group("verdicts_at_defaults"), pytest.mark.slow]

# A confirmed hang ends within 10 s of the look that confirms it (at warn_after,
# 10 s); an unconfirmed one is named within 15 s. Slack for a loaded 2-core machine.
CONFIRMED_BY_S = 10 + 10
NAMED_BY_S = 15 + 3

SCENARIOS = {
    # name: (ranks, store, extra env, launch timeout)
    "crossed": (3, "rank0", {}, 90),
    "p2p": (2, "parent", {}, 90),
    "pipeline": (4, "rank0", {}, 90),
    "gone": (3, "rank0", {}, 90),
    "raised": (2, "parent", {}, 90),
    "unused": (2, "rank0", {}, 90),
    "checkpoint": (2, "rank0", {"CKPT_S": "11"}, 120),
    "async": (2, "parent", {"ASYNC_S": "12"}, 90),
    "stall": (2, "rank0", {"TORCH_EXT_INNER": "cpu:nccl_sim", "TORCH_EXT_NCCL_SIM_WAIT": "data",
                           "TORCH_EXT_NCCL_SIM_STALL": "1:9"}, 90),
}


def _clean_env() -> dict[str, str]:
    # This suite's conftest lengthens the store timeout for loaded runs; here it
    # is the default again, and no other TORCH_EXT_* deadline is inherited.
    leaked = sorted(k for k in os.environ if k.startswith("TORCH_EXT_") and k != "TORCH_EXT_STORE_TIMEOUT")
    assert not leaked, f"these would make the run not a defaults run: {leaked}"
    saved = os.environ.pop("TORCH_EXT_STORE_TIMEOUT", None)
    try:
        default = torch_ext._C.resolve_config()["store_timeout"]  # Config.cpp's, not the suite's 15 s
    finally:
        if saved is not None:
            os.environ["TORCH_EXT_STORE_TIMEOUT"] = saved
    return {"TORCH_EXT_STORE_TIMEOUT": f"{default:g}"}


@pytest.fixture(scope="module")
def runs():
    base = _clean_env()
    out: dict[str, tuple] = {}

    # At most four jobs at once: all nine side by side (22 interpreters starting
    # together on two cores, beside the other pytest worker's tests) starved a
    # store host past the default 3 s store timeout now and then (StoreLostError
    # instead of the verdict under test). The jobs mostly wait out their
    # deadlines, so four at a time take little longer than nine.
    slots = threading.BoundedSemaphore(4)

    def run(name: str) -> None:
        with slots:
            run_one(name)

    def run_one(name: str) -> None:
        world, store, env, timeout = SCENARIOS[name]
        # Under plain env:// rank 0 binds the store's port after the launcher chose
        # it free; with nine jobs starting side by side another process's socket
        # can take it in between (EADDRINUSE, seen in a clean-clone CI run): that
        # job never started, so it is started again on a new port.
        for _ in range(3):
            folder = tempfile.mkdtemp(prefix=f"defaults_{name}_")
            try:
                results = launch_script(["tests/python/jobs/defaults_job.py"], world, store=store, timeout=timeout,
                                        env={**base, **env, "SCENARIO": name, "OUT": folder})
            except Exception as e:  # noqa: BLE001 - reported by the scenario's test
                out[name] = (None, {}, repr(e))
                return
            if not any("EADDRINUSE" in r.output for r in results):
                break
        records = {}
        for r in results:
            path = os.path.join(folder, f"rank{r.rank}.json")
            if os.path.exists(path):
                with open(path) as f:
                    records[r.rank] = json.load(f)
        text = "\n".join(f"--- rank {r.rank} (exit {r.returncode})\n{r.output[-4000:]}" for r in results)
        out[name] = (results, records, text)

    # The longest first (they wait out a checkpoint or an async gap), so that the
    # slots stay full to the end.
    order = sorted(SCENARIOS, key=lambda n: n not in ("checkpoint", "async"))
    threads = [threading.Thread(target=run, args=(name,)) for name in order]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _scenario(runs, name):
    results, records, text = runs[name]
    assert results is not None, text
    return results, records, text


def _warnings(rec: dict, needle: str) -> list[dict]:
    return [r for r in rec["records"] if r["level"] == "WARNING" and needle in r["text"]]


def _ended_typed_on_every_rank(runs, name: str, error: str) -> list[str]:
    """Every rank of scenario `name` ended by itself with `error` (caught: exit 4), confirmed in
    time; returns the messages, by rank."""
    results, records, text = _scenario(runs, name)
    messages = []
    for r in results:
        assert r.returncode == 4, text  # ended by itself, with the typed error caught
        rec = records[r.rank]
        assert rec["error"] == error, text
        assert rec["after"] < CONFIRMED_BY_S, (rec["after"], text)
        messages.append(rec["message"])
    return messages


def test_a_cycle_across_groups_ends_typed_on_every_rank_within_seconds(runs):
    for message in _ended_typed_on_every_rank(runs, "crossed", "DeadlockError"):
        first = message.splitlines()[0]
        assert first.startswith("deadlock across groups dp and mp: "), message
        assert "it can never complete" in first and "TORCH_EXT_END_DEADLOCKS=0" in first, first
        assert "every rank of the loop blocks in its wait" in message, message


def test_two_stages_that_both_receive_first_end_typed_on_both(runs):
    # Within one group the pairing check sees it first (a second in): no send
    # can ever meet these receives.
    for rank, message in enumerate(_ended_typed_on_every_rank(runs, "p2p", "CollectiveMismatchError")):
        assert "send/recv on group \"default_pg\" do not pair" in message, message
        assert f"rank {1 - rank} has posted no matching send" in message, message


def test_a_pipeline_cycle_through_send_recv_and_reduce_ends_typed_on_every_stage(runs):
    for message in _ended_typed_on_every_rank(runs, "pipeline", "DeadlockError"):
        assert message.startswith("deadlock across groups dp and pp: "), message
        assert 'rank 2 waits in recv(float32[3], src=0, tag=0) from rank 0 on group "pp"' in message, message


def test_a_gone_rank_ends_the_survivors_within_seconds(runs):
    results, records, text = _scenario(runs, "gone")
    assert results[2].returncode == -9, text
    for rank in (0, 1):
        assert results[rank].returncode == 4, text
        rec = records[rank]
        assert rec["error"] == "CollectiveFailureError", text
        assert rec["after"] < 10, (rec["after"], text)
        assert "rank 2" in rec["message"], rec["message"]


def test_a_rank_ended_by_an_uncaught_exception_is_named_with_what_it_raised(runs):
    # Its last words: the peers it leaves waiting say what ended it, not only that it exited.
    results, records, text = _scenario(runs, "raised")
    assert results[1].returncode == 1 and "ValueError: batch 3 of shard 7 is empty" in results[1].output, text
    assert results[0].returncode == 4, text
    rec = records[0]
    assert rec["error"] == "CollectiveFailureError", text
    assert rec["after"] < 10, (rec["after"], text)
    assert ("rank 1: exited" in rec["message"] and ", raising ValueError: batch 3 of shard 7 is empty (at "
            "defaults_job.py:" in rec["message"] and " in raised)" in rec["message"]), rec["message"]


def test_ddps_unused_parameter_error_on_one_rank_reaches_the_rank_it_leaves_waiting(runs):
    # DDP raises on rank 1 (a parameter without a gradient there) and the process ends;
    # rank 0, waiting in the gradient all_reduce, is told what rank 1 raised.
    results, records, text = _scenario(runs, "unused")
    assert results[1].returncode == 1 and "Expected to have finished reduction" in results[1].output, text
    assert results[0].returncode == 4, text
    msg = records[0]["message"]
    assert records[0]["error"] == "CollectiveFailureError", text
    assert "raising RuntimeError: Expected to have finished reduction in the prior iteration" in msg, msg
    assert "Parameter indices which did not receive grad for rank 1: 2 3" in msg, msg


def test_a_checkpoint_on_rank_0_every_epoch_is_named_once_and_never_ended(runs):
    results, records, text = _scenario(runs, "checkpoint")
    assert [r.returncode for r in results] == [0, 0], text
    assert all(records[r]["ok"] for r in (0, 1)), text
    named = [w for r in (0, 1) for w in _warnings(records[r], "has waited")]
    assert len(named) == 1, (named, text)
    report = named[0]["text"]
    assert "barrier" in report and "rank 0" in report, report
    assert "deadlock" not in report, report


def test_an_async_op_in_flight_while_its_rank_computes_is_not_ended(runs):
    # While rank 0 computes with dp's all_reduce pending, rank 1 waits in mp
    # for it: the waits form a loop, but rank 0 is not blocked and will come.
    results, records, text = _scenario(runs, "async")
    assert [r.returncode for r in results] == [0, 0], text
    assert all(records[r]["ok"] for r in (0, 1)), text
    named = [w for r in (0, 1) for w in _warnings(records[r], "has waited")]
    assert len(named) == 1, (named, text)
    assert "possibly temporary: rank 0 has its operation pending without blocking in it" in named[0]["text"], named


def test_a_stalled_stream_is_named_with_its_rank_within_15_s(runs):
    results, records, text = _scenario(runs, "stall")
    rec = records.get(0)
    assert rec is not None and rec.get("named"), text
    report = [r for r in rec["records"] if "its stream has not begun it" in r["text"]][0]
    assert report["after"] < NAMED_BY_S, (report["after"], text)
    assert "rank 1: issued #9, but its stream has not begun it" in report["text"], report["text"]
    # Rank 0 left once it had the report; rank 1 ends by itself (its peer gone).
    assert all(r.returncode is not None for r in results), text
