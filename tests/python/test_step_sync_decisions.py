"""StepSync's decisions (issue 68): a branch every rank must take together, decided in the step's one
all_reduce, beside stop, has-data and the metric means (``decide={"run_tower": has_images}``).

Real ranks (tests/python/harness.py run_ranks), each run under a deadline, over plain gloo and the guard at
its defaults; answers compared with what every rank voted.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import torch_ext
from harness import assert_all_ok, report, run_ranks


def _votes_of(rank: int, step: int) -> dict[str, bool]:
    # Per rank and step: some steps no rank votes, some every rank, most a mix.
    return {"tower": (rank + step) % 3 == 0, "save": step % 2 == 0 or rank == 0}


def _loop(rank: int, world: int, blocking: bool) -> list:
    sync = torch_ext.StepSync()
    seen = []
    for step in range(8):
        votes = _votes_of(rank, step)
        has_data = not (rank == world - 1 and step >= 6)  # the last rank runs out of data: it still votes
        metrics = {"loss": torch.tensor(float(rank))} if has_data else None
        out = (sync(has_data=has_data, metrics=metrics, decide=votes) if blocking
               else sync.start(has_data=has_data, metrics=metrics, decide=votes).wait())
        if out.any("tower"):  # a branch that issues collectives: every rank takes it, or none does
            dist.all_reduce(torch.ones(2))
        seen.append((out.votes("tower"), out.any("tower"), out.all("tower"), out.votes("save"), out.all("save"),
                     round(out.metric("loss"), 6)))
    return seen


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("backend", ["gloo", "guard"])
def test_every_rank_gets_the_same_answers_and_they_count_every_ranks_vote(world, backend):
    for blocking in (True, False):
        results = run_ranks(_loop, world, blocking, backend=backend, timeout=90)
        values = assert_all_ok(results)
        assert all(v == values[0] for v in values), report(results)  # the same answers on every rank
        for step, (tower, tower_any, tower_all, save, save_all, loss) in enumerate(values[0]):
            expect_tower = sum(_votes_of(r, step)["tower"] for r in range(world))
            expect_save = sum(_votes_of(r, step)["save"] for r in range(world))
            assert (tower, tower_any, tower_all) == (expect_tower, expect_tower > 0, expect_tower == world), step
            assert (save, save_all) == (expect_save, expect_save == world), step
            ranks = world - 1 if step >= 6 else world  # the mean over the ranks with data
            assert loss == round(sum(range(ranks)) / ranks, 6), (step, loss)


def _different_names(rank: int, world: int) -> str:
    sync = torch_ext.StepSync()
    try:
        sync(decide={"tower" if rank == 0 else "save": True}).any("tower" if rank == 0 else "save")
    except ValueError as e:
        return str(e)
    return "no error"


@pytest.mark.timeout(120)
def test_ranks_that_name_different_decisions_get_a_value_error_on_every_rank():
    values = assert_all_ok(run_ranks(_different_names, 2, timeout=60))
    for text in values:
        assert "the ranks sent different metric or decision names" in text, values


def _declared_but_not_passed(rank: int, world: int) -> list:
    sync = torch_ext.StepSync(decisions=["tower"])
    # A rank that passes no decide votes no on every declared decision.
    out = sync(decide={"tower": True} if rank == 0 else None)
    return [out.votes("tower"), out.any("tower"), out.all("tower")]


def test_a_declared_decision_a_rank_does_not_pass_is_its_no():
    values = assert_all_ok(run_ranks(_declared_but_not_passed, 3, timeout=60))
    assert values == [[1, True, False]] * 3, values


def _bad_inputs(rank: int, world: int) -> list[str]:
    errors = []
    sync = torch_ext.StepSync(decisions=["tower"])
    for call in (lambda: sync(decide={"other": True}), lambda: sync(decide={"tower": torch.ones(2)}),
                 lambda: torch_ext.StepSync(decisions=["a", "a"])):
        try:
            call()
            errors.append("no error")
        except ValueError as e:
            errors.append(str(e))
    out = sync(decide={"tower": True})
    try:
        out.any("nope")
        errors.append("no error")
    except KeyError as e:
        errors.append(str(e))
    return errors


def test_bad_decisions_are_refused_on_the_rank_that_made_them_before_any_collective():
    values = assert_all_ok(run_ranks(_bad_inputs, 2, timeout=60))
    changed, shape, unique, missing = values[0]
    assert "decision names changed from ['tower'] to ['other']" in changed
    assert "decide['tower'] must be a single value" in shape
    assert "decision names must be unique" in unique
    assert "no decision named 'nope'; synced decisions are ['tower']" in missing
