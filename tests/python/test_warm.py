"""Programs forked from the warm interpreter behave as fresh ``python ARGS`` (torch_ext/testing/_warm.py).

Most of this suite's programs (launch_script's ranks, the examples, the CLIs, a replay's ranks) are
forked from an interpreter that imported torch once, not started anew (issue 66: interpreter
start-ups were most of CI's CPU). That is only sound if a program cannot tell: the same probe runs
both ways and must see the same argv, sys.path, __main__, working directory, environment, warning
filters and standard streams, end the same way (exit status, uncaught exception and its traceback,
atexit hooks, non-daemon threads joined, a signal) and print the same. The one difference it may
see is that torch is already imported.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from harness import ROOT, launch_script
from torch_ext.testing import _warm

PROBE = os.path.join("tests", "python", "jobs", "warm_probe.py")  # relative, as a user types it
STACK_JOB = os.path.join("tests", "python", "jobs", "stack_job.py")


def _both(args: list[str], **env: str):
    full = dict(os.environ, PROBE="yes", PYTHONPATH="/probe/a" + os.pathsep + "/probe/b", **env)
    fresh = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60, env=full, cwd=ROOT)
    _warm.start(full)
    warm = _warm.run(args, env=full, cwd=ROOT, timeout=60)
    return fresh, warm


def _facts(proc) -> dict:
    facts = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
    facts.pop("torch_in_modules")  # the one difference: the warm interpreter has torch imported
    return facts


@pytest.mark.parametrize("how", [[], ["exit", "3"], ["raise"]], ids=["ends", "sys.exit(3)", "raises"])
def test_a_program_sees_and_ends_as_under_a_fresh_interpreter(how):
    fresh, warm = _both([PROBE, *how])
    assert warm.returncode == fresh.returncode == {(): 0, ("exit", "3"): 3, ("raise",): 1}[tuple(how)]
    assert _facts(warm) == _facts(fresh), (warm.stdout, fresh.stdout)
    facts = _facts(warm)
    assert facts["argv"] == [PROBE, *how] and facts["main_name"] == "__main__" and facts["env"] == "yes"
    assert facts["path0"] == os.path.join(ROOT, "tests", "python", "jobs")
    assert facts["pythonpath"] == ["/probe/a", "/probe/b"] and not facts["torch_ext_in_modules"]
    # The main thread's end is the interpreter's: the non-daemon thread is joined, then atexit runs,
    # seeing an uncaught exception as sys.last_value.
    for proc in (fresh, warm):
        tail = proc.stdout.splitlines()[-2:]
        last = "ValueError" if how == ["raise"] else None
        assert tail == ["thread: done", f"atexit: last_value={last}"], proc.stdout
    assert warm.stderr == fresh.stderr, (warm.stderr, fresh.stderr)  # the traceback too, frame for frame
    if how == ["raise"]:
        assert warm.stderr.startswith("to stderr\nTraceback (most recent call last):\n  File \"" + os.path.join(
            ROOT, PROBE) + "\", line"), warm.stderr


def test_warning_options_and_unbuffered_output_come_from_the_programs_environment():
    fresh, warm = _both([PROBE], PYTHONWARNINGS="ignore::UserWarning", PYTHONUNBUFFERED="1")
    assert _facts(warm) == _facts(fresh)
    facts = _facts(warm)
    assert facts["warnoptions"] == ["ignore::UserWarning"] and facts["warnings_shown"] == ["deprecated"]
    assert facts["stdout_write_through"] is True
    fresh, warm = _both(["-W", "error::DeprecationWarning", PROBE])
    assert warm.returncode == fresh.returncode == 1 and "DeprecationWarning: deprecated" in warm.stderr
    assert warm.stderr == fresh.stderr


def test_module_and_command_forms():
    for args in (["-m", "json.tool", "--help"], ["-c", "import sys; print(sys.argv, sys.path[0] == '')", "x"]):
        fresh, warm = _both(args)
        assert (warm.returncode, warm.stdout, warm.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr), args


def test_a_signal_ends_it_as_it_ends_a_fresh_one_and_wait_has_a_timeout(tmp_path):
    fresh, warm = _both([PROBE, "kill"])
    assert warm.returncode == fresh.returncode == -signal.SIGKILL
    with open(tmp_path / "out", "w") as out:
        p = _warm.popen(["-c", "import time; time.sleep(60)"], stdout=out, stderr=subprocess.STDOUT)
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=0.2)
        p.terminate()
        assert p.wait(timeout=10) == -signal.SIGTERM
        p.kill()  # after the end: no signal reaches a pid the zygote has reaped


def test_a_run_past_its_timeout_says_what_it_printed_and_where_each_process_stood(tmp_path):
    # A hung program's test failure names which of its processes hung, and in what: a child that
    # the program started (as a DataLoader starts workers) is found by the folder it works in.
    code = ("import subprocess, sys, time; child = subprocess.Popen(['sleep', '60']); "
            "print('started', child.pid, flush=True); print('to stderr', file=sys.stderr, flush=True); "
            "time.sleep(60)")
    with pytest.raises(_warm.ProgramTimeout) as got:
        _warm.run(["-c", code], cwd=tmp_path, timeout=5)
    text = str(got.value)
    child = re.search(r"started (\d+)", text).group(1)
    assert "timed out after 5 seconds" in text and "--- its stderr, last 8000 characters:\nto stderr" in text, text
    program = re.search(rf"pid {child} \(parent (\d+)\) S in \S+: sleep 60", text).group(1)
    assert re.search(rf"pid {program} \(parent \d+\) S in \S+: \S*python", text), text  # forked: the zygote's line
    assert "threads: " in text, text
    os.kill(int(child), signal.SIGKILL)
    # With faulthandler on, each of its processes is asked for its Python stacks before the kill.
    code = "import time\ndef _hang_here():\n    time.sleep(60)\n_hang_here()\n"
    with pytest.raises(_warm.ProgramTimeout) as got:
        _warm.run(["-c", code], cwd=tmp_path, timeout=5, env=dict(os.environ, PYTHONFAULTHANDLER="1"))
    assert "Fatal Python error: Aborted" in str(got.value) and 'line 3 in _hang_here' in str(got.value), got.value


def test_import_time_settings_that_differ_get_an_interpreter_of_their_own():
    # OpenMP reads OMP_NUM_THREADS when torch loads it: a program asking for another value than the
    # zygote's must not inherit the zygote's.
    code = "import torch; print(torch.get_num_threads())"
    for n in ("1", "2"):
        out = _warm.run(["-c", code], env=dict(os.environ, OMP_NUM_THREADS=n), timeout=60)
        assert out.stdout.strip() == n, (n, out)
    assert not _warm.forkable(["-X", "dev", PROBE]) and _warm.forkable(["-u", "-W", "ignore", PROBE])


def test_a_warm_start_costs_a_fraction_of_a_fresh_one():
    # Not a timing assertion on the clock: CPU time of the started program's own process.
    code = "import time, torch; print(time.process_time())"
    _warm.start()
    warm = float(_warm.run(["-c", code], timeout=60).stdout)
    start = time.monotonic()
    fresh = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout)
    assert warm < fresh / 5, (warm, fresh, time.monotonic() - start)


def test_the_shim_stands_in_for_its_program_as_a_launcher_sees_it(tmp_path):
    # torchrun starts each worker as PYTHON_EXEC ARGS and watches that process: its exit status, a
    # signal passed on (SIGTERM when another worker failed), a SIGKILL that must end the program.
    python = _warm.shim()
    env = dict(os.environ, PYTHON_EXEC=python)
    out = subprocess.run([python, "-c", "import os, sys; print(os.environ.get('PYTHON_EXEC')); sys.exit(7)"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert (out.returncode, out.stdout) == (7, "None\n"), out  # the launcher's setting is not the program's
    code = "import os, sys, time; print(os.getpid(), os.getppid(), flush=True); time.sleep(60)"
    for sig in (signal.SIGTERM, signal.SIGKILL):
        p = subprocess.Popen([python, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
        pid, ppid = map(int, p.stdout.readline().split())
        assert ppid != p.pid  # forked by the zygote, not started by the shim
        p.send_signal(sig)
        assert p.wait(timeout=30) == -sig
        deadline = time.monotonic() + 10  # the program ends with its stand-in (the zygote kills it)
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        assert not _alive(pid), f"the program of a shim killed by {sig.name} still runs"
    # A program whose import-time settings differ starts fresh, under the same shim.
    threads = "1" if os.environ.get("OMP_NUM_THREADS") != "1" else "2"
    out = subprocess.run([python, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True,
                         text=True, timeout=60, env=dict(env, OMP_NUM_THREADS=threads))
    assert out.stdout.strip() == threads, out


def test_with_a_warm_executable_the_programs_own_interpreters_are_forked_too():
    # Lightning's launcher starts its ranks as `sys.executable ARGS`: with warm_executable, that is the
    # zygote's shim, and the program it starts is forked (its parent is the zygote, not the shim).
    code = ("import os, subprocess, sys; print(os.getpid(), flush=True); "
            "subprocess.run([sys.executable, '-c', 'import os, sys; print(os.getppid(), sys.argv[1:])', 'x'])")
    for warm, forked in ((True, True), (False, False)):
        out = _warm.run(["-c", code], timeout=60, warm_executable=warm)
        pid, child = out.stdout.splitlines()
        ppid, argv = child.split(" ", 1)
        assert argv == "['x']", out
        assert (int(ppid) != int(pid)) == forked, (warm, out)  # a fresh child's parent is the program


def test_a_programs_multiprocessing_spawn_children_are_forked_too():
    # mp.spawn (examples/multiscale_buckets.py) starts its children as `sys.executable -c ...` with the
    # interpreter multiprocessing saw at its import (in the zygote): the shim too, and -B when
    # PYTHONDONTWRITEBYTECODE set the flags.
    code = ("import multiprocessing as mp, os\n"
            "if __name__ == '__main__':\n"
            "    with mp.get_context('spawn').Pool(1) as pool:\n"
            "        print(os.getpid(), pool.apply(os.getppid))\n")
    for warm in (True, False):
        out = _warm.run(["-c", code], timeout=60, warm_executable=warm)
        assert out.returncode == 0, out
        pid, worker_parent = out.stdout.split()
        assert (worker_parent != pid) == warm, (warm, out)  # a fresh child's parent is the program


def test_a_childs_descriptors_are_placed_under_their_numbers_whatever_numbers_are_free():
    # The zygote's child puts what it received under the numbers the program had them. Placed through
    # the lowest free numbers, a target that is one of those overwrote a descriptor still to be placed
    # (a multiprocessing spawn child read its pipe from its resource tracker's write end: EBADF).
    from torch_ext.testing import _zygote

    pipes = [os.pipe() for _ in range(2)]
    free = [os.dup(0) for _ in range(3)]  # the three lowest free numbers, freed again
    for fd in free:
        os.close(fd)
    received = [fcntl.fcntl(r, fcntl.F_DUPFD, 200) for r, _ in pipes]  # as the zygote received them: high
    targets = free[1:]  # the second lowest free number and the next
    try:
        _zygote._place(received, targets)
        assert [os.fstat(t).st_ino for t in targets] == [os.fstat(r).st_ino for r, _ in pipes]
        assert all(fcntl.fcntl(t, fcntl.F_GETFD) & fcntl.FD_CLOEXEC == 0 for t in targets)  # inherited, as a program's
    finally:
        for fd in [*targets, *(fd for pair in pipes for fd in pair)]:
            os.close(fd)


def test_processes_of_a_shared_set_use_one_zygote_that_ends_with_its_owner(tmp_path):
    # pytest-xdist's workers share their zygotes (tests/python/conftest.py): one per key, ended with
    # the set's owner (here a stand-in process), not with the process that happened to start it.
    owner = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    env = dict(os.environ, **{_warm.SHARED: f"{owner.pid}:{tmp_path}"})
    code = ("import os; from torch_ext.testing import _warm; zygote = _warm._zygote(dict(os.environ)); "
            "print(zygote.ask({'op': 'ping'}), _warm.run(['-c', 'import os; print(os.getppid())']).stdout.strip())")
    try:
        seen = []
        for _ in range(2):  # two processes of the set, one after the other: the second finds the first's
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
            assert out.returncode == 0, out
            seen.append(out.stdout.split())
        (zygote, parent), second = seen
        assert parent == zygote and second == [zygote, zygote], seen  # both programs forked by that one
        ended = os.pidfd_open(int(zygote))
    finally:
        owner.stdin.close()
        owner.wait(timeout=30)
    try:
        assert select.select([ended], [], [], 30)[0], f"the shared zygote {zygote} outlived its owner"
    finally:
        os.close(ended)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _main_thread_frames(args: list[str], fresh: bool, tmp_path) -> list[tuple[str, str]]:
    """Rank 1's main-thread stack in the dump it wrote at warn_after, as (file, function), innermost first."""
    dumps = tmp_path / ("fresh" if fresh else "warm")
    results = launch_script(args, 2, env={"TORCH_EXT_WARN_AFTER": "1", "TORCH_EXT_DUMP_DIR": str(dumps)},
                            timeout=90, fresh=fresh)
    assert all(r.ok for r in results), [r.describe() for r in results]
    main = json.loads((dumps / "rank1.json").read_text())["main_thread"]
    assert main["available"], main
    return [(os.path.basename(f["filename"]), f["name"]) for f in main["frames"]]


@pytest.mark.parametrize("form", ["script", "module"])
def test_a_reported_stack_starts_at_the_programs_top_level_however_it_was_started(form, tmp_path):
    """The frames below a program's top level are its launcher's (runpy's for ``python -m``, the warm
    interpreter's): the guard's reports and dumps leave them out, so a stack reads the same fresh and warm."""
    args = [STACK_JOB] if form == "script" else ["-m", STACK_JOB[:-3].replace(os.sep, ".")]
    fresh, warm = (_main_thread_frames(args, f, tmp_path) for f in (True, False))
    assert fresh == warm == [("stack_job.py", "_away"), ("stack_job.py", "<module>")], (fresh, warm)
