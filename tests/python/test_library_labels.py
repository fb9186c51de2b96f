"""Labels on the collectives of metric libraries (issue 29): torchmetrics'
``Metric.compute()`` / ``sync()`` and Accelerate's ``gather_for_metrics`` /
``gather`` / ``reduce`` name the metric class or the call, and the line that
called it, when those libraries are installed.

Real ranks (tests/python/harness.py run_ranks), each run under a deadline; every
rank ends by itself with a typed error by abort_after.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

import torch_ext
from harness import ROOT, needs, report, run_ranks, run_script

ENV = {"TORCH_EXT_WARN_AFTER": "1", "TORCH_EXT_ABORT_AFTER": "4", "TORCH_EXT_INTERVAL": "0.1"}
TYPED = (torch_ext.CollectiveTimeoutError, torch_ext.CollectiveMismatchError, torch_ext.CollectiveFailureError)


def _line(mark: str) -> int:
    with open(__file__) as f:
        for n, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# {mark}"):
                return n
    raise AssertionError(f"no '# {mark}' line")


def _ended_by_itself(results) -> list[str]:
    texts = []
    for r in results:
        assert not r.timed_out, report(results)  # every rank ended by itself
        assert r.error_type in {t.__name__ for t in TYPED}, report(results)
        texts.append(r.error)
    return texts


# --- torchmetrics -----------------------------------------------------------------


def _torchmetrics_rank0(rank: int, world: int) -> None:
    import torchmetrics  # imported after the group exists: wrapped on import

    metric = torchmetrics.MeanMetric()
    metric.update(torch.tensor([float(rank), 1.0]))
    if rank == 0:
        # The bug: compute() (a collective) on rank 0 only.
        print("val mean", metric.compute())  # COMPUTE
    dist.all_reduce(torch.ones(3))  # the next epoch's first collective, say


def test_torchmetrics_compute_on_rank0_only_names_the_metric_and_the_compute_line():
    needs("torchmetrics")
    results = run_ranks(_torchmetrics_rank0, 3, env=ENV, timeout=90, check=False)
    texts = _ended_by_itself(results)
    line = _line("COMPUTE")
    # The user's compute() line (the origin is that line: said once), through torchmetrics, for the metric.
    site = (f"at test_library_labels.py:{line} in _torchmetrics_rank0 (via torchmetrics .../distributed.py:")
    assert any(site in t and "for torchmetrics MeanMetric.compute()\n" in t for t in texts), "\n\n".join(texts)
    assert any("hint: a torchmetrics metric syncs its state across all ranks when it is computed" in t
               for t in texts), "\n\n".join(texts)


def _torchmetrics_labels(rank: int, world: int) -> list:
    import torchmetrics

    metric = torchmetrics.SumMetric()
    metric.update(torch.tensor(1.0))
    metric.compute()
    metric.sync()  # an explicit sync: labelled sync()
    metric.unsync()
    return [e.get("label") for e in torch_ext.ledger()]


def test_torchmetrics_labels_carry_the_metric_field_and_the_call():
    needs("torchmetrics")
    results = run_ranks(_torchmetrics_labels, 2, timeout=90, check=False)
    assert all(r.ok for r in results), report(results)
    labels = [lab for lab in results[0].value if lab]
    assert labels, results[0].value
    texts = {lab["text"] for lab in labels}
    assert texts == {"torchmetrics SumMetric.compute()", "torchmetrics SumMetric.sync()"}, texts
    for lab in labels:
        assert lab["fields"] == {"metric": "SumMetric", "library": "torchmetrics"}, lab
        (o,) = lab["origin"]
        assert o["name"] == "_torchmetrics_labels", o


# --- Accelerate ---------------------------------------------------------------------


def _accelerate_rank0(rank: int, world: int) -> None:
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)  # reuses the guard group (on CPU Accelerate asks for gloo)
    preds = torch.tensor([float(rank)])
    if acc.is_main_process:
        # The bug: gather_for_metrics (a collective) on the main process only.
        acc.gather_for_metrics(preds)  # GATHER
    dist.all_reduce(torch.ones(3))  # the next epoch's first collective, say


def test_accelerate_gather_for_metrics_on_the_main_process_only_names_the_call_and_line():
    needs("accelerate")
    results = run_ranks(_accelerate_rank0, 3, env=ENV, timeout=120, check=False)
    texts = _ended_by_itself(results)
    line = _line("GATHER")
    site = f"at test_library_labels.py:{line} in _accelerate_rank0 (via accelerate .../operations.py:"
    # The outermost call names the label (gather_for_metrics calls gather).
    assert any(site in t and "for accelerate gather_for_metrics()\n" in t for t in texts), "\n\n".join(texts)
    assert any("hint: Accelerator.gather / gather_for_metrics / reduce are collectives" in t for t in texts), \
        "\n\n".join(texts)


def test_no_library_is_imported_by_torch_ext():
    # Wrapping needs no import: a process that never imports them never loads them.
    code = ("import sys, torch_ext, torch_ext._libraries as L; print(L.install()); "
            "print('torchmetrics' in sys.modules, 'accelerate' in sys.modules)")
    out = run_script(["-c", code], ROOT, 120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[1] == "False False", out.stdout
