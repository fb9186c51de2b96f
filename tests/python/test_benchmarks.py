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


@pytest.mark.timeout(120)
def test_train_step_quick_prints_every_figure():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "train_step.py"), "--quick", "--world", "2"],
        capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "world 2, " in text, text
    assert "DDP buckets: 24 per step" in text, text  # one bucket per layer, as the benchmark intends
    assert "FSDP2: " in text, text
    models = ["DDP"] + ([] if "FSDP2: skipped" in text else ["FSDP2"])
    for model in models:
        assert f"  {model:<5} gloo " in text, text
        for name in ("guard verify", "guard strict", "guard async"):
            line = next((ln for ln in text.splitlines() if ln.startswith(f"  {model:<5} {name} ")), "")
            assert " ms [" in line and "x gloo [" in line, text
        assert f"  {model:<5} noise: gloo's own rounds span [" in text, text
    assert "goal: verify <= 1.01x gloo (DDP) at world 2: " in text, text
