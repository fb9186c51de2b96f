"""scripts/setup.sh, as the README's two commands use it (issue 25).

The demo's set-up installs only what the demo uses, says what each stage is
and how long it takes, and without root stops at once with one line naming
what is missing and how to get it. These run the script for real with
``--dry-run`` (every check, no install, no build), or source it to exercise
the root decision with the package detection stubbed.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETUP = os.path.join(ROOT, "scripts", "setup.sh")
TEST_ONLY = ("pytest", "lightning", "webdataset", "accelerate", "Chromium", "libgtest", "cmake", "ccache")


def _bash(script: str, user: str | None = None) -> subprocess.CompletedProcess:
    cmd = ["bash", "-c", script]
    if user is not None:
        cmd = ["su", user, "-s", "/bin/bash", "-c", f"cd {ROOT} && {script}"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHON=sys.executable))


def test_the_demo_set_up_names_each_stage_and_installs_nothing_test_only():
    demo = _bash(f"bash {SETUP} demo --dry-run")
    assert demo.returncode == 0, demo.stdout + demo.stderr
    lines = demo.stdout.splitlines()
    assert all(line.startswith("setup: ") for line in lines), lines
    assert any("C++ extension" in line for line in lines), lines  # the build, with what it costs
    assert any("build tools" in line for line in lines), lines
    assert not any(word in demo.stdout for word in TEST_ONLY), demo.stdout
    # The test command's set-up adds the test packages.
    test = _bash(f"bash {SETUP} test --dry-run")
    assert test.returncode == 0, test.stdout + test.stderr
    assert "pytest, lightning, webdataset, accelerate" in test.stdout, test.stdout


def _without_root(script: str) -> subprocess.CompletedProcess:
    """``script`` after sourcing setup.sh, as a user without root: a real one (``nobody``) where
    this runs as root with ``su``, else with the root check stubbed to fail."""
    if os.geteuid() == 0 and shutil.which("su"):
        if _bash("true", user="nobody").returncode == 0:
            return _bash(f"source {SETUP}; {script}", user="nobody")
    return _bash(f"source {SETUP}; admin_prefix() {{ return 1; }}; {script}")


def test_without_root_a_missing_package_stops_the_demo_at_once_with_one_line():
    # The compiler reported missing (the stub), root really absent.
    out = _without_root("system_packages() { echo g++ python3-dev; }; main demo")
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout == "", out.stdout  # no stage started
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "g++ python3-dev" in lines[0] and "sudo apt-get install -y g++ python3-dev" in lines[0], lines


def test_without_root_nothing_missing_the_demo_set_up_goes_on():
    out = _without_root("system_packages() { echo; }; main demo --dry-run")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ready for the demo" in out.stdout, out.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="checks what root gets: the install stages")
def test_as_root_a_missing_package_is_installed_quietly_in_a_named_stage():
    out = _bash(f"source {SETUP}; system_packages() {{ echo g++; }}; main demo --dry-run")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "setup: installing Debian packages: g++ (about 30 s)" in out.stdout, out.stdout


def test_a_failing_stage_prints_its_last_lines_and_the_log_path():
    # An installer that fails (stubbed: nothing is installed): its output went to the log.
    out = _bash(f"source {SETUP}; system_packages() {{ echo; }}; torch_ok() {{ return 1; }}; "
                "pip_install() { echo 'pip: no matching distribution (details)'; return 1; }; main demo")
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout.splitlines() == ["setup: installing torch 2.13.0 (CPU build, about 1 min)"], out.stdout
    assert "this stage failed: installing torch" in out.stderr, out.stderr
    assert "  | pip: no matching distribution (details)" in out.stderr, out.stderr
    log = out.stderr.rsplit("full log: ", 1)[1].strip()
    with open(log) as f:
        assert "pip: no matching distribution (details)" in f.read()
    os.remove(log)
