"""The post-mortem outputs of ``python -m torch_ext.diagnose``: Flight Recorder files, Perfetto trace, HTML page.

Every scenario is a real multi-process run on gloo (through ``harness.run_ranks``)
whose dumps are exported (by diagnose's ``main()``, in this process: the command
line itself runs in test_hang_diagnostics.py) and read back by the tools people
already use:

- ``--fr``: PyTorch's own analyzer (``torchfrtrace``, run here as
  ``python -m torch.distributed.flight_recorder.fr_trace``, the console
  script's entry point, from the installed torch) must read the files without
  error and blame the same rank at the same seq as our analysis does;
- ``--trace``: a Chrome Trace Event / Perfetto JSON with one lane per rank;
- ``--html``: rendered by a real headless Chromium, which must draw the stuck op
  and the culprit (skipped only where no Chromium is installed; CI installs it).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib

import pytest
import torch
import torch.distributed as dist

import torch_ext
from harness import ROOT, assert_all_ok, report, run_ranks, run_script
from torch_ext.diagnose import culprits
from torch_ext.diagnose.__main__ import main as diagnose_main

FAST = {"TORCH_EXT_WARN_AFTER": "1", "TORCH_EXT_INTERVAL": "0.1"}
PREFIX = "torch_ext_fr_rank_"


def _diagnose(dump_dir, *args: str) -> subprocess.CompletedProcess:
    """``python -m torch_ext.diagnose DUMP_DIR ARGS``, run in this process (its main(), output captured)."""
    argv = [str(dump_dir), *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = diagnose_main(argv)
    return subprocess.CompletedProcess(argv, rc, out.getvalue(), err.getvalue())


def _verdict(dump_dir) -> dict:
    out = _diagnose(dump_dir, "--json")
    assert out.returncode == 0, out.stderr
    groups = json.loads(out.stdout)["groups"]
    assert len(groups) == 1, groups
    return groups[0]


def _torchfrtrace(fr_dir, *args: str) -> subprocess.CompletedProcess:
    """torch's Flight Recorder analyzer, from the installed torch (what the `torchfrtrace` script runs)."""
    return run_script(["-m", "torch.distributed.flight_recorder.fr_trace", str(fr_dir), "-p", PREFIX, *args], ROOT, 120)


def _export(dump_dir, fr_dir) -> list[dict]:
    out = _diagnose(dump_dir, "--fr", fr_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"torchfrtrace {fr_dir} -p {PREFIX}" in out.stdout, out.stdout
    dumps = []
    for name in sorted(os.listdir(fr_dir)):
        with open(os.path.join(fr_dir, name), "rb") as f:
            dumps.append(pickle.load(f))
    return dumps


def _torch_blames(text: str) -> tuple[set[int], str | None]:
    """(culprit ranks, sequence number) from torch's 'has errors' report."""
    seq = re.search(r"Collective sequence number: (\d+) has errors", text)
    return {int(r) for r in re.findall(r"Culprit rank (\d+);", text)}, seq.group(1) if seq else None


# --- scenarios ---------------------------------------------------------------

def _dump_of(dump_dir: str, rank: int, until=lambda d: True, deadline_s: float = 30.0) -> dict:
    """Rank ``rank``'s dump once it exists and ``until`` holds for it (dumps are renamed into place whole)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            with open(os.path.join(dump_dir, f"rank{rank}.json")) as f:
                data = json.load(f)
            if until(data):
                return data
        except FileNotFoundError:
            pass
        if time.monotonic() > end:
            raise TimeoutError(f"rank{rank}.json in {dump_dir} not as expected after {deadline_s} s")
        time.sleep(0.02)


def _slow_validation(dump_dir: str, world: int) -> None:
    # Stands for a long rank-local validation. It lasts until the others' hang
    # report is out (every rank's dump written at warn_after), not for a guessed
    # time: the fault is that this rank is late, the dumps are the sync.
    # Polled here, not in a helper: the report shows this function atop rank 2's stack.
    end = time.monotonic() + 30.0
    while not all(os.path.exists(os.path.join(dump_dir, f"rank{r}.json")) for r in range(world)):
        if time.monotonic() > end:
            raise TimeoutError(f"no hang report's dumps in {dump_dir} after 30 s")
        time.sleep(0.02)


def _sleepy(rank: int, world: int, dump_dir: str) -> dict:
    dist.all_reduce(torch.ones(1))  # #1 completes everywhere
    if rank == world - 1:
        _slow_validation(dump_dir, world)
    dist.all_reduce(torch.ones(8))  # #2 waits for the last rank
    dist.all_reduce(torch.ones(2))  # #3: the job goes on
    # This rank's dump says the hang resolved within a tick or so (0.1 s), while the group is still up.
    return _dump_of(dump_dir, rank, lambda d: d["state"] == "recovered", deadline_s=10.0)


@pytest.fixture(scope="module")
def hang_run(tmp_path_factory):
    """A 3-rank job whose rank 2 is late for collective #2 (a report after 1 s), then recovers and ends cleanly."""
    path = tmp_path_factory.mktemp("hang")
    seen = assert_all_ok(run_ranks(_sleepy, 3, str(path), env=dict(FAST, TORCH_EXT_DUMP_DIR=str(path)), timeout=60))
    assert sorted(os.listdir(path)) == ["rank0.json", "rank1.json", "rank2.json"]
    return path, seen


@pytest.fixture(scope="module")
def hang_dumps(hang_run):
    """The dumps of hang_run."""
    return hang_run[0]


def _mismatched_shapes(rank: int, world: int, dump_dir: str) -> str:
    dist.all_reduce(torch.ones(4))  # #1
    stats = torch.ones(96 if rank == 1 else 128)
    try:
        dist.all_reduce(stats)  # #2: rank 1 has fewer features
    except torch_ext.CollectiveMismatchError as e:
        torch_ext.dump(dump_dir)  # what a user's except-handler does: keep the evidence
        return str(e)
    return "no error"


def _killed(rank: int, world: int) -> str:
    dist.all_reduce(torch.ones(1))
    if rank == world - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(torch.ones(3))
    except torch_ext.CollectiveFailureError as e:
        return str(e)
    return "no error"


def _both_receive(rank: int, world: int) -> str:
    dist.all_reduce(torch.ones(2))  # #1
    dist.all_reduce(torch.ones(2))  # #2
    buf = torch.zeros(4)
    try:
        dist.recv(buf, src=1 - rank)  # both wait for the other to send first: a pipeline deadlock
    except (torch_ext.CollectiveMismatchError, torch_ext.CollectiveTimeoutError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


# --- Flight Recorder export read by torch's analyzer -------------------------

@pytest.mark.xdist_group("hang_dumps")  # pytest -n: one worker, one hang_dumps run
def test_fr_export_of_a_hang_names_the_missing_rank_and_seq_in_torchfrtrace(hang_dumps, tmp_path):
    ours = _verdict(hang_dumps)
    assert ours["kind"] == "hang" and ours["seq"] == 2 and ours["not_arrived"] == [2], ours

    fr = tmp_path / "fr"
    dumps = _export(hang_dumps, fr)
    assert sorted(os.listdir(fr)) == [f"{PREFIX}{r}" for r in range(3)]
    for d in dumps:
        assert d["version"] == "2.10"
        assert d["pg_config"]["0"]["ranks"] == "[0, 1, 2]" and d["pg_config"]["0"]["desc"] == "default_pg"
        assert [e["record_id"] for e in d["entries"]] == list(range(len(d["entries"])))
        assert all(e["profiling_name"].startswith("gloo:") for e in d["entries"])
    last = dumps[0]["entries"][-1]
    assert (last["profiling_name"], last["collective_seq_id"], last["state"]) == ("gloo:all_reduce", 2, "scheduled")
    assert last["input_sizes"] == last["output_sizes"] == [[8]] and last["input_dtypes"] == ["Float"]

    out = _torchfrtrace(fr)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Not all ranks joining collective, sequence number: 2" in out.stderr, out.stderr
    assert "missing ranks: {2}" in out.stderr, out.stderr


def test_fr_export_of_a_mismatch_names_the_same_culprit_and_seq_in_torchfrtrace(tmp_path):
    dumps = tmp_path / "dumps"
    results = run_ranks(_mismatched_shapes, 3, str(dumps), env={"TORCH_EXT_CHECK": "strict"}, timeout=60)
    for text in assert_all_ok(results):
        assert "collective #2" in text and "float32[96]" in text, text
    ours = _verdict(dumps)
    assert ours["kind"] == "mismatch" and ours["seq"] == 2, ours
    assert culprits(ours) == {1: "differs: all_reduce(float32[96], SUM)"}

    fr = tmp_path / "fr"
    _export(dumps, fr)
    out = _torchfrtrace(fr)
    assert out.returncode == 0, out.stdout + out.stderr
    blamed, seq = _torch_blames(out.stderr)
    assert seq == "2", out.stderr
    # torch compares every rank with the first file it happens to read: it names
    # rank 1 unless rank 1 was that reference, then the other two.
    reference = re.search(r"input sizes: \[\[(\d+)\]\]", out.stderr).group(1)
    assert blamed == ({1} if reference == "128" else {0, 2}), out.stderr
    assert "SIZE_OR_SYNTAX_MISMATCH" in out.stderr


def _strict_mismatch(rank: int, world: int) -> str:
    dist.all_reduce(torch.ones(4))  # #1
    try:
        dist.all_reduce(torch.ones(96 if rank == 1 else 128))  # #2: rank 1 has fewer features
    except torch_ext.CollectiveMismatchError as e:
        return str(e)
    return "no error"


@pytest.mark.parametrize("mode", ["strict", "verify"])
def test_a_mismatch_writes_every_ranks_dump_by_itself_in_every_mode(tmp_path, mode):
    # The program keeps no evidence of its own: TORCH_EXT_DUMP_DIR alone makes the dumps, in strict
    # (before any data moved) as in verify; diagnose reads the same mismatch from them.
    dumps = tmp_path / "dumps"
    results = run_ranks(_strict_mismatch, 3, env={"TORCH_EXT_CHECK": mode, "TORCH_EXT_DUMP_DIR": str(dumps)},
                        timeout=60)
    for text in assert_all_ok(results):
        assert "collective #2" in text and "float32[96]" in text, text
    assert sorted(p.name for p in dumps.glob("rank*.json")) == ["rank0.json", "rank1.json", "rank2.json"]
    for p in dumps.glob("rank*.json"):
        d = json.loads(p.read_text())
        assert "mismatch" in d["written_at"] and d["state"] == "failed", (p.name, d["written_at"], d["state"])
    ours = _verdict(dumps)
    assert ours["kind"] == "mismatch" and ours["seq"] == 2, ours
    assert culprits(ours) == {1: "differs: all_reduce(float32[96], SUM)"}


def test_fr_export_of_a_killed_rank_names_it_in_torchfrtrace(tmp_path):
    dumps = tmp_path / "dumps"
    results = run_ranks(_killed, 3, env=dict(FAST, TORCH_EXT_DUMP_DIR=str(dumps)), timeout=60)
    assert results[2].exitcode == -signal.SIGKILL, report(results)
    assert all(r.ok for r in results[:2]), report(results)
    ours = _verdict(dumps)
    assert ours["gone"] == [2] and ours["seq"] == 2, ours

    fr = tmp_path / "fr"
    out = _diagnose(dumps, "--fr", fr)
    assert out.returncode == 0 and "--allow-incomplete-ranks (no dump from rank(s) 2)" in out.stdout, out.stdout
    # torch's analyzer refuses a missing rank unless told, naming it either way.
    out = _torchfrtrace(fr)
    assert out.returncode != 0 and "Missing dump files from ranks {2}" in out.stderr, out.stderr
    out = _torchfrtrace(fr, "--allow-incomplete-ranks")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "missed FR dumps from ranks ({2})" in out.stderr, out.stderr

    # The trace and the page still give the dead rank its lane, as the culprit.
    assert _diagnose(dumps, "--trace", tmp_path / "t.json", "--html", tmp_path / "p.html").returncode == 0
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert "rank 2 (no dump)" in [e["args"]["name"] for e in events if e["name"] == "process_name"]
    assert "culprit: rank 2 is gone" in [e["name"] for e in events if e["ph"] == "i"]
    assert '"culprits":{"2":"is gone"}' in (tmp_path / "p.html").read_text()


def test_fr_export_of_an_unpaired_recv_is_named_by_torchfrtrace(tmp_path):
    dumps = tmp_path / "dumps"
    env = dict(FAST, TORCH_EXT_DUMP_DIR=str(dumps), TORCH_EXT_ABORT_AFTER="4")
    for text in assert_all_ok(run_ranks(_both_receive, 2, env=env, timeout=60)):
        assert "do not pair" in text, text
    ours = _verdict(dumps)
    assert ours["kind"] == "mismatch" and "every rank waits in a point-to-point op" in ours["text"], ours
    assert set(culprits(ours)) == {0, 1}

    fr = tmp_path / "fr"
    exported = _export(dumps, fr)
    recvs = {d["torch_ext"]["rank"]: d["entries"][-1] for d in exported}
    for rank, e in recvs.items():
        assert e["profiling_name"] == f"gloo:recv {rank}<-{1 - rank}", e
        assert (e["collective_seq_id"], e["p2p_seq_id"], e["is_p2p"]) == (2, 1, True), e
    out = _torchfrtrace(fr)
    assert out.returncode == 0, out.stdout + out.stderr
    blamed, seq = _torch_blames(out.stderr)
    assert seq == "2" and len(blamed) == 1 and blamed <= {0, 1}, out.stderr  # the rank it did not start from
    record = int(re.search(r"internal record id: (\d+)", out.stderr).group(1))
    assert record == recvs[0]["record_id"] == recvs[1]["record_id"], out.stderr


def _p2p_right_after_a_collective(rank: int, world: int) -> None:
    dist.all_reduce(torch.ones(2))  # #1
    t = torch.ones(3)
    if rank == 0:
        dist.send(t, dst=1)
    else:
        dist.recv(t, src=0)
    torch_ext.dump()


def test_torchfrtrace_limit_a_p2p_op_right_after_collective_1_is_taken_for_a_coalesced_group(tmp_path):
    # docs/diagnostics.md: torch's analyzer groups entries whose seq ids coincide
    # (collective #1, then the group's first p2p op, p2p #1) as one coalesced op
    # and then fails on it. Our files are right; this test notices when torch
    # stops failing, so the docs can drop the caveat.
    dumps = tmp_path / "dumps"
    assert_all_ok(run_ranks(_p2p_right_after_a_collective, 2, env={"TORCH_EXT_DUMP_DIR": str(dumps)}, timeout=60))
    assert _verdict(dumps)["kind"] == "none"
    fr = tmp_path / "fr"
    _export(dumps, fr)
    out = _torchfrtrace(fr)
    assert out.returncode != 0 and "AssertionError" in out.stderr, out.stdout + out.stderr


def _p2p_in_a_group_of_three(rank: int, world: int) -> None:
    dist.all_reduce(torch.ones(2))  # #1
    dist.all_reduce(torch.ones(2))  # #2 (no p2p right after #1: the limit above)
    t = torch.ones(3)
    if rank == 0:
        dist.send(t, dst=1)
    elif rank == 1:
        dist.recv(t, src=0)
    dist.all_reduce(torch.ones(2))  # #3
    torch_ext.dump()


def test_torchfrtrace_limit_a_healthy_send_recv_in_a_group_of_three_is_checked_against_every_rank(tmp_path):
    # docs/diagnostics.md: outside batch_isend_irecv, torch's analyzer expects every
    # rank of the group to take part in a send/recv, and blames the third rank.
    dumps = tmp_path / "dumps"
    assert_all_ok(run_ranks(_p2p_in_a_group_of_three, 3, env={"TORCH_EXT_DUMP_DIR": str(dumps)}, timeout=60))
    assert _verdict(dumps)["kind"] == "none"
    fr = tmp_path / "fr"
    _export(dumps, fr)
    out = _torchfrtrace(fr)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Not all ranks joining collective, sequence number: 2" in out.stderr, out.stderr
    assert re.search(r"collective: gloo:(send 0->1|recv 1<-0)\nmissing ranks: \{2\}", out.stderr), out.stderr


def _every_op(rank: int, world: int) -> None:
    g = dist.new_group([0, 1])
    x = torch.arange(4, dtype=torch.float32) + rank
    dist.all_reduce(x)
    dist.broadcast(x, src=1)
    dist.reduce(x, dst=0)
    out = [torch.empty(4) for _ in range(world)]
    dist.all_gather(out, x)
    dist.all_gather_into_tensor(torch.empty(4 * world), x)
    dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * world))
    dist.all_to_all_single(torch.empty(4), torch.ones(4))
    dist.gather(x, [torch.empty(4) for _ in range(world)] if rank == 0 else None, dst=0)
    dist.scatter(torch.empty(4), [torch.ones(4)] * world if rank == 1 else None, src=1)
    dist.all_reduce(torch.ones(2, dtype=torch.float64), group=g)
    dist.barrier()
    if rank == 0:
        dist.send(torch.ones(5), dst=1)
    else:
        dist.recv(torch.empty(5), src=0)
    dist.all_reduce(torch.ones(1, dtype=torch.int64), group=g)
    torch_ext.dump()


def test_fr_export_of_a_clean_run_with_every_op_and_two_groups_reads_as_clean(tmp_path):
    dumps = tmp_path / "dumps"
    assert_all_ok(run_ranks(_every_op, 2, env={"TORCH_EXT_DUMP_DIR": str(dumps)}, timeout=60))
    assert {v["kind"] for v in json.loads(_diagnose(dumps, "--json").stdout)["groups"]} == {"none"}
    fr = tmp_path / "fr"
    d0 = _export(dumps, fr)[0]
    names = [e["profiling_name"] for e in d0["entries"]]
    assert names == ["gloo:all_reduce", "gloo:broadcast", "gloo:reduce", "gloo:all_gather", "gloo:_all_gather_base",
                     "gloo:_reduce_scatter_base", "gloo:all_to_all", "gloo:gather", "gloo:scatter", "gloo:all_reduce",
                     "gloo:barrier", "gloo:send 0->1", "gloo:all_reduce"], names
    # One record id counter for the process, across both groups.
    assert [e["record_id"] for e in d0["entries"]] == list(range(13))
    by = dict(zip(names, d0["entries"]))
    assert by["gloo:all_gather"]["output_sizes"] == [[2, 4]]
    assert by["gloo:_all_gather_base"]["output_sizes"] == [[8]]
    assert by["gloo:_reduce_scatter_base"]["input_sizes"] == [[4]]
    assert by["gloo:gather"]["output_sizes"] == [[2, 4]]  # rank 0 is the root
    assert by["gloo:send 0->1"]["collective_seq_id"] == 10 and by["gloo:send 0->1"]["p2p_seq_id"] == 1
    assert set(d0["pg_config"]) == {"0", "1"} and d0["pg_config"]["1"]["ranks"] == "[0, 1]"
    out = _torchfrtrace(fr)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "has errors" not in out.stderr and "Not all ranks" not in out.stderr, out.stderr


@pytest.mark.xdist_group("hang_dumps")  # pytest -n: one worker, one hang_dumps run
def test_diagnose_outputs_refuse_bad_input_naming_the_fix(hang_dumps, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = _diagnose(empty, "--fr", tmp_path / "fr")
    assert out.returncode == 1 and "no torch_ext dump in" in out.stderr and "TORCH_EXT_DUMP_DIR" in out.stderr

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    out = _diagnose(hang_dumps, "--fr", busy)
    assert out.returncode == 1 and "holds other files (notes.txt)" in out.stderr and "empty or new folder" in out.stderr
    assert (busy / "notes.txt").read_text() == "mine"

    out = _diagnose(hang_dumps, "--fr", "/proc/torch_ext_fr")
    assert out.returncode == 1 and "cannot create '/proc/torch_ext_fr'" in out.stderr, out.stderr
    out = _diagnose(hang_dumps, "--trace", "/proc/torch_ext.json")
    assert out.returncode == 1 and "cannot write --trace file" in out.stderr, out.stderr
    out = _diagnose(hang_dumps, "--fr", tmp_path / "fr", "--fr-prefix", "rank1")
    assert out.returncode == 1 and "not end in a digit" in out.stderr, out.stderr

    # An earlier export in the folder is replaced, not mixed in.
    again = tmp_path / "again"
    again.mkdir()
    (again / f"{PREFIX}7").write_bytes(b"old")
    _export(hang_dumps, again)
    assert sorted(os.listdir(again)) == [f"{PREFIX}{r}" for r in range(3)]


# --- Perfetto / Chrome trace ----------------------------------------------------

@pytest.mark.xdist_group("hang_dumps")  # pytest -n: one worker, one hang_dumps run
def test_trace_has_one_lane_per_rank_one_event_per_entry_and_the_report(hang_dumps, tmp_path):
    path = tmp_path / "trace.json"
    out = _diagnose(hang_dumps, "--trace", path)
    assert out.returncode == 0 and "ui.perfetto.dev" in out.stdout, out.stderr
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(n.split(" (")[0] for n in names.values()) == ["rank 0", "rank 1", "rank 2"]
    dumps = {r: json.loads((hang_dumps / f"rank{r}.json").read_text()) for r in range(3)}
    for r, d in dumps.items():
        assert names[d["pid"]].startswith(f"rank {r} (pid {d['pid']}")  # the OS pid, as in a profiler trace
        bars = [e for e in events if e["ph"] == "X" and e["pid"] == d["pid"]]
        entries = d["groups"][0]["entries"]
        assert len(bars) == len(entries)
        assert [b["args"]["seq"] for b in bars] == [e["collective_seq_id"] for e in entries]
        assert all(b["name"] == "all_reduce" and b["dur"] > 0 for b in bars)
        assert bars[0]["args"]["shapes"] == [[1]] and bars[0]["args"]["dtypes"] == ["float32"]
        assert "in _sleepy" in bars[0]["args"]["call site"]
    pending = [e for e in events if e["ph"] == "X" and e["args"]["seq"] == 2]
    assert len(pending) == 2 and all(e["args"]["state"].startswith("scheduled") for e in pending)
    report_events = [e for e in events if e["ph"] == "i" and e.get("s") == "g"]
    assert len(report_events) == 1 and report_events[0]["name"].startswith("hang: collective #2 all_reduce")
    culprit = [e for e in events if e["ph"] == "i" and e["name"].startswith("culprit:")]
    assert len(culprit) == 1 and culprit[0]["pid"] == dumps[2]["pid"], culprit
    assert any("_slow_validation" in f for f in culprit[0]["args"]["main thread"])
    assert trace["displayTimeUnit"] == "ms" and trace["baseTimeNanoseconds"] > 0


# --- HTML page, in a real headless browser --------------------------------------

def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium installed (scripts/setup.sh installs Debian's chromium; CI runs this test)")


def _browse(page, tmp_path, *, screenshot=None, size=(1280, 1000)) -> tuple[str, str]:
    """(DOM after the page's script ran, browser log) from headless Chromium."""
    args = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--window-size={size[0]},{size[1]}",
            "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000"]
    if screenshot:
        args.append(f"--screenshot={screenshot}")
    else:
        args.append("--dump-dom")
    out = subprocess.run([*args, f"file://{page}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout, out.stderr


def _png_rgb(path):
    """Decodes an 8-bit RGB(A) PNG (what Chromium writes) into rows of RGB tuples' numpy array."""
    import numpy as np

    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
    assert depth == 8 and ctype in (2, 6), (depth, ctype)
    bpp = 3 if ctype == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, 1 + w * bpp)
    img = np.zeros((h, w * bpp), dtype=np.int32)
    prev = np.zeros(w * bpp, dtype=np.int32)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) & 255
        else:  # Sub, Average, Paeth: left-to-right, one pixel at a time
            cur = line.copy()
            for x in range(w * bpp):
                a = cur[x - bpp] if x >= bpp else 0
                b = prev[x]
                if f == 1:
                    cur[x] = (cur[x] + a) & 255
                elif f == 3:
                    cur[x] = (cur[x] + ((a + b) >> 1)) & 255
                else:
                    c = prev[x - bpp] if x >= bpp else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    cur[x] = (cur[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        img[y], prev = cur, cur
    return img.reshape(h, w, bpp)[:, :, :3]


@pytest.mark.xdist_group("hang_dumps")  # pytest -n: one worker, one hang_dumps run
def test_html_page_renders_the_stuck_op_and_the_culprit_in_headless_chromium(hang_dumps, tmp_path):
    page = tmp_path / "report.html"
    out = _diagnose(hang_dumps, "--html", page)
    assert out.returncode == 0, out.stderr
    dom, log = _browse(page, tmp_path)
    assert "Uncaught" not in log, log[-4000:]
    assert 'data-rendered="1"' in dom  # the script ran to the end
    # The stuck op: a pending bar outlined on ranks 0 and 1, labelled with seq and op.
    stuck = re.findall(r'<rect class="bar pending stuck"[^>]*data-seq="2"[^>]*><title>([^<]*)</title>', dom)
    assert len(stuck) == 2, dom[:3000]
    assert all("#2 all_reduce(float32[8], SUM)" in t and "in _sleepy" in t and "shapes: [[8]]" in t for t in stuck)
    assert re.search(r">#2 all_reduce  \([\d.]+ s\)</text>", dom)  # with how long it has waited
    # The culprit: rank 2's lane says so, shows "not issued" in the stuck column and its main thread.
    assert "rank 2 has not issued #2 (last issued #1)" in dom
    assert ">culprit: has not arrived</text>" in dom
    assert ">main thread:</text>" in dom and re.search(r">test_post_mortem\.py:\d+ in _slow_validation</text>", dom)
    assert "completed" in dom and "pending (scheduled)" in dom  # the legend

    shot = tmp_path / "report.png"
    _browse(page, tmp_path, screenshot=shot, size=(1100, 700))
    rgb = _png_rgb(shot)
    stuck_red = ((rgb[:, :, 0] > 190) & (rgb[:, :, 1] < 40) & (rgb[:, :, 2] < 40)).sum()
    pending_amber = ((abs(rgb[:, :, 0] - 0xfb) < 8) & (abs(rgb[:, :, 1] - 0xbc) < 8) & (rgb[:, :, 2] < 30)).sum()
    assert stuck_red > 200 and pending_amber > 500, (stuck_red, pending_amber)


def _synthetic_dumps(path, world: int, entries: int) -> None:
    """A job whose last rank never issued the last collective, from a real dump's format."""
    base = time.time_ns() - 10**10
    for r in range(world):
        last = entries if r < world - 1 else entries - 1
        ents = []
        for s in range(1, last + 1):
            done = s < entries
            ents.append({
                "record_id": s, "pg_id": "0", "process_group": ["0", "default_pg"], "collective_seq_id": s,
                "p2p_seq_id": 0, "op_id": s, "profiling_name": "guard:all_reduce", "time_created_ns": base + s * 10**6,
                "input_sizes": [[1024]], "input_dtypes": ["float32"], "output_sizes": [], "output_dtypes": [],
                "state": "completed" if done else "scheduled", "time_discovered_started_ns": None,
                "time_discovered_completed_ns": base + s * 10**6 + 5 * 10**5 if done else None,
                "duration_ms": 0.5 if done else None, "timeout_ms": 600000, "is_p2p": False, "retired": done,
                "frames": [{"name": "train_step", "filename": "/job/train.py", "line": 120}], "op": "all_reduce",
                "device": "cpu", "fingerprint": "all_reduce(float32[1024], SUM)", "hash": "00000000000000aa",
                "rolling_hash": f"{s:016x}", "pair_hash": "0" * 16, "split_send": "0" * 16, "split_recv": "0" * 16,
                "peer": -1, "tag": 0, "reduce_op": "SUM"})
        dump = {"version": "torch_ext-1", "rank": r, "pid": 1000 + r, "hostname": "node", "time_ns": base + 2 * 10**10,
                "incident": "hang", "config": "inner=cpu:gloo check=async",
                "main_thread": {"available": True, "note": "", "frames": [
                    {"name": "slow_eval", "filename": "/job/eval.py", "line": 7},
                    {"name": "main", "filename": "/job/train.py", "line": 200}]},
                "pg_config": {}, "groups": [{
                    "name": "0", "desc": "default_pg", "rank": r, "size": world, "ranks": list(range(world)),
                    "last_seq": last, "last_completed_seq": min(last, entries - 1), "last_completed_ns": base,
                    "rolling_hash": f"{last:016x}", "timeout_ms": 600000, "entries": ents}]}
        (path / f"rank{r}.json").write_text(json.dumps(dump))


def test_html_page_stays_readable_at_1024_entries_by_32_ranks(tmp_path):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    _synthetic_dumps(dumps, world=32, entries=1024)
    page = tmp_path / "big.html"
    out = _diagnose(dumps, "--html", page)
    assert out.returncode == 0, out.stderr
    assert "rank 31 has not arrived" in out.stdout
    assert page.stat().st_size < 3_000_000  # entries share one table of distinct ops
    start = time.monotonic()
    dom, log = _browse(page, tmp_path)
    assert time.monotonic() - start < 60
    assert "Uncaught" not in log, log[-4000:]
    # A window of columns around the stuck op, not 32,768 bars.
    bars = re.findall(r'<rect class="bar [^"]*"', dom)
    assert 8 * 32 <= len(bars) <= 24 * 32, len(bars)
    assert len(re.findall(r'class="bar pending stuck"[^>]*data-seq="1024"', dom)) == 31
    assert "rank 31 has not issued #1024 (last issued #1023)" in dom
    assert ">main thread:</text>" in dom and ">eval.py:7 in slow_eval</text>" in dom
    assert re.search(r"columns 10\d\d-1024 of 1024", dom)  # the stuck op is the last column


@pytest.mark.xdist_group("hang_dumps")  # pytest -n: one worker, one hang_dumps run
def test_html_page_folds_library_frames_in_the_culprits_stack_as_the_text_report_does(hang_dumps, tmp_path):
    page = tmp_path / "report.html"
    out = _diagnose(hang_dumps, "--html", page)
    assert out.returncode == 0, out.stderr
    # The text report's stack of the culprit (rank 2), as it prints it.
    text = re.search(r"rank 2 has not arrived:.*main thread now at\n +(.*)", out.stdout)
    assert text, out.stdout
    shown = text.group(1).split(" [")[0].split(" <- ")
    model = json.loads(re.search(r"<script type='application/json' id='model'>(.*?)</script>",
                                 page.read_text(), re.S).group(1).replace("<\\/", "</"))
    lane = next(lane for lane in model["groups"][0]["lanes"] if lane["rank"] == 2)
    assert lane["stack"] == shown, (lane["stack"], shown)
    # Torch's own frames (and torch_ext's, the standard library's) are folded, never listed one by one.
    assert any(re.fullmatch(r"\.\.\. \d+ .* frames? \.\.\.", s) for s in lane["stack"]), lane["stack"]
    assert not any(s.startswith(("torch .../", "torch_ext .../", "stdlib .../")) for s in lane["stack"][1:]), lane
    assert re.fullmatch(r"test_post_mortem\.py:\d+ in _slow_validation", lane["stack"][0]), lane["stack"]


@pytest.mark.xdist_group("hang_dumps")  # pytest -n: one worker, one hang_dumps run
def test_diagnose_says_when_the_dumps_were_written_and_how_old_they_are(hang_dumps, tmp_path):
    # Fresh dumps: written seconds ago, at warn_after.
    out = _diagnose(hang_dumps)
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert re.fullmatch(r"dumps written \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(\d+ s ago\) at warn_after", first), first
    # The same dumps three hours later (their times moved back): the age says so, in text and JSON.
    old = tmp_path / "old"
    old.mkdir()
    for name in os.listdir(hang_dumps):
        with open(hang_dumps / name) as f:
            data = json.load(f)
        data["time_ns"] -= 3 * 3600 * 10**9 + 5 * 60 * 10**9
        with open(old / name, "w") as f:
            json.dump(data, f)
    text = _diagnose(old).stdout.splitlines()[0]
    assert "(3 h 5 min ago)" in text or "(3 h 6 min ago)" in text, text
    got = json.loads(_diagnose(old, "--json").stdout)
    assert 3 * 3600 + 5 * 60 <= got["age_s"] < 3 * 3600 + 7 * 60, got["age_s"]
    # Dumps of an older torch_ext carry no state: the first line says what dumps cannot know.
    for name in os.listdir(old):
        data = json.loads((old / name).read_text())
        for key in ("written_at", "state", "state_ns", "recovered_ns", "awaited"):
            del data[key]
        (old / name).write_text(json.dumps(data))
    text = _diagnose(old).stdout.splitlines()[0]
    assert text.endswith("ago): they show the job at that moment; a job that recovered or ended since then is not "
                         "in them"), text


# --- dump states: a job that recovers marks its dumps ----------------------------

@pytest.mark.xdist_group("hang_dumps")  # pytest -n: one worker, one hang_dumps run
def test_dumps_of_a_job_that_recovered_and_ended_say_so_and_diagnose_does_not_read_like_a_live_hang(hang_run):
    path, seen = hang_run
    # While the job still ran (after #3), every rank's dump said recovered, with the time it got past #2.
    for r, d in enumerate(seen):
        assert (d["written_at"], d["state"]) == ("warn_after", "recovered"), d
        # group name, as in "groups"
        assert d["awaited"] == [{"group": "0", "collective_seq_id": 2, "record_id": 0}], d["awaited"]
        assert d["time_ns"] < d["recovered_ns"] == d["state_ns"], d
    # destroy_process_group (the harness's clean end) then marked them finished, keeping the recovery time.
    final = {r: json.loads((path / f"rank{r}.json").read_text()) for r in range(3)}
    for r, d in final.items():
        assert d["state"] == "finished" and d["recovered_ns"] == seen[r]["recovered_ns"] < d["state_ns"], d
        assert d["groups"] == seen[r]["groups"]  # the ledgers still show the moment of the report
    out = _diagnose(path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].endswith(" at warn_after"), lines[0]
    assert re.fullmatch(r"state: finished: the job recovered \(every rank got past what it waited in by "
                        r"\d\d:\d\d:\d\d UTC, \d+\.\d s after the dumps\) and ended cleanly by \d\d:\d\d:\d\d UTC, "
                        r"\d+\.\d s after the dumps; no hang now\. Below: the moment of the dumps", lines[1]), lines[1]
    # The verdict is still there, headed as history.
    at = lines.index("when the dumps were written (resolved since):")
    assert lines[at + 1].startswith('collective #2 all_reduce(float32[8], SUM) on group "default_pg" has waited')
    got = json.loads(_diagnose(path, "--json").stdout)
    assert got["state"] == "finished" and got["written_at"] == ["warn_after"], got
    assert got["recovered_ns"] == max(d["recovered_ns"] for d in final.values())
    assert {r: s["state"] for r, s in got["dump_states"].items()} == {"0": "finished", "1": "finished", "2": "finished"}


def _never_arrives(rank: int, world: int, dump_dir: str, seen_dir: str) -> str:
    dist.all_reduce(torch.ones(1))  # #1
    if rank == world - 1:
        # Never joins #2: it keeps the dump dir as it was during the hang (every
        # rank's dump at warn_after), then waits until the group failed.
        dumps = [_dump_of(dump_dir, r) for r in range(world)]
        os.makedirs(seen_dir)
        for r, d in enumerate(dumps):
            with open(os.path.join(seen_dir, f"rank{r}.json"), "w") as f:
                json.dump(d, f)
        for r in range(world):
            _dump_of(dump_dir, r, lambda d: d["state"] == "failed")
        return "left"
    try:
        dist.all_reduce(torch.ones(8))  # #2: the last rank never comes
    except torch_ext.CollectiveTimeoutError:
        return "timeout"
    return "no error"


def test_dumps_of_a_real_hang_still_read_as_a_hang(tmp_path):
    dumps, during = tmp_path / "dumps", tmp_path / "during"
    env = dict(FAST, TORCH_EXT_DUMP_DIR=str(dumps), TORCH_EXT_ABORT_AFTER="3")
    results = run_ranks(_never_arrives, 2, str(dumps), str(during), env=env, timeout=60)
    assert [r.value for r in results] == ["timeout", "left"], report(results)
    # During the hang: every dump waiting, written at warn_after; diagnose says so and names the late rank.
    for r in range(2):
        d = json.loads((during / f"rank{r}.json").read_text())
        assert (d["written_at"], d["state"], d["recovered_ns"]) == ("warn_after", "waiting", 0), d
    out = _diagnose(during)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1].startswith("state: waiting on rank(s) 0,1: not past the operation"), out.stdout
    assert "rank 1 has not arrived" in out.stdout and "resolved since" not in out.stdout, out.stdout
    assert json.loads(_diagnose(during, "--json").stdout)["state"] == "waiting"
    # After abort_after: rewritten by the abort's dumps (rank 0's then by the failure of the aborted
    # collective, "failure", when that incident comes before it leaves), failed.
    got = json.loads(_diagnose(dumps, "--json").stdout)
    assert got["state"] == "failed" and "abort_after" in got["written_at"], got
    assert set(got["written_at"]) <= {"abort_after", "failure"}, got
    out = _diagnose(dumps)
    assert "state: failed on rank(s) 0,1" in out.stdout and "rank 1 has not arrived" in out.stdout, out.stdout
    assert "no hang now" not in out.stdout


def test_diagnose_help_shows_the_live_form_and_its_options():
    """`torch-ext-diagnose --help` shows both commands: the dumps' and `live`'s, with their options (issue 69)."""
    proc = subprocess.run([sys.executable, "-m", "torch_ext.diagnose", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    usage = proc.stdout.split("\n\n")[0]
    for part in ("DUMP_DIR", "--repro OUT.py", "--fr-prefix PREFIX", "torch-ext-diagnose live", "--all-ranks",
                 "--watch S", "HOST:PORT"):
        assert part in usage, usage
