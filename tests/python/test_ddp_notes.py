"""How a report's all_reduce lines are matched to DDP's gradient buckets (torch_ext/_ddp.py).

The real runs (a DDP mismatch, an unfinished reduction, on every path) are in
test_paths.py and test_examples.py; here the matching rules, on the layout a
DDP module in this process would give.
"""
from __future__ import annotations

import pytest

from torch_ext import _ddp
from torch_ext.errors import OpFacts, Report

REPORT = """collective #7 all_reduce(float32[36], SUM) on group "default_pg" failed in the inner backend (...)
  waiting: rank 0 at train.py:40 in step
  rank 0 issued collectives that rank 1 never issued before ending:
    #7 all_reduce(float32[36], SUM) at train.py:40 in step
    #8 all_reduce(float32[72], SUM) at train.py:40 in step
    #9 all_reduce(float32[5], SUM) at train.py:44 in step
  rank 1: all_reduce(float64[36], SUM)  at train.py:40 in step
  rank 0: send(float32[36], dst=1, tag=0) (#1) at train.py:50 in step"""


def _op(op: str, dtype: str, sizes: tuple[int, ...], reduce_op: str = "SUM", tensors: int = 1) -> OpFacts:
    text = f"{op}({dtype}[{', '.join(map(str, sizes))}]" + (f", {reduce_op})" if reduce_op else ", dst=1, tag=0)")
    return OpFacts(text, op, dtype, sizes, tensors, reduce_op)


# The facts the C++ core gives with REPORT: each operation it names, as values.
FACTS = Report(error="failure", verdict="failure", group="default_pg", seq=7, op="all_reduce(float32[36], SUM)",
               rows=(), waiting=(0,), not_arrived=(), gone=(1,), completed=(), cycle_groups=(), certain=False,
               waits_for=(), text=REPORT,
               ops=(_op("all_reduce", "float32", (36,)), _op("all_reduce", "float32", (72,)),
                    _op("all_reduce", "float32", (5,)), _op("all_reduce", "float64", (36,)),
                    _op("send", "float32", (36,), reduce_op="")))


def _layout(*sizes: int) -> list[_ddp.Bucket]:
    return [_ddp.Bucket(i, len(sizes), n, "float32", (f"l{i}.weight", f"l{i}.bias")) for i, n in enumerate(sizes)]


def test_each_bucket_line_is_followed_by_its_bucket_and_nothing_else_changes(monkeypatch):
    monkeypatch.setattr(_ddp, "buckets", lambda: _layout(36, 72))
    assert [f.text for f in FACTS.ops][:4] == ["all_reduce(float32[36], SUM)", "all_reduce(float32[72], SUM)",
                                               "all_reduce(float32[5], SUM)", "all_reduce(float64[36], SUM)"]
    lines = _ddp.annotate(REPORT, FACTS).split("\n")
    assert lines[1] == "  DDP gradient bucket 1 of 2: l0.weight, l0.bias"  # under the header, indented
    assert lines[5] == "       DDP gradient bucket 1 of 2: l0.weight, l0.bias"  # under the op
    assert lines[7] == "       DDP gradient bucket 2 of 2: l1.weight, l1.bias"
    # No bucket of that size or dtype, and not an all_reduce: left as they were.
    assert [line for line in lines if "DDP" not in line] == REPORT.split("\n")
    assert len(lines) == len(REPORT.split("\n")) + 3


def test_only_all_reduces_of_one_flat_tensor_are_matched_and_without_facts_nothing_is(monkeypatch):
    monkeypatch.setattr(_ddp, "buckets", lambda: _layout(36, 72))
    text = "collective #3 all_reduce(float32[6, 6], SUM) on group \"g\" has waited 30 s"
    grid = Report(**{**FACTS.__dict__, "text": text, "ops": (_op("all_reduce", "float32", (6, 6)),)})
    assert grid.ops[0].numel == 36
    assert _ddp.annotate(text, grid) == text  # 36 elements, but not a flat bucket
    assert _ddp.annotate(REPORT, None) == REPORT  # no facts: the text as it is


def test_buckets_of_the_same_size_are_named_together():
    assert _ddp._note(_layout(36, 36, 72), "float32", 36) == "DDP gradient bucket 1 or 2 of 3 (the same size)"


def test_long_buckets_name_their_first_parameters_and_count_the_rest():
    b = _ddp.Bucket(0, 1, 8, "float32", tuple(f"p{i}" for i in range(9)))
    assert b.describe() == "DDP gradient bucket 1 of 1: p0, p1, p2, p3, p4, p5 and 3 more"


@pytest.mark.parametrize("layout", [[], None])
def test_without_ddp_or_when_reading_it_fails_the_text_is_the_report(monkeypatch, layout):
    def read():
        if layout is None:
            raise RuntimeError("reducer gone")
        return layout

    monkeypatch.setattr(_ddp, "buckets", read)
    from torch_ext.errors import CollectiveFailureError

    assert str(CollectiveFailureError(REPORT)) == REPORT


def test_explain_speaks_only_for_ddps_own_error_on_this_rank():
    import torch_ext
    from torch_ext.errors import CollectiveFailureError

    # No DDP module in this process: nothing to add, even to DDP's error.
    assert torch_ext.explain(RuntimeError(_ddp.UNFINISHED + " before starting a new one.")) == ""
    assert torch_ext.explain(ValueError("something else")) == ""
    # A peer's report that quotes DDP's words (its last words) is the guard's error, not DDP's.
    quoted = CollectiveFailureError("rank 1: exited, raising RuntimeError: " + _ddp.UNFINISHED)
    assert torch_ext.explain(quoted) == ""
