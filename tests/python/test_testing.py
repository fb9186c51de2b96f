"""torch_ext.testing and its pytest plugin, as a user's test suite meets them.

The plugin is exercised with pytest's own ``pytester``: a user's test file runs in
a fresh pytest process that finds the plugin through its ``pytest11`` entry point
(the way it loads once torch_ext is installed), and the assertions read that
run's outcomes and failure output. This suite also uses the plugin directly
(``@pytest.mark.world``, the ``ranks`` fixture).
"""
from __future__ import annotations

import contextlib
import multiprocessing
import re
import socket
import textwrap

import pytest
import torch
import torch.distributed as dist

from torch_ext.testing import RanksFailedError, guard_deadlines, run_ranks, visible_gpus

pytest_plugins = ["pytester"]

USER_TESTS = textwrap.dedent('''
    import threading

    import pytest
    import torch
    import torch.distributed as dist


    @pytest.mark.world(3, timeout=20)
    def test_sums(rank, world_size, tmp_path):
        t = torch.tensor([float(rank)])
        dist.all_reduce(t)
        assert t.item() == sum(range(world_size))
        (tmp_path / f"rank{rank}").write_text("ok")  # fixtures are set up once and sent to every rank


    @pytest.mark.world(2, timeout=6)
    def test_one_rank_skips_an_all_reduce(rank, world_size):
        t = torch.ones(1)
        if rank == 0:
            dist.all_reduce(t)  # HANG-LINE: rank 1 skips it
        else:
            threading.Event().wait()  # STUCK-LINE: e.g. a data loader that never yields


    @pytest.mark.world(3, timeout=20)
    def test_a_rank_raises(rank, world_size):
        if rank == 2:
            raise ValueError(f"bad batch on rank {rank}")  # RAISE-LINE
        dist.barrier()
''')


def _line(tag: str) -> int:
    return next(i for i, text in enumerate(USER_TESTS.splitlines(), 1) if tag in text)


def test_plugin_fails_a_hang_within_its_timeout_naming_rank_and_line_shows_tracebacks_and_passes(pytester):
    (pytester.path / "test_user.py").write_text(USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rf", "--durations=0", timeout=150)
    out = result.stdout.str()
    result.assert_outcomes(passed=1, failed=2)
    # The hang: guard's abort_after (derived from the 6 s timeout: 2 s) fails rank 0
    # with the report; rank 1, stuck elsewhere, is killed at the deadline with its stack.
    assert "test_user.py::test_one_rank_skips_an_all_reduce on 2 ranks" in out, out
    assert "rank 0: raised CollectiveTimeoutError" in out, out
    assert f"waiting: rank 0 at test_user.py:{_line('HANG-LINE')} in test_one_rank_skips_an_all_reduce" in out, out
    assert "rank 1 has not arrived" in out, out
    assert f"test_user.py:{_line('STUCK-LINE')} in test_one_rank_skips_an_all_reduce" in out, out
    assert "rank 1: still running at the deadline: killed" in out, out
    # The raising rank: its own traceback, and what the others saw.
    assert "rank 2: raised ValueError: bad batch on rank 2" in out, out
    assert f'test_user.py", line {_line("RAISE-LINE")}, in test_a_rank_raises' in out, out
    assert "rank 2: no heartbeat" in out or "rank 2: exited" in out, out
    # Within the test's own timeout (6 s, counted once the forkserver is up), not a CI job's.
    took = float(re.search(r"([\d.]+)s call +test_user.py::test_one_rank_skips_an_all_reduce", out).group(1))
    assert took < 20, took


GPU_TEST = textwrap.dedent('''
    import pytest

    @pytest.mark.world({n}, device="cuda")
    def test_on_gpus(rank, world_size):
        raise AssertionError("must not run without enough GPUs")
''')


def test_gpu_rule_skips_here_and_fails_on_a_gpu_runner(pytester, monkeypatch):
    n = visible_gpus() + 1  # always one more than this machine has
    pytester.makepyfile(test_gpu_user=GPU_TEST.format(n=n))
    monkeypatch.delenv("TORCH_EXT_GPU_RUNNER", raising=False)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"*needs {n} CUDA device(s), found {n - 1}*TORCH_EXT_GPU_RUNNER=1*"])

    monkeypatch.setenv("TORCH_EXT_GPU_RUNNER", "1")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)  # failed in setup, before any rank starts
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"*GPU runner (TORCH_EXT_GPU_RUNNER=1)*needs {n} CUDA device(s), found {n - 1}*"])


def test_plugin_can_be_disabled_and_misuse_is_named(pytester):
    pytester.makepyfile(test_marked='''
        import pytest

        @pytest.mark.world(2)
        def test_x(rank):
            pass
    ''')
    result = pytester.runpytest("-p", "no:torch_ext", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*fixture 'rank' not found*"])

    pytester.makepyfile(test_marked='''
        import pytest

        @pytest.mark.world(2, devices="cuda")
        def test_x(rank):
            pass
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret != 0
    assert "test_marked.py::test_x: @pytest.mark.world takes" in result.stderr.str(), result.stderr.str()
    assert "got unknown ['devices']" in result.stderr.str(), result.stderr.str()


# --- the plugin in this suite ------------------------------------------------------

@pytest.mark.world(2, timeout=60)
def test_world_marker_runs_the_body_on_every_rank(rank, world_size):
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    assert t.item() == 3.0 and dist.get_backend() == "guard"


def _gather_ranks(rank: int, world: int) -> list[int]:
    out = [None] * world
    dist.all_gather_object(out, rank)
    return out


def test_ranks_fixture_runs_both_store_hosts(ranks):
    for store in ("parent", "rank0"):
        assert ranks(_gather_ranks, 2, store=store, timeout=60).values == [[0, 1], [0, 1]]


def _raise_on_one(rank: int, world: int) -> None:
    if rank == 1:
        raise KeyError("missing column")


def test_run_ranks_raises_one_error_holding_every_rank():
    with pytest.raises(RanksFailedError) as info:
        run_ranks(_raise_on_one, 2, backend=None, timeout=60)
    text = str(info.value)
    assert "1 of 2 rank(s) failed" in text and "rank 0: ok" in text, text
    assert "rank 1: raised KeyError: 'missing column' (exit 1)" in text and "in _raise_on_one" in text, text
    assert [r.ok for r in info.value.results] == [True, False]
    assert [r.exitcode for r in info.value.results] == [0, 1]  # both ended by themselves, none killed
    assert multiprocessing.active_children() == []  # every rank joined


def _mismatch(rank: int, world: int) -> None:
    t = torch.ones(2)
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)


@pytest.mark.timeout(120)
def test_a_multi_line_report_gets_a_summary_line_without_a_dangling_colon():
    with pytest.raises(RanksFailedError) as info:
        run_ranks(_mismatch, 2, timeout=60)
    text = str(info.value)
    for r in (0, 1):
        assert (f'rank {r}: raised CollectiveMismatchError: collective #1 on group "default_pg" (2 ranks) differs '
                "across ranks (exit 1, full report below)") in text, text
    assert ": (exit" not in text, text
    assert "broadcast(float32[2], src=0)" in text, text  # the report itself, below the summary


def test_guard_deadlines_follow_the_timeout_unless_set(monkeypatch):
    monkeypatch.delenv("TORCH_EXT_WARN_AFTER", raising=False)
    monkeypatch.delenv("TORCH_EXT_ABORT_AFTER", raising=False)
    monkeypatch.delenv("TORCH_EXT_BUSY_CAP", raising=False)
    # A wait for a rank that keeps busy goes on to twice abort_after: still within the run's timeout.
    assert guard_deadlines(60, {}) == {"TORCH_EXT_WARN_AFTER": "5", "TORCH_EXT_ABORT_AFTER": "10",
                                       "TORCH_EXT_BUSY_CAP": "20"}
    assert guard_deadlines(12, {}) == {"TORCH_EXT_WARN_AFTER": "1.5", "TORCH_EXT_ABORT_AFTER": "3",
                                       "TORCH_EXT_BUSY_CAP": "6"}
    assert guard_deadlines(60, {"TORCH_EXT_WARN_AFTER": "8"}) == {}  # the caller chose: the guard's config applies
    assert guard_deadlines(60, {"TORCH_EXT_BUSY_CAP": "0"}) == {}


@contextlib.contextmanager
def _port_taken_first(monkeypatch, module):
    """``module.free_port()`` hands out, first, a port another socket holds open: what a launcher meets when
    another process takes the port it chose before rank 0 binds it (EADDRINUSE, seen in loaded CI runs). Yields
    the list of held ports not handed out yet."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = [taken.getsockname()[1]]
    real_free_port = module.free_port
    monkeypatch.setattr(module, "free_port", lambda: ports.pop(0) if ports else real_free_port())
    try:
        yield ports
    finally:
        taken.close()


def _barrier_passed(rank: int, world: int) -> str:
    import torch.distributed as dist

    dist.barrier()
    return f"rank {rank} passed the barrier"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["gloo", "guard"])
def test_run_ranks_starts_again_when_rank_0_loses_the_store_port(monkeypatch, backend):
    # run_ranks(store="rank0"): rank 0 raised DistNetworkError EADDRINUSE in a CI run, the others GroupJoinError
    # (they reached the port's new owner).
    from torch_ext.testing import _ranks

    with _port_taken_first(monkeypatch, _ranks) as ports:
        results = _ranks.run_ranks(_barrier_passed, 3, backend=backend, store="rank0", timeout=90)
    assert not ports  # the held port was handed out first
    assert results.values == [f"rank {r} passed the barrier" for r in range(3)]


def test_launch_script_starts_again_when_rank_0_loses_the_store_port(tmp_path, monkeypatch):
    # store="rank0": the port is chosen free here and bound by rank 0 later.
    from torch_ext.testing import _procs

    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import torch.distributed as dist
        dist.init_process_group("gloo")
        dist.barrier()
        print(f"rank {dist.get_rank()} passed the barrier")
        dist.destroy_process_group()
    """))
    with _port_taken_first(monkeypatch, _procs) as ports:
        results = _procs.launch_script([str(script)], 2, store="rank0", timeout=60)
    assert not ports  # the held port was handed out first
    for r in results:
        assert r.returncode == 0 and f"rank {r.rank} passed the barrier" in r.output, r.describe()
