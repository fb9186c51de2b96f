"""torch_ext.label (issue 29): what a collective was for, and the line that asked
for it, in the ledger, the dumps, the live reports and the exports.

Real ranks (tests/python/harness.py run_ranks), each run under a deadline.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import threading
import time

import pytest
import torch
import torch.distributed as dist

import torch_ext
from harness import assert_all_ok, run_ranks
from torch_ext.diagnose.__main__ import main as diagnose_main

HINT = "log it on every rank"
FAST = {"TORCH_EXT_WARN_AFTER": "1", "TORCH_EXT_INTERVAL": "0.1", "TORCH_EXT_STORE_TIMEOUT": "15"}


def _asked_here() -> torch_ext.Origin:
    return torch_ext.here()  # ORIGIN


def _origin_line() -> int:
    with open(__file__) as f:
        for n, text in enumerate(f, 1):
            if text.rstrip().endswith("# ORIGIN"):
                return n
    raise AssertionError("no ORIGIN line")


def _labels(rank: int, world: int) -> dict:
    origin = _asked_here()
    with torch_ext.label("metric 'val_loss'", origin=origin, hint=HINT, metric="val_loss", step=3):
        dist.all_reduce(torch.ones(2))  # #1 labelled
        with torch_ext.label("inner"):
            dist.all_reduce(torch.ones(2))  # #2: the innermost label wins
        dist.all_reduce(torch.ones(2))  # #3: the outer one again
    dist.all_reduce(torch.ones(2))  # #4: none

    @torch_ext.label("decorated")
    def sync() -> None:
        dist.all_reduce(torch.ones(3))

    sync()  # #5
    # Labels are per thread: a label on another thread does not leak here.
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with torch_ext.label("other thread"):
            entered.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    entered.wait(10)
    dist.all_reduce(torch.ones(1))  # #6: unlabelled although the other thread is inside a label
    release.set()
    t.join()
    return {"file": torch_ext.__file__, "entries": torch_ext.ledger()}


def test_labels_reach_the_ledger_per_thread_innermost_first():
    for res in assert_all_ok(run_ranks(_labels, 2, timeout=90)):
        # The ranks import this worktree's torch_ext.
        assert os.path.dirname(os.path.dirname(res["file"])) == os.path.dirname(os.path.dirname(torch_ext.__file__))
        labels = [e.get("label") for e in res["entries"]]
        assert len(labels) == 6, labels
        first = labels[0]
        assert first["text"] == "metric 'val_loss'"
        assert first["fields"] == {"metric": "val_loss", "step": "3"}
        assert first["hint"] == HINT
        (o,) = first["origin"]
        assert os.path.basename(o["filename"]) == "test_labels.py" and o["line"] == _origin_line(), o
        assert o["name"] == "_asked_here"
        assert labels[1]["text"] == "inner" and labels[2] == first
        assert labels[3] is None
        assert labels[4]["text"] == "decorated"
        assert labels[5] is None


def test_label_rejects_bad_arguments():
    with pytest.raises(ValueError, match="non-empty"):
        torch_ext.label("")
    with pytest.raises(TypeError, match="origin must be"):
        torch_ext.label("x", origin="train.py:3")


def _mismatch(rank: int, world: int) -> str:
    dist.all_reduce(torch.ones(1))  # #1
    origin = _asked_here()
    try:
        if rank == 0:
            with torch_ext.label("metric 'val_loss'", origin=origin, hint=HINT):
                dist.all_reduce(torch.ones(4))  # #2 on rank 0
        else:
            dist.all_reduce(torch.ones(2, 2))  # #2 on rank 1: another shape (same bytes: gloo), no label
        for _ in range(50):
            dist.all_reduce(torch.ones(1))
            time.sleep(0.05)
    except torch_ext.CollectiveMismatchError as e:
        return str(e)
    return "no error"


@pytest.mark.parametrize("mode", ["verify", "async", "strict"])
def test_mismatch_report_names_the_label_its_origin_and_hint(mode):
    env = dict(FAST, TORCH_EXT_CHECK=mode)
    texts = assert_all_ok(run_ranks(_mismatch, 2, env=env, timeout=90))
    line = _origin_line()
    for text in texts:
        # Strict mode: each rank names the label active on its thread when it checks.
        assert "differs across ranks" in text, text
        assert f"for metric 'val_loss' (asked for at test_labels.py:{line} in _asked_here)" in text, text
        assert text.count(f"hint: {HINT}") == 1, text


def _late(rank: int, world: int, dump_dir: str) -> None:
    dist.all_reduce(torch.ones(1))  # #1
    origin = _asked_here()
    if rank == 1:
        deadline = time.monotonic() + 30
        while not all(os.path.exists(os.path.join(dump_dir, f"rank{r}.json")) for r in range(world)):
            if time.monotonic() > deadline:
                raise TimeoutError("no dumps from the hang report")
            time.sleep(0.05)
    with torch_ext.label("metric 'val_loss'", origin=origin, hint=HINT, metric="val_loss"):
        dist.all_reduce(torch.ones(8))  # #2: rank 0 waits for rank 1
    dist.all_reduce(torch.ones(2))


def _diagnose(*argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = diagnose_main(list(argv))
    assert rc in (0, 1), err.getvalue()
    return out.getvalue() + err.getvalue()


def test_hang_dumps_report_fr_and_trace_carry_the_label(tmp_path):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    assert_all_ok(run_ranks(_late, 2, str(dumps), env=dict(FAST, TORCH_EXT_DUMP_DIR=str(dumps)), timeout=90))
    line = _origin_line()
    rank0 = json.loads((dumps / "rank0.json").read_text())
    (entry,) = [e for e in rank0["groups"][0]["entries"] if e["collective_seq_id"] == 2]
    assert entry["label"]["text"] == "metric 'val_loss'" and entry["label"]["fields"] == {"metric": "val_loss"}
    # The post-mortem report (the same analysis as the live one) names the label, its origin and the hint.
    text = _diagnose(str(dumps))
    assert f"for metric 'val_loss' (asked for at test_labels.py:{line} in _asked_here)" in text, text
    assert f"hint: {HINT}" in text, text
    # Flight Recorder export: torch_ext's own key of the entry.
    fr = tmp_path / "fr"
    _diagnose(str(dumps), "--fr", str(fr))
    import pickle

    files = sorted(os.listdir(fr))
    assert files, "no FR files"
    with open(fr / files[0], "rb") as f:
        data = pickle.load(f)
    labelled = [e for e in data["entries"] if e["torch_ext"].get("label")]
    assert labelled and labelled[0]["torch_ext"]["label"]["text"] == "metric 'val_loss'", data["entries"]
    # Perfetto trace: the event's args.
    trace = tmp_path / "trace.json"
    _diagnose(str(dumps), "--trace", str(trace))
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    args = [e["args"] for e in events if e.get("ph") == "X" and e["args"].get("label")]
    assert args, events
    assert args[0]["label"] == "metric 'val_loss'"
    assert args[0]["label origin"] == f"test_labels.py:{line} in _asked_here"
    assert args[0]["label.metric"] == "val_loss"
    # The HTML page's op table.
    page = tmp_path / "page.html"
    _diagnose(str(dumps), "--html", str(page))
    assert f"for metric 'val_loss' (asked for at test_labels.py:{line} in _asked_here)" in page.read_text()


def _metric_keys(rank: int, world: int) -> str:
    """Lightning#19106 without Lightning: a key only rank 0 logs, synced at epoch end."""
    dist.all_reduce(torch.ones(16))  # #1 a training step
    try:
        with torch_ext.label("metric 'val_loss'", metric="val_loss"):
            dist.all_reduce(torch.ones(1))  # #2 every rank
        if rank == 0:
            with torch_ext.label("metric 'val_acc_c3'", metric="val_acc_c3", hint=HINT):
                dist.all_reduce(torch.ones(1))  # #3 rank 0 only
        # The next steps: as many bytes as rank 0's extra sync (gloo aborts a process
        # over differing sizes), another reduce op; until the group fails on the
        # difference (async mode finds it off the hot path, a few steps later).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            dist.all_reduce(torch.ones(1), op=dist.ReduceOp.MAX)
    except torch_ext.CollectiveMismatchError as e:
        return str(e)
    return "no error"


@pytest.mark.parametrize("mode", ["verify", "async", "strict"])
def test_mismatch_report_names_the_metrics_each_rank_synced(mode):
    # verify and strict: the ranks exchange their words for the differing collective
    # (each rank's metric syncs among them); async: the watchdog's report from the windows.
    texts = assert_all_ok(run_ranks(_metric_keys, 3, env=dict(FAST, TORCH_EXT_CHECK=mode), timeout=90))
    for text in texts:
        assert "collective #3 on group" in text, text
        assert ("\n  metric syncs here: rank 0 synced val_loss, val_acc_c3; ranks 1,2 synced val_loss only"
                "\n  val_acc_c3 is synced on rank 0 only: ranks 1,2 never synced it here") in text, text
        assert text.count(f"hint: {HINT}") == 1, text


def _different_metrics(rank: int, world: int) -> dict:
    """Lightning#19106 with equal key counts: each rank syncs a metric of the same shape at the same
    step, but not the same metric. Without the metric in the fingerprint the values mix silently."""
    name = "val_acc_a" if rank == 0 else "val_acc_b"
    dist.all_reduce(torch.ones(16))  # #1 a training step
    read = None
    try:
        with torch_ext.label(f"metric '{name}'", metric=name):
            t = torch.full((1,), float(rank + 1))
            dist.all_reduce(t)  # #2: the same op and shape on every rank
            read = t.item()
        for _ in range(50):  # the next steps
            dist.all_reduce(torch.ones(1))
    except torch_ext.CollectiveMismatchError as e:
        return {"error": str(e), "read": read}
    return {"error": None, "read": read}


@pytest.mark.parametrize("mode", ["verify", "strict"])
def test_ranks_syncing_different_metrics_of_one_shape_get_a_mismatch_not_a_mixed_value(mode):
    for v in assert_all_ok(run_ranks(_different_metrics, 3, env=dict(FAST, TORCH_EXT_CHECK=mode), timeout=90)):
        assert v["read"] is None, v  # the mixed sum (1 + 2 + 2) never reached user code
        text = v["error"]
        assert text and text.startswith('collective #2 on group "default_pg" (3 ranks) differs across ranks:'), v
        assert "for metric 'val_acc_a'" in text and "for metric 'val_acc_b'" in text, text
        assert "\n  metric syncs here: rank 0 synced val_acc_a; ranks 1,2 synced val_acc_b" in text, text


def _same_metric_labels(rank: int, world: int) -> float:
    with torch_ext.label("metric 'val_loss'", metric="val_loss"):
        t = torch.full((1,), float(rank + 1))
        dist.all_reduce(t)
    return t.item()


def test_the_same_metric_on_every_rank_syncs_as_before():
    assert assert_all_ok(run_ranks(_same_metric_labels, 3, env=FAST, timeout=60)) == [6.0, 6.0, 6.0]


def _lazy(rank: int, world: int) -> dict:
    from torch_ext import _C

    ns: dict = {}
    exec(compile("def asked_here():\n    pass\n", "/job/lazy_model.py", "exec"), ns)
    origin = (ns["asked_here"].__code__, 2)
    before = _C._labels_unresolved()
    with torch_ext.label("metric 'lazy'", origin=origin, metric="lazy"):
        entered = _C._labels_unresolved()  # entering it resolved nothing
        dist.all_reduce(torch.ones(1))
    issued = _C._labels_unresolved()  # nor did the collective
    (entry,) = [e for e in torch_ext.ledger() if e.get("label")]
    return {"before": before, "entered": entered, "issued": issued, "read": _C._labels_unresolved(),
            "origin": entry["label"]["origin"]}


def test_an_origin_is_resolved_when_first_read_not_when_entered():
    for v in assert_all_ok(run_ranks(_lazy, 2, timeout=90)):
        assert v["entered"] == v["issued"] == v["before"] + 1, v
        assert v["read"] == v["before"], v  # torch_ext.ledger() read it: resolved, and kept
        (o,) = v["origin"]
        assert (o["filename"], o["line"], o["name"]) == ("/job/lazy_model.py", 2, "asked_here"), o
