"""Stragglers in dumps: the rank the others wait for, named by ``diagnose`` with the watchdog's rule.

The function (torch_ext/diagnose/stragglers.py, the C++ StragglerBoard on the
wait windows each dump carries) on hand-made dumps, then real 4-rank runs on
gloo with the guard: one where rank 2 sleeps 30 ms before each of 40
all_reduces (named, with about 30 ms per collective, in the text, ``--json``,
``--html``, the ``--trace`` counter tracks and the live report's rendering)
and a balanced one (nobody named, no section).
"""
from __future__ import annotations

import contextlib
import io
import json
import statistics
import subprocess
import time

import pytest
import torch
import torch.distributed as dist

import torch_ext
from harness import assert_all_ok, run_ranks
from torch_ext.diagnose.__main__ import main as diagnose_main
from torch_ext.diagnose.live import LiveReport, RankLive
from torch_ext.diagnose.live import format_text as live_text
from torch_ext.diagnose.stragglers import format_stragglers, stragglers_from_snapshots

STEPS, SLOW_S, WORLD = 40, 0.030, 4


# --- the function, on hand-made dumps ----------------------------------------------
# The rule itself (StragglerBoard) and its use on dumps are unit-tested in C++
# (tests/cpp/test_stragglers.cpp); these check what Python reads of it.

def _snap(rank: int, waits_ms: list[float], span_ms: float = 200.0, windows: bool = True) -> dict:
    """Rank ``rank``'s dump of a 4-rank group after len(waits_ms) windows of 4 collectives."""
    group = {"name": "0", "desc": "default_pg", "rank": rank, "size": 4, "ranks": [0, 1, 2, 3],
             "last_seq": 4 * len(waits_ms), "last_completed_seq": 4 * len(waits_ms), "rolling_hash": "0" * 16,
             "entries": []}
    if windows:
        group["wait_windows"] = [{"level": 0, "index": i, "wait_ns": int(w * 1e6), "span_ns": int(span_ms * 1e6),
                                  "site": "00000000000000ab", "site_wait_ns": int(w * 1e6), "site_count": 4}
                                 for i, w in enumerate(waits_ms)]
        group["wait_sites"] = {"00000000000000ab": "train.py:52 in train_step"}
    return {"version": "torch_ext-1", "rank": rank, "pid": 1, "hostname": f"node{rank}", "time_ns": 1,
            "incident": "dump", "config": "", "main_thread": {"available": False, "note": "", "frames": []},
            "groups": [group]}


def test_the_rank_the_others_wait_for_is_named_with_the_watchdogs_words():
    [g] = stragglers_from_snapshots([_snap(r, [2.0 if r == 2 else 12.0] * 10) for r in range(4)])
    assert (g["group"], g["first_seq"], g["last_seq"], g["collectives"]) == ("default_pg", 1, 40, 40)
    [s] = g["stragglers"]
    assert s["rank"] == 2 and s["site"] == "train.py:52 in train_step", s
    assert s["extra_s_per_collective"] == pytest.approx(0.010 / 4, abs=1e-9)  # 10 ms per window of 4
    assert s["text"].startswith('straggler on group "default_pg": rank 2 (host node2) is the straggler: '), s
    assert [r["rank"] for r in g["ranks"]] == [0, 1, 2, 3]
    assert g["ranks"][2]["wait_s"] == pytest.approx(0.020) and g["ranks"][2]["span_s"] == pytest.approx(2.0)
    lines = format_stragglers([g], prefix="[live] ")
    assert lines[:3] == ["", "Stragglers:", "[live] " + s["text"]], lines
    assert lines[3] == "  time each rank waited in collectives 1-40: rank 0 6%, rank 1 6%, rank 2 1%, rank 3 6%"


def test_a_small_difference_few_windows_or_old_dumps_name_nobody():
    # Rank 0 waits less every time, by 2 ms of 200: under 5% of the span.
    [g] = stragglers_from_snapshots([_snap(r, [8.0 if r == 0 else 10.0] * 10) for r in range(4)])
    assert g["stragglers"] == [] and g["collectives"] == 40
    # A clear straggler in 2 windows only: the waits, no verdict.
    [g] = stragglers_from_snapshots([_snap(r, [1.0 if r == 0 else 30.0] * 2) for r in range(4)])
    assert g["stragglers"] == [] and g["collectives"] == 8 and len(g["ranks"]) == 4
    # Dumps of a torch_ext that did not carry windows: nothing to analyse, no section.
    [g] = stragglers_from_snapshots([_snap(r, [1.0] * 10, windows=False) for r in range(4)])
    assert (g["collectives"], g["first_seq"], g["ranks"], g["stragglers"]) == (0, None, [], [])
    assert format_stragglers([g]) == [] and stragglers_from_snapshots([]) == []


# --- real runs ---------------------------------------------------------------------

def _train(rank: int, world: int, dump_dir: str, load_s: list[float]) -> str:
    for _ in range(STEPS):
        time.sleep(load_s[rank])  # this rank's data loading
        dist.all_reduce(torch.ones(16))
    return torch_ext.dump(dump_dir)


def _run(tmp_path_factory, name: str, load_s: list[float]):
    path = tmp_path_factory.mktemp(name)
    assert_all_ok(run_ranks(_train, WORLD, str(path), load_s, timeout=60))
    return path


@pytest.fixture(scope="module")
def straggler_dumps(tmp_path_factory):
    return _run(tmp_path_factory, "straggler", [0.0, 0.0, SLOW_S, 0.0])  # rank 2 sleeps 30 ms, the others none


@pytest.fixture(scope="module")
def balanced_dumps(tmp_path_factory):
    # Every rank loads for 10 ms: a balanced job, with a span long enough that a loaded machine's
    # scheduling noise stays well under 5% of it (back-to-back all_reduces, two runs at once on 2 cores: 4%).
    return _run(tmp_path_factory, "balanced", [0.010] * WORLD)


def _diagnose(*args) -> subprocess.CompletedProcess:
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = diagnose_main(argv)
    return subprocess.CompletedProcess(argv, rc, out.getvalue(), err.getvalue())


def test_diagnose_names_the_rank_that_sleeps_before_each_collective(straggler_dumps, tmp_path):
    out = _diagnose(straggler_dumps, "--trace", tmp_path / "trace.json", "--html", tmp_path / "page.html")
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert '\nStragglers:\nstraggler on group "default_pg": rank 2 (host ' in text, text
    assert f" for it over collectives 1-{STEPS} " in text and "most at test_straggler_diagnose.py:" in text, text
    assert f"\n  time each rank waited in collectives 1-{STEPS}: rank 0 " in text, text

    js = _diagnose(straggler_dumps, "--json")
    [g] = json.loads(js.stdout)["stragglers"]
    [s] = g["stragglers"]
    assert s["rank"] == 2 and " in _train" in s["site"], g
    assert s["extra_s_per_collective"] == pytest.approx(SLOW_S, rel=0.25), g
    assert g["collectives"] == STEPS and [r["rank"] for r in g["ranks"]] == [0, 1, 2, 3]
    assert min(g["ranks"], key=lambda r: r["wait_share"])["rank"] == 2

    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    waits: dict[int, list[float]] = {}
    for e in events:
        if e["ph"] == "C":
            assert e["name"] == "wait (ms)" and list(e["args"]) == ["default_pg"], e
            waits.setdefault(int(names[e["pid"]].split()[1]), []).append(e["args"]["default_pg"])
    assert sorted(waits) == [0, 1, 2, 3] and all(len(w) == STEPS for w in waits.values()), waits
    medians = {r: statistics.median(w) for r, w in waits.items()}
    assert all(medians[2] + SLOW_S * 1e3 * 0.5 < medians[r] for r in (0, 1, 3)), medians

    page = (tmp_path / "page.html").read_text()
    assert "<tr class='straggler'><td>rank 2</td>" in page and page.count("<tr class='straggler'>") == 1
    assert "rank 2 (host " in page and ") is the straggler: the other 3 ranks waited on average" in page


def test_the_live_report_shows_the_same_section(straggler_dumps):
    # The live report renders the ranks' snapshots (the dump format, windows included) through the same function.
    snaps = {r: json.loads((straggler_dumps / f"rank{r}.json").read_text()) for r in range(WORLD)}
    ranks = [RankLive(r, True, "computing", "computing", snapshot=snaps[r]) for r in range(WORLD)]
    rep = LiveReport("127.0.0.1:1", WORLD, time.time_ns(), 0.1, 5.0, ranks, list(range(WORLD)), [], [])
    assert '\nStragglers:\n[live] straggler on group "default_pg": rank 2 ' in live_text(rep), live_text(rep)
    assert rep.to_json()["stragglers"][0]["stragglers"][0]["rank"] == 2


def test_a_balanced_run_names_nobody(balanced_dumps):
    out = _diagnose(balanced_dumps)
    assert out.returncode == 0 and "Stragglers" not in out.stdout, out.stdout
    [g] = json.loads(_diagnose(balanced_dumps, "--json").stdout)["stragglers"]
    # Windows of 4 collectives last about 40 ms here: under the 0.1 s the rule compares, so windows of 32.
    assert g["stragglers"] == [] and g["collectives"] in (32, STEPS), g
