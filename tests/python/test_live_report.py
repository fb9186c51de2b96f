"""Live reports of a running job, asked from outside it (issue 27).

A 4-rank job in which rank 1 sleeps in Python and rank 2 holds the GIL in a C
call (a ctypes.PyDLL call into libc: the GIL stays held), while ranks 0 and 3
wait in an all_reduce for them. `torch-ext-diagnose live HOST:PORT`, run from
another process, must name each rank's state and stack and the ranks everyone
waits for, within its deadline; the job must not notice (same result, no
exception, every rank exits normally). Run with the store in the test process
(like torchrun's agent) and in rank 0's process (plain env://).
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

from harness import ROOT, assert_all_ok, run_ranks, run_script

# No deadline fires while the job is looked at (about 10 s, 30 on a loaded runner): what the report shows
# is live. The replay of its dumps looks at 10 s, not at this warn_after (repro caps it: its ranks compute
# nothing, so the absent ones are as absent then).
ENV = {"TORCH_EXT_WARN_AFTER": "45", "TORCH_EXT_ABORT_AFTER": "240", "TORCH_EXT_INTERVAL": "0.1"}
DEADLINE_S = 5.0

# The deadline is the asking code's, timed in this process: the CLI's own start (importing torch, seconds
# on a loaded 2-core runner) is no part of it. The slack covers the reads after the deadline and a busy CPU.
_SLACK_S = 6.0


def _sigint_as_from_a_shell() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _timed(call) -> tuple[float, BaseException | None]:
    """How long `call` took, and what it raised (None if nothing)."""
    start = time.monotonic()
    try:
        call()
    except Exception as e:  # noqa: BLE001 - handed to the test, which asserts its type
        return time.monotonic() - start, e
    return time.monotonic() - start, None


def _sleep_in_python(release: str) -> None:
    while not os.path.exists(release):
        time.sleep(0.02)  # a rank-local validation, in Python, until the test has looked


def _hold_gil_in_c(fifo: str) -> None:
    libc = ctypes.PyDLL(ctypes.util.find_library("c"), use_errno=True)  # PyDLL: the GIL stays held in the call
    fd = libc.open(fifo.encode(), os.O_RDONLY)  # blocks, GIL held, until the test opens the FIFO to write
    if fd >= 0:
        libc.close(fd)


def _loader(release: str) -> None:
    while not os.path.exists(release):
        time.sleep(0.02)  # a data-loading thread of the application's own


def _job(rank: int, world: int, ctl: str) -> dict:
    dist.all_reduce(torch.ones(1))  # #1 completes everywhere
    if rank == 3:
        loader = threading.Thread(target=_loader, args=(os.path.join(ctl, "release"),), name="data_loader",
                                  daemon=True)
        loader.start()
    with open(os.path.join(ctl, f"ready{rank}"), "w") as f:
        json.dump({"pid": os.getpid(), "port": int(os.environ["MASTER_PORT"])}, f)
    if rank == 1:
        _sleep_in_python(os.path.join(ctl, "release"))
    elif rank == 2:
        _hold_gil_in_c(os.path.join(ctl, "gil"))
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)  # #2: ranks 0 and 3 wait here for ranks 1 and 2
    dist.all_reduce(torch.ones(1))  # #3: the job goes on normally afterwards
    return {"value": t.tolist()}


def _wait(cond, what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def _in_syscall(pid: int, numbers: set[int]) -> bool:
    try:
        with open(f"/proc/{pid}/syscall") as f:
            return int(f.read().split()[0]) in numbers
    except (OSError, ValueError, IndexError):
        return False


def _release(ctl: str) -> None:
    open(os.path.join(ctl, "release"), "w").close()
    end = time.monotonic() + 30
    while True:  # the reader (rank 2) is blocked in open(): a writer's open lets it go
        try:
            os.close(os.open(os.path.join(ctl, "gil"), os.O_WRONLY | os.O_NONBLOCK))
            return
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m torch_ext.diagnose live ARGS`` from the project root (forked warm: harness.run_script)."""
    return run_script(["-m", "torch_ext.diagnose", "live", *args], ROOT, timeout)


@pytest.mark.parametrize("store", ["parent", "rank0"])
def test_live_report_of_a_running_job_from_another_process(tmp_path, store):
    ctl = str(tmp_path)
    os.mkfifo(os.path.join(ctl, "gil"))
    out: dict = {}
    runner = threading.Thread(target=lambda: out.update(results=run_ranks(_job, 4, ctl, env=ENV, timeout=120,
                                                                           store=store)))
    runner.start()
    try:
        ready = lambda r: os.path.join(ctl, f"ready{r}")  # noqa: E731
        _wait(lambda: all(os.path.exists(ready(r)) and os.path.getsize(ready(r)) for r in range(4)), "the ranks")
        info = {r: json.load(open(ready(r))) for r in range(4)}
        address = f"127.0.0.1:{info[0]['port']}"
        # Rank 2 is inside open() (openat), holding the GIL: it cannot run Python.
        _wait(lambda: _in_syscall(info[2]["pid"], {2, 257}), "rank 2 to block in open() with the GIL held")
        from torch_ext.diagnose.live import ask

        # Ranks 0 and 3 have entered collective #2 (asked in-process, through the same path as the CLI).
        def waiting() -> bool:
            rep = ask(address, timeout=DEADLINE_S)
            return all(rep.ranks[r].state == "in_collective" for r in (0, 3))
        _wait(waiting, "ranks 0 and 3 to wait in collective #2")

        p = _cli(address, "--timeout", str(DEADLINE_S))
        text = p.stdout
        print(text)  # shown by pytest -s, and on failure
        assert p.returncode == 0, p.stdout + p.stderr
        took, raised = _timed(lambda: ask(address, timeout=DEADLINE_S))
        assert raised is None and took < DEADLINE_S + _SLACK_S, (took, raised)
        assert "4 of 4 answered" in text, text
        lines = {r: next(line for line in text.splitlines() if line.startswith(f"[live] rank {r} ")) for r in range(4)}
        for r in (0, 3):
            assert "in collective #2 all_reduce(float32[4], SUM)" in lines[r], text
            assert "last completed #1" in lines[r], text
            assert "in _job" in text.split(lines[r])[1].split("[live] rank")[0], text
        for r in (1, 2):
            assert "computing since" in lines[r] and "after #1" in lines[r], text
        stack = lambda r: text.split(lines[r])[1].split("\n[")[0]  # noqa: E731
        assert "in _sleep_in_python" in stack(1), text
        assert "thread data_loader (" in stack(3) and "in _loader" in stack(3), text  # every Python thread's stack
        assert "in _hold_gil_in_c" in stack(2) and "held the GIL" in stack(2), text
        assert "has not arrived" in text and "rank 1" in text and "rank 2" in text, text
        assert "[live] collective #2 all_reduce(float32[4], SUM)" in text, text
        assert "waiting: ranks 0,3" in text, text

        # --json: the same report as data; --html: the post-mortem's page of the live state.
        page = os.path.join(ctl, "live.html")
        p = _cli(address, "--json", "--html", page, "--timeout", str(DEADLINE_S))
        assert p.returncode == 0, p.stdout + p.stderr
        data = json.loads(p.stdout)
        assert data["live"] is True and data["world_size"] == 4 and data["answered"] == [0, 1, 2, 3]
        assert [r["state"] for r in data["ranks"]] == ["in_collective", "computing", "computing", "in_collective"]
        assert data["ranks"][2]["stack"][0]["name"] == "_hold_gil_in_c", data["ranks"][2]
        hang = [v for v in data["verdicts"] if v["kind"] == "hang"]
        assert hang and sorted(hang[0]["not_arrived"]) == [1, 2] and sorted(hang[0]["waiting"]) == [0, 3], data
        html = open(page).read()
        assert '"culprits":{"1":"has not arrived","2":"has not arrived"}' in html, html[-3000:]
        # --repro: the live state as a replay (issue 58); run below, once the job has ended.
        repro_file = os.path.join(ctl, "repro.py")
        p = _cli(address, "--repro", repro_file, "--timeout", str(DEADLINE_S))
        assert p.returncode == 0 and f"wrote {repro_file} (" in p.stdout, p.stdout[-3000:] + p.stderr

        # --ranks: only those ranks are asked (and answer); the verdict covers them alone.
        p = _cli(address, "--json", "--ranks", "0,2-2", "--timeout", str(DEADLINE_S))
        assert p.returncode == 0, p.stdout + p.stderr
        data = json.loads(p.stdout)
        assert data["answered"] == [0, 2] and data["not_answered"] == [], data
        assert [(r["rank"], r["state"]) for r in data["ranks"]] == [(0, "in_collective"), (2, "computing")]
        hang = [v for v in data["verdicts"] if v["kind"] == "hang"]
        assert hang and hang[0]["not_arrived"] == [2] and hang[0]["gone"] == [], data["verdicts"]
        assert "not asked (outside the live report's ranks): ranks 1,3" in hang[0]["text"], hang[0]["text"]
        p = _cli(address, "--ranks", "0,9", "--timeout", str(DEADLINE_S))
        assert p.returncode == 2 and "rank(s) 9 outside the job's 4 ranks (0-3)" in p.stderr, p.stderr

        # --watch: a report every period until Ctrl-C, which ends it cleanly.
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        # Ctrl-C reaches a process started from a shell, where SIGINT has its default action. This
        # test's worker may have it ignored (run with other test files it had, and libraries such as
        # Lightning set SIG_IGN around their teardown), and an ignored SIGINT is inherited: Python
        # then installs no KeyboardInterrupt, and --watch slept on past the test's 30 s.
        w = subprocess.Popen([sys.executable, "-m", "torch_ext.diagnose", "live", address, "--watch", "0.2",
                              "--ranks", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             preexec_fn=_sigint_as_from_a_shell)
        try:
            heads = 0
            end = time.monotonic() + 60
            while heads < 2 and time.monotonic() < end:
                line = w.stdout.readline()
                heads += line.startswith("torch_ext live report of the job at")
            assert heads == 2
            w.send_signal(signal.SIGINT)
            assert w.wait(30) == 0, w.stderr.read()
        finally:
            w.kill()
    finally:
        _release(ctl)
        runner.join(150)
    results = out["results"]
    values = assert_all_ok(results)  # every rank returned normally: no exception, no timeout
    assert [v["value"] for v in values] == [[10.0] * 4] * 4  # the same result as a job nobody looked at
    assert all(r.exitcode == 0 for r in results)
    if store == "parent":  # the replay does not depend on how the job was launched: once is enough
        replay = subprocess.run([sys.executable, repro_file], capture_output=True, text=True, timeout=240, cwd=ctl,
                                env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
        assert replay.returncode == 0, replay.stdout[-6000:] + replay.stderr[-3000:]
        assert "torch_ext replay: the same verdict as the job" in replay.stdout, replay.stdout[-6000:]
        assert "rank 1 has not arrived" in replay.stdout and "rank 2 has not arrived" in replay.stdout
        assert "Note: warn_after is 10 s here (the job's: 45s)" in open(repro_file).read()
        took = float(re.search(r"the same verdict as the job \((\d+(?:\.\d+)?) s\)", replay.stdout).group(1))
        assert took < 45, replay.stdout[-3000:]  # the verdict came at the capped look, not the job's


def _plain_job(rank: int, world: int, ctl: str, gone_rank: int) -> dict:
    dist.all_reduce(torch.ones(1))
    with open(os.path.join(ctl, f"ready{rank}"), "w") as f:
        json.dump({"pid": os.getpid(), "port": int(os.environ["MASTER_PORT"])}, f)
    _sleep_in_python(os.path.join(ctl, "release"))
    dist.all_reduce(torch.ones(1))
    return {}


@contextlib.contextmanager
def _stopped(ctl: str, world: int, rank: int, store: str):
    """Runs _plain_job on `world` ranks, stops `rank` (SIGSTOP) once every rank is ready and yields
    (the store port, a function that resumes it); on the way out resumes it, releases the job and
    checks every rank ended well."""
    out: dict = {}
    runner = threading.Thread(target=lambda: out.update(
        # A 60 s store timeout (conftest's 15 s otherwise): the stopped store host is resumed after the CLI
        # and an ask have run, which took longer than 15 s once on a slow, loaded CI run (StoreLostError).
        results=run_ranks(_plain_job, world, ctl, rank, env={**ENV, "TORCH_EXT_STORE_TIMEOUT": "60"}, timeout=120,
                          store=store)))
    runner.start()
    stopped = {"pid": None}

    def resume() -> None:
        if stopped["pid"]:
            os.kill(stopped["pid"], signal.SIGCONT)
            stopped["pid"] = None
    try:
        ready = lambda r: os.path.join(ctl, f"ready{r}")  # noqa: E731
        _wait(lambda: all(os.path.exists(ready(r)) and os.path.getsize(ready(r)) for r in range(world)), "the ranks")
        info = {r: json.load(open(ready(r))) for r in range(world)}
        stopped["pid"] = info[rank]["pid"]
        os.kill(stopped["pid"], signal.SIGSTOP)
        yield info[0]["port"], resume
    finally:
        resume()
        open(os.path.join(ctl, "release"), "w").close()
        runner.join(150)
    assert_all_ok(out["results"])


def test_a_stopped_rank_is_named_within_the_deadline(tmp_path):
    """A rank that cannot answer at all (SIGSTOP: its watchdog thread is stopped too) is named, not waited on."""
    from torch_ext.diagnose.live import ask

    with _stopped(str(tmp_path), 3, 2, "parent") as (port, _):
        p = _cli(f"127.0.0.1:{port}", "--timeout", "2")
        assert p.returncode == 0, p.stdout + p.stderr
        assert "2 of 3 answered" in p.stdout, p.stdout
        assert "[absent] rank 2: did not answer within 2.0 s: last heartbeat" in p.stdout, p.stdout
        # The whole ask, connecting to the store included, within its deadline: 2 s was too short for the
        # connection alone once on a loaded 2-core CI runner ("no reply within 2.0 s while connecting").
        got: dict = {}
        took, raised = _timed(lambda: got.update(report=ask(f"127.0.0.1:{port}", timeout=DEADLINE_S)))
        assert raised is None and took < DEADLINE_S + _SLACK_S, (took, raised)
        assert got["report"].not_answered == [2], got["report"].not_answered


def test_a_stopped_store_host_is_named_within_the_deadline(tmp_path):
    """Under plain env:// rank 0's process serves the store: stopped, it cannot answer, and the command says so."""
    from torch_ext.diagnose.live import LiveError, ask

    with _stopped(str(tmp_path), 2, 0, "rank0") as (port, resume):
        p = _cli(f"127.0.0.1:{port}", "--timeout", "2")
        took, raised = _timed(lambda: ask(f"127.0.0.1:{port}", timeout=2))
        resume()  # well within the job's store timeout: the job goes on
        assert p.returncode == 2, p.stdout + p.stderr
        assert "does not answer" in p.stderr and "frozen, stopped or overloaded" in p.stderr, p.stderr
        assert isinstance(raised, LiveError) and "frozen, stopped or overloaded" in str(raised), raised
        assert took < 2 + _SLACK_S, took


def test_store_unreachable_is_said_at_once():
    from harness import free_port
    from torch_ext.diagnose.live import LiveError, ask

    port = free_port()
    p = _cli(f"127.0.0.1:{port}", "--timeout", "30")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "is unreachable" in p.stderr and "MASTER_ADDR:MASTER_PORT" in p.stderr, p.stderr
    took, raised = _timed(lambda: ask(f"127.0.0.1:{port}", timeout=30))
    assert isinstance(raised, LiveError) and "is unreachable" in str(raised), raised
    assert took < _SLACK_S, took  # not the 30 s deadline: a refused connection is final


def test_a_store_without_a_guarded_job_is_named():
    server = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    p = _cli(f"127.0.0.1:{server.port}", "--timeout", "2")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "no guarded job at" in p.stderr and "backend='guard'" in p.stderr, p.stderr


def _asks_itself(rank: int, world: int, ctl: str) -> dict:
    import torch_ext

    dist.all_reduce(torch.ones(1))
    release = os.path.join(ctl, "release")
    out: dict = {}
    if rank == 0:
        end = time.monotonic() + 30
        while time.monotonic() < end:  # until ranks 1 and 2 wait in #2 (a condition, with a deadline)
            rep = torch_ext.live_report(timeout=DEADLINE_S)
            if all(rep.ranks[r].state == "in_collective" for r in (1, 2)):
                break
        out = {"text": rep.text(), "json": rep.to_json()}
        open(release, "w").close()
    elif rank == 3:
        _sleep_in_python(release)
    dist.all_reduce(torch.ones(1))
    return out


def test_live_report_in_process():
    import tempfile

    with tempfile.TemporaryDirectory() as ctl:
        values = assert_all_ok(run_ranks(_asks_itself, 4, ctl, env=ENV, timeout=120))
    data, text = values[0]["json"], values[0]["text"]
    assert data["answered"] == [0, 1, 2, 3], text
    states = [r["state"] for r in data["ranks"]]
    assert states == ["computing", "in_collective", "in_collective", "computing"], text
    assert "in _sleep_in_python" in text and "in _asks_itself" in text, text
    hang = [v for v in data["verdicts"] if v["kind"] == "hang"]
    assert hang and sorted(hang[0]["not_arrived"]) == [0, 3], text


# --- TORCH_EXT_LIVE_SIGNAL: a signal to any rank logs the whole job's report ----------------

class _Marker:
    """A logging handler that keeps the torch_ext records and drops a file once the live report is logged."""

    def __init__(self, path: str):
        import logging

        self.records: list[str] = []
        marker = self

        class Handler(logging.Handler):
            def emit(self, record):
                msg = record.getMessage()
                marker.records.append(msg)
                if "live report asked by" in msg:
                    with open(path, "w") as f:
                        f.write(msg)

        logging.getLogger("torch_ext").addHandler(Handler())


def _signalled(rank: int, world: int, ctl: str) -> dict:
    import signal as _signal

    dist.all_reduce(torch.ones(1))
    marker = _Marker(os.path.join(ctl, "logged")) if rank == 0 else None
    with open(os.path.join(ctl, f"ready{rank}"), "w") as f:
        json.dump({"pid": os.getpid(), "port": int(os.environ["MASTER_PORT"])}, f)
    if rank == 1:
        _sleep_in_python(os.path.join(ctl, "release"))
    dist.all_reduce(torch.ones(2))  # rank 0 (signalled) and rank 2 wait here for rank 1
    with open("/proc/self/status") as f:
        caught = int(next(line for line in f if line.startswith("SigCgt:")).split()[1], 16)
    return {"records": marker.records if marker else [], "handled": bool(caught & (1 << (_signal.SIGUSR2 - 1)))}


def test_a_signal_to_a_rank_blocked_in_a_collective_logs_the_live_report(tmp_path):
    ctl = str(tmp_path)
    out: dict = {}
    runner = threading.Thread(target=lambda: out.update(
        results=run_ranks(_signalled, 3, ctl, env=ENV, timeout=120, store="rank0")))
    runner.start()
    try:
        ready = lambda r: os.path.join(ctl, f"ready{r}")  # noqa: E731
        _wait(lambda: all(os.path.exists(ready(r)) and os.path.getsize(ready(r)) for r in range(3)), "the ranks")
        info = json.load(open(ready(0)))
        from torch_ext.diagnose.live import ask

        _wait(lambda: ask(f"127.0.0.1:{info['port']}", timeout=DEADLINE_S).ranks[0].state == "in_collective",
              "rank 0 to wait in the all_reduce")
        os.kill(info["pid"], signal.SIGUSR2)  # rank 0, blocked in the all_reduce, logs the report and goes on
        _wait(lambda: os.path.exists(os.path.join(ctl, "logged")), "rank 0 to log the live report")
    finally:
        open(os.path.join(ctl, "release"), "w").close()
        runner.join(150)
    values = assert_all_ok(out["results"])  # the signal killed nobody, failed nothing
    text = next(m for m in values[0]["records"] if "live report asked by" in m)
    assert text.startswith("live report asked by SIGUSR2 (TORCH_EXT_LIVE_SIGNAL):"), text
    assert "3 of 3 answered" in text and "rank 1 has not arrived" in text and "in _sleep_in_python" in text, text
    assert all(v["handled"] for v in values)


def _handled(rank: int, world: int) -> bool:
    import signal as _signal

    with open("/proc/self/status") as f:
        caught = int(next(line for line in f if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught & (1 << (_signal.SIGUSR2 - 1)))


def test_the_signal_handler_is_off_by_config():
    values = assert_all_ok(run_ranks(_handled, 1, env={"TORCH_EXT_LIVE_SIGNAL": "off"}, timeout=60))
    assert values == [False]
    values = assert_all_ok(run_ranks(_handled, 1, env={"TORCH_EXT_LIVE_SIGNAL": "SIGUSR1"}, timeout=60))
    assert values == [False]
    with pytest.raises(ValueError, match=r"live_signal.*SIGTERM.*SIGUSR1, SIGUSR2, SIGRTMIN\+N"):
        import torch_ext

        torch_ext.GuardOptions(live_signal="SIGTERM").resolved()


# --- the device path (guard over cpu:nccl_sim): a rank is in its oldest pending collective ----

def _runs_ahead(rank: int, world: int, ctl: str) -> dict:
    from torch_ext.testing import nccl_sim

    t = torch.ones(4)
    works = [dist.all_reduce(t, async_op=True) for _ in range(6)]  # the host issues all six at once
    with open(os.path.join(ctl, f"ready{rank}"), "w") as f:
        json.dump({"pid": os.getpid(), "port": int(os.environ["MASTER_PORT"])}, f)
    for w in works:
        w.wait()  # returns at once, as on NCCL
    nccl_sim.synchronize()  # the sync point: rank 1's stream is slow
    return {"value": t.tolist()}


def test_on_the_device_path_a_rank_is_in_its_oldest_pending_collective(tmp_path):
    ctl = str(tmp_path)
    env = dict(ENV, TORCH_EXT_INNER="cpu:nccl_sim", TORCH_EXT_NCCL_SIM_SLOW="1:1500")
    out: dict = {}
    runner = threading.Thread(target=lambda: out.update(results=run_ranks(_runs_ahead, 2, ctl, env=env, timeout=120)))
    runner.start()
    try:
        ready = lambda r: os.path.join(ctl, f"ready{r}")  # noqa: E731
        _wait(lambda: all(os.path.exists(ready(r)) and os.path.getsize(ready(r)) for r in range(2)), "the ranks")
        address = f"127.0.0.1:{json.load(open(ready(0)))['port']}"
        from torch_ext.diagnose.live import ask

        seen: dict = {}

        def ahead() -> bool:
            rep = ask(address, timeout=DEADLINE_S)
            seen["rep"] = rep
            return rep.ranks[1].state == "in_collective" and rep.ranks[1].groups[0]["issued_beyond"] >= 1
        _wait(ahead, "rank 1 to wait in a collective with more issued beyond it")
        rep = seen["rep"]
        g = rep.ranks[1].groups[0]
        seq = g["pending"]["collective_seq_id"]
        assert g["last_seq"] == 6 and g["issued_beyond"] == 6 - seq, g
        assert g["last_completed_seq"] == seq - 1, g  # in its oldest pending collective, not its newest
        assert f"in collective #{seq} all_reduce(float32[4], SUM)" in rep.ranks[1].summary, rep.text()
        assert f"issued {6 - seq} more beyond it" in rep.ranks[1].summary, rep.text()
    finally:
        runner.join(150)
    values = assert_all_ok(out["results"])
    assert [v["value"] for v in values] == [[64.0] * 4] * 2  # 2**6: six all_reduces of 2 ranks
