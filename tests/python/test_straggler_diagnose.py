"""Stragglers in dumps: the rank the others wait for, named by ``diagnose`` from each rank's own waits.

The pure function (torch_ext/diagnose/stragglers.py) on hand-made snapshots,
then real 4-rank runs on gloo with the guard: one where rank 2 sleeps 30 ms
before each of 40 all_reduces (named, with about 30 ms per collective, in the
text, ``--json``, ``--html``, the ``--trace`` counter tracks and the live
report's rendering) and a balanced one (nobody named, no section).
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
from torch_ext.diagnose.stragglers import stragglers_from_snapshots

STEPS, SLOW_S, WORLD = 40, 0.030, 4


# --- the pure function, on hand-made snapshots ------------------------------------

def _entry(seq: int, issued_ns: int, wait_ms: float, line: int = 52, **fields) -> dict:
    return {"collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": False, "state": "completed",
            "time_created_ns": issued_ns, "time_discovered_completed_ns": issued_ns + int(wait_ms * 1e6),
            "frames": [{"name": "train_step", "filename": "/home/u/train.py", "line": line}], **fields}


def _snap(rank: int, waits_ms: list[float], lines: list[int] | None = None, first_seq: int = 1) -> dict:
    """Rank ``rank``'s snapshot: one group, a collective every 50 ms of its own clock (offset per rank:
    no two ranks' clocks agree)."""
    clock = 1_700_000_000_000_000_000 + rank * 7_777_777_777
    entries = [_entry(first_seq + i, clock + i * 50_000_000, w, (lines or [52] * len(waits_ms))[i])
               for i, w in enumerate(waits_ms)]
    return {"rank": rank, "groups": [{"name": "0", "desc": "default_pg", "rank": rank, "size": 4,
                                      "ranks": [0, 1, 2, 3], "entries": entries}]}


def test_the_rank_that_waits_least_in_most_collectives_is_the_straggler():
    n = 20
    snaps = [_snap(r, [1.0 if r == 2 else 11.0 + r * 0.1] * n) for r in range(4)]
    [g] = stragglers_from_snapshots(snaps)
    assert (g["group"], g["first_seq"], g["last_seq"], g["collectives"]) == ("default_pg", 1, 20, 20)
    s = g["straggler"]
    assert s["rank"] == 2 and s["site"] == "train.py:52 in train_step", s
    assert s["extra_s_per_collective"] == pytest.approx(0.0101, abs=1e-6)
    assert s["lost_s"] == pytest.approx(0.202, abs=1e-5)
    span = statistics.median([0.961, 0.9611, 0.951, 0.9613])  # first issue to last completion, per rank
    assert s["share"] == pytest.approx(0.202 / span, abs=1e-4)
    assert [r["rank"] for r in g["ranks"]] == [0, 1, 2, 3]
    assert g["ranks"][2]["wait_s"] == pytest.approx(0.020) and g["ranks"][2]["span_s"] == pytest.approx(0.951)
    assert g["ranks"][0]["wait_share"] == pytest.approx(0.22 / 0.961, abs=1e-3)


def test_the_site_is_where_the_others_waited_longest_for_it():
    lines = [52, 60] * 6
    slow = {52: 2.0, 60: 30.0}  # the others wait 30 ms at line 60, 2 ms at line 52
    snaps = [_snap(r, [0.5 if r == 1 else slow[line] for line in lines], lines) for r in range(3)]
    assert stragglers_from_snapshots(snaps)[0]["straggler"]["site"] == "train.py:60 in train_step"


def test_one_late_arrival_does_not_make_a_straggler():
    # Balanced, except that rank 3 arrived 500 ms late once: its total is the least by far, but only once.
    snaps = []
    for r in range(4):
        waits = [5.0 + ((r + i) % 4) * 0.5 for i in range(16)]
        waits[7] = 0.5 if r == 3 else 500.0
        snaps.append(_snap(r, waits))
    [g] = stragglers_from_snapshots(snaps)
    assert min(g["ranks"], key=lambda r: r["wait_s"])["rank"] == 3
    assert g["straggler"] is None


def test_a_small_difference_or_a_short_range_names_nobody():
    # Rank 0 waits least every time, by 1 ms in 50 ms steps: under 5% of the span.
    [g] = stragglers_from_snapshots([_snap(r, [2.0 if r == 0 else 3.0] * 16) for r in range(3)])
    assert g["straggler"] is None and g["collectives"] == 16
    # A clear straggler, but over 7 collectives (a hang's dumps): the waits, no verdict.
    [g] = stragglers_from_snapshots([_snap(r, [1.0 if r == 0 else 30.0] * 7) for r in range(3)])
    assert g["straggler"] is None and g["collectives"] == 7 and len(g["ranks"]) == 3


def test_only_completed_collectives_every_rank_holds_count():
    snaps = [_snap(r, [1.0 if r == 1 else 20.0] * 12, first_seq=1 if r else 3) for r in range(3)]  # rank 0: #3-#14
    p2p = _entry(12, snaps[2]["groups"][0]["entries"][-1]["time_created_ns"] + 1, 999.0, is_p2p=True, p2p_seq_id=1)
    snaps[2]["groups"][0]["entries"].append(p2p)  # a send/recv: not a collective
    last = snaps[1]["groups"][0]["entries"][-1]["time_created_ns"] + 50_000_000
    snaps[1]["groups"][0]["entries"].append(dict(_entry(13, last, 0.0), state="scheduled",
                                                 time_discovered_completed_ns=None))  # #13 pending on rank 1
    snaps[2]["groups"][0]["entries"].append(_entry(13, last, 20.0))
    [g] = stragglers_from_snapshots(snaps)
    assert (g["first_seq"], g["last_seq"], g["collectives"]) == (3, 12, 10)
    assert g["straggler"]["rank"] == 1 and g["straggler"]["extra_s_per_collective"] == pytest.approx(0.019)
    assert stragglers_from_snapshots([]) == []


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
    assert f'\nStragglers:\nrank 2 is the straggler on group "default_pg" over collectives 1-{STEPS}: ' in text, text
    assert "most at test_straggler_diagnose.py:" in text and " in _train\n" in text, text

    js = _diagnose(straggler_dumps, "--json")
    [g] = json.loads(js.stdout)["stragglers"]
    s = g["straggler"]
    assert s is not None and s["rank"] == 2, g
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
    assert "rank 2 is the straggler: the other ranks waited on average" in page


def test_the_live_report_shows_the_same_section(straggler_dumps):
    # The live report renders the ranks' snapshots (the dump format) through the same function.
    snaps = {r: json.loads((straggler_dumps / f"rank{r}.json").read_text()) for r in range(WORLD)}
    ranks = [RankLive(r, True, "computing", "computing", snapshot=snaps[r]) for r in range(WORLD)]
    rep = LiveReport("127.0.0.1:1", WORLD, time.time_ns(), 0.1, 5.0, ranks, list(range(WORLD)), [], [])
    assert '\nStragglers:\n[live] rank 2 is the straggler on group "default_pg"' in live_text(rep), live_text(rep)
    assert rep.to_json()["stragglers"][0]["straggler"]["rank"] == 2


def test_a_balanced_run_names_nobody(balanced_dumps):
    out = _diagnose(balanced_dumps)
    assert out.returncode == 0 and "Stragglers" not in out.stdout, out.stdout
    [g] = json.loads(_diagnose(balanced_dumps, "--json").stdout)["stragglers"]
    assert g["straggler"] is None and g["collectives"] == STEPS, g
