"""What a newcomer's script prints with no logging set-up (issue 25).

A user-style script (tests/python/jobs/first_contact.py, 3 real processes)
configures no logging: the guard's hang report must come out labelled with
rank, time and level on every line, once; each rank's mismatch error must show
its report once (in its traceback), with rank 0's logged line short and
pointing to it. The same script with its own ``logging.basicConfig`` gets its
own format and one copy of each record. Run under torchrun and under plain
env:// (rank 0 hosts the store, each process ends by itself).
"""
from __future__ import annotations

import os
import re

import pytest

from harness import launch_script, run_script

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs", "first_contact.py")
ENV = {"TORCH_EXT_WARN_AFTER": "1", "TORCH_EXT_INTERVAL": "0.1"}

LABEL = r"\[rank(\d)\] \d\d:\d\d:\d\d torch_ext (WARNING|ERROR): "
HANG_HEAD = 'collective #2 all_reduce(float32[4], SUM) on group "default_pg" has waited'
MISMATCH_HEAD = 'collective #3 on group "default_pg" (3 ranks) differs across ranks'
# The mismatch report's line for rank 1, as the traceback prints it (torch's excepthook prefixes "[rankN]: ").
REPORT_LINE = re.compile(r"^\[rank(\d)\]: +rank 1: +broadcast\(float32\[4\], src=0\)", re.M)


def _torchrun(tmp_path, mode: str) -> str:
    proc = run_script([JOB, mode, str(tmp_path)], tmp_path, 120, nproc=3, **ENV)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-6000:]  # the mismatch fails the job
    return out


def _env(tmp_path, mode: str) -> list[str]:
    procs = launch_script([JOB, mode, str(tmp_path)], 3, store="rank0", timeout=120, env=ENV)
    text = "\n".join(p.describe() for p in procs)
    for p in procs:
        assert p.returncode == 1, text  # each ended by itself, with the mismatch
        assert "CollectiveMismatchError" in p.output, text
    return [p.output for p in procs]


def _check_hang_report(out: str, where: str) -> None:
    """The hang report: rank 0's (the lowest waiting rank), once, every line labelled."""
    heads = [line for line in out.splitlines() if HANG_HEAD in line]
    assert len(heads) == 1, where
    assert re.match(LABEL, heads[0]) and "WARNING" in heads[0], heads[0]
    assert heads[0].startswith("[rank0] "), heads[0]
    body = [line for line in out.splitlines() if "has not arrived" in line or "  waiting: ranks 0,1 at" in line
            or "in validate <- first_contact.py:" in line]
    assert len(body) == 3, where
    for line in body:
        assert re.match(LABEL, line) and line.startswith("[rank0] "), line


BARE = re.compile(r"^(collective #\d|  waiting: |  ranks? [\d,-]+(:| has not arrived)|    \S+\.py:\d+ in )")


def _check_no_bare_report_lines(out: str) -> None:
    for line in out.splitlines():
        assert not BARE.match(line), line


@pytest.mark.timeout(180)
def test_plain_env_no_logging_set_up_labels_each_line_and_prints_each_report_once(tmp_path):
    outputs = _env(tmp_path, "plain")
    where = "\n".join(outputs)[-8000:]
    _check_hang_report(outputs[0], where)
    assert HANG_HEAD not in outputs[1] + outputs[2], where
    for rank, out in enumerate(outputs):
        _check_no_bare_report_lines(out)
        # The full report once per rank: in the traceback of the error it raised.
        assert [m.group(1) for m in REPORT_LINE.finditer(out)] == [str(rank)], out[-6000:]
        logged = [line for line in out.splitlines() if re.match(LABEL, line) and MISMATCH_HEAD in line]
        if rank == 0:
            # Logged by the group's rank 0: one short line pointing to the raised error.
            assert len(logged) == 1 and logged[0].startswith("[rank0] "), out[-6000:]
            assert "ERROR" in logged[0] and "the error raised here carries the full report" in logged[0], logged
        else:
            assert logged == [], out[-6000:]


@pytest.mark.timeout(180)
def test_torchrun_no_logging_set_up_labels_each_line_and_prints_each_report_once(tmp_path):
    out = _torchrun(tmp_path, "plain")
    _check_hang_report(out, out[-8000:])
    _check_no_bare_report_lines(out)
    # torchrun stops the other ranks as soon as one fails, so a rank may be gone
    # before it prints its traceback: at least one rank shows the report, none twice.
    shown = [m.group(1) for m in REPORT_LINE.finditer(out)]
    assert shown and len(shown) == len(set(shown)), out[-8000:]
    # torchrun's own failure summary comes last; it holds the report as the ranks' error files give it.
    out, summary = out.split("ChildFailedError", 1)
    assert "torch_ext.errors.CollectiveMismatchError: " + MISMATCH_HEAD in summary, summary
    # Any other line naming the mismatch is a logged one: rank 0's short line, at most once.
    logged = [line for line in out.splitlines() if MISMATCH_HEAD in line and not re.match(r"\[rank\d\]: ", line)]
    assert len(logged) <= 1, logged
    assert all(line.startswith("[rank0] ") and "the error raised here carries the full report" in line
               for line in logged), logged


def _check_configured(out: str, where: str) -> None:
    # The application's own format, one copy per record, nothing from the default handler.
    assert not re.search(LABEL, out), where
    assert sum(line.startswith(f"APP|torch_ext|WARNING|{HANG_HEAD}") for line in out.splitlines()) == 1, where
    assert out.count("has not arrived") == 1, where


@pytest.mark.timeout(180)
def test_plain_env_with_the_applications_logging_uses_its_format_once(tmp_path):
    outputs = _env(tmp_path, "configured")
    where = "\n".join(outputs)[-8000:]
    _check_configured(outputs[0], where)
    # Its ERROR record carries the full report, in the application's format, once.
    errors = [line for line in outputs[0].splitlines() if line.startswith(f"APP|torch_ext|ERROR|{MISMATCH_HEAD}:")]
    assert len(errors) == 1, where
    assert "APP|torch_ext" not in outputs[1] + outputs[2], where


@pytest.mark.timeout(180)
def test_torchrun_with_the_applications_logging_uses_its_format_once(tmp_path):
    out = _torchrun(tmp_path, "configured")
    _check_configured(out, out[-8000:])
    assert sum(line.startswith(f"APP|torch_ext|ERROR|{MISMATCH_HEAD}:") for line in out.splitlines()) <= 1, out
