"""The benchmark scripts run end to end and print their verdicts.

Figures are not checked here (timed tests on a shared machine would be noise);
docs/performance.md holds them. This catches a benchmark that no longer runs
against the current torch_ext, so its published command keeps working.
"""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_overhead_added_prints_every_figure():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--added", "--rounds", "3", "--iters", "200"],
        capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for group in ("fake", "guard(fake)", "guard(fake), no call sites", "gloo", "guard(gloo)"):
        assert f"  {group} " in text, text
    assert text.count("goal <= 0.5 us:") == 2, text
    assert "guard(gloo) / gloo =" in text and "goal <= 1.03x:" in text, text
    assert "of which on the calling thread:" in text and "of which on the other threads:" in text, text
    assert "voluntary context switches per call: gloo" in text, text
