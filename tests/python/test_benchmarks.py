"""The benchmark scripts run end to end and print their verdicts.

Figures are not checked here (timed tests on a shared machine would be noise);
docs/performance.md holds them. This catches a benchmark that no longer runs
against the current torch_ext, so its published command keeps working.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from harness import needs

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


def test_overhead_added_beside_a_busy_thread_prints_wall_time():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--added", "--busy-thread", "--rounds", "2",
         "--iters", "20"], capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "wall time per call, a Python thread spinning beside the loop" in out.stdout, out.stdout
    assert "guard(fake) adds" in out.stdout and "guard(gloo) / gloo =" in out.stdout, out.stdout


@pytest.mark.timeout(120)
def test_labels_prints_every_figure():
    needs("lightning")
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "labels.py"), "--rounds", "3", "--n", "200", "--cold", "20",
         "--log-calls", "5"],
        capture_output=True, text=True, timeout=100, cwd=ROOT, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert out.returncode == 0, out.stderr[-4000:]
    for row in ("torch_ext.here()", "enter a seen label", "enter a new label", "self.log, Lightning's",
                "self.log, ddp_guard's", "added per self.log", "recording the origin"):
        assert f"{row} " in out.stdout and " us  [" in out.stdout, out.stdout


@pytest.mark.timeout(120)
def test_train_step_quick_prints_every_figure():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "train_step.py"), "--quick", "--world", "2"],
        capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "world 2, " in text, text
    assert "DDP buckets: 6 per step" in text, text  # one bucket per layer (--quick: 6), as the benchmark intends
    assert "FSDP2: " in text, text
    models = ["DDP"] + ([] if "FSDP2: skipped" in text else ["FSDP2"])
    for model in models:
        assert f"  {model:<5} gloo " in text, text
        for name in ("guard verify", "guard strict", "guard async"):
            line = next((ln for ln in text.splitlines() if ln.startswith(f"  {model:<5} {name} ")), "")
            assert " ms [" in line and "x gloo [" in line, text
        assert f"  {model:<5} noise: gloo's own rounds span [" in text, text
    assert "goal: verify <= 1.01x gloo (DDP) at world 2: " in text, text


def _read(pid: str, what: str) -> bytes:
    try:
        with open(f"/proc/{pid}/{what}", "rb") as f:
            return f.read()
    except OSError:  # ended meanwhile
        return b""


def _spinning(mark: str) -> list[str]:
    """The busy processes (``waited.py --busy``) still running of the benchmark started with ``mark`` in its
    environment: those of another test running beside this one (test_waited, test_cost) are not its."""
    return [pid for pid in os.listdir("/proc") if pid.isdigit()
            and _read(pid, "cmdline").replace(b"\0", b" ").decode(errors="replace").strip().endswith("waited.py --busy")
            and f"BENCHMARK_TEST_MARK={mark}".encode() in _read(pid, "environ").split(b"\0")]


@pytest.mark.timeout(120)
def test_waited_prints_every_mode_with_the_loop_options(tmp_path):
    # The options a training loop's sync is timed with: an early-stop MAX, CPU work
    # and a larger all_reduce before each timed one, a busy machine.
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "waited.py"), "--world", "2", "--sizes", "1", "--iters", "20",
         "--rounds", "2", "--op", "max", "--spin-us", "100", "--after", "1000", "--busy", "1"],
        capture_output=True, text=True, timeout=100, cwd=ROOT, env=dict(os.environ, BENCHMARK_TEST_MARK=str(tmp_path)))
    assert out.returncode == 0, out.stderr[-4000:]
    text = out.stdout
    assert ("synchronous MAX all_reduces, each after one of 1000 float32, each after 100 us of CPU work, 1 busy "
            "process(es) beside the ranks per mode" in text), text
    assert not _spinning(str(tmp_path)), "the busy process outlived the benchmark"
    rows = [ln for ln in text.splitlines() if ln.strip().startswith("1 |")]
    assert len(rows) == 2, text  # the time per all_reduce, then the CPU time per all_reduce
    assert all(" us [" in row and row.count("x [") == 3 for row in rows), text  # verify, async, strict against gloo
    assert "world 2: CPU time per all_reduce, all threads of rank 0's process, in the same rounds" in text, text


@pytest.mark.timeout(120)
def test_cost_prints_the_table_quiet_and_busy_and_writes_the_plot(tmp_path):
    # issue 70's one command: worlds x syncs x columns, verify and async against gloo in the same run.
    svg = tmp_path / "cost.svg"
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cost.py"), "--worlds", "2", "--syncs", "loss float32[1] SUM",
         "flag float32[1] MAX", "FSDP2 grads float32[1 MiB] AVG", "--iters", "10", "--rounds", "2", "--svg", str(svg)],
        capture_output=True, text=True, timeout=100, cwd=ROOT, env=dict(os.environ, BENCHMARK_TEST_MARK=str(tmp_path)))
    assert out.returncode == 0, out.stderr[-4000:]
    rows = [ln for ln in out.stdout.splitlines() if ln.strip().startswith("2 |")]
    assert len(rows) == 6, out.stdout  # three syncs (an FSDP2 layer's reduce_scatter among them), quiet and busy
    assert all(" us [" in row and row.count("x [") == 2 for row in rows), out.stdout
    assert sum("| busy " in row for row in rows) == 3, out.stdout
    assert svg.read_text().count("<rect") == 6, svg.read_text()
    assert not _spinning(str(tmp_path)), "the busy process outlived the benchmark"


@pytest.mark.timeout(120)
def test_cost_over_nccl_sim_prints_the_synced_call_and_the_issue_alone():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cost.py"), "--inner", "nccl_sim", "--worlds", "2", "--no-busy",
         "--syncs", "loss float32[1] SUM", "--iters", "10", "--rounds", "2"],
        capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "inner nccl_sim (the baseline column is plain nccl_sim" in out.stdout, out.stdout
    rows = [ln for ln in out.stdout.splitlines() if "| quiet " in ln]
    assert len(rows) == 2 and "issue" in rows[1], out.stdout  # the synced call, then the issue alone
    assert all(row.count("x [") == 2 for row in rows), out.stdout


@pytest.mark.timeout(120)
def test_gloo_chunks_prints_each_size_with_its_chunks():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gloo_chunks.py"), "--world", "3", "--sizes", "1", "3", "7",
         "--iters", "5", "--rounds", "2"],
        capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-4000:]
    chunks = {int(ln.split("|")[0]): int(ln.split("|")[1]) for ln in out.stdout.splitlines()
              if ln.strip()[:1].isdigit() and " us [" in ln}
    assert chunks == {1: 1, 3: 2, 7: 2}, out.stdout


@pytest.mark.timeout(120)
def test_gloo_chunks_one_element_prints_each_shape_against_the_loss():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gloo_chunks.py"), "--world", "3", "--one-element",
         "--iters", "5", "--rounds", "2"],
        capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-4000:]
    rows = {ln.split("|")[0].strip(): ln for ln in out.stdout.splitlines() if " us [" in ln}
    assert list(rows) == ["float32[1] SUM", "int64[2] SUM", "int64[2] MAX", "gather int64[1] a rank"], out.stdout
    assert rows["float32[1] SUM"].rstrip().endswith("| 1.00x [1.00, 1.00]"), out.stdout  # the baseline itself


# scripts/gpu.sh and the benchmarks' --device cuda: on a machine without a GPU they
# stop at once with one line that says why (a GPU machine runs them for real).
no_gpu_here = pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="this machine has a GPU: scripts/gpu.sh runs for real here")


def test_gpu_script_parses():
    out = subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu.sh")], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def test_cpu_worlds_script_parses():
    out = subprocess.run(["bash", "-n", str(ROOT / "scripts" / "cpu_worlds.sh")], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("worlds, status, says", [("4 8", 1, "a core per rank"), ("4 x", 2, "not a whole number")])
def test_cpu_worlds_script_with_too_few_cores_or_a_bad_world_stops_at_once_with_one_line(tmp_path, worlds, status,
                                                                                          says):
    import os

    if os.cpu_count() > 8 and status == 1:
        pytest.skip("this machine has the cores: scripts/cpu_worlds.sh runs for real here")
    env = dict(os.environ, OUT=str(tmp_path / "report"), PYTHON=sys.executable, WORLDS=worlds)
    out = subprocess.run(["bash", str(ROOT / "scripts" / "cpu_worlds.sh")], capture_output=True, text=True, timeout=30,
                         env=env)
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    assert out.returncode == status and len(lines) == 1 and says in lines[0], (out.returncode, lines)
    assert not (tmp_path / "report").exists()  # stopped before anything ran


@no_gpu_here
@pytest.mark.timeout(120)
@pytest.mark.parametrize("nvidia_smi", [False, True], ids=["no-nvidia-smi", "driver-but-no-cuda-torch"])
def test_gpu_script_without_a_gpu_stops_at_once_with_one_line(tmp_path, nvidia_smi):
    import os
    import shutil
    import time

    env = dict(os.environ, OUT=str(tmp_path / "report"), PYTHON=sys.executable)
    env.pop("TORCH_EXT_GPU_RUNNER", None)
    if nvidia_smi:  # a driver that answers, and a torch that sees no GPU: the torch check speaks
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: stand-in (UUID: GPU-0)'\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    elif shutil.which("nvidia-smi"):
        pytest.skip("nvidia-smi is installed here: the no-driver case is not this machine's")
    start = time.monotonic()
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu.sh")], capture_output=True, text=True, timeout=100,
                         cwd=tmp_path, env=env)
    took = time.monotonic() - start
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    assert out.returncode != 0, (out.stdout, out.stderr)
    assert len(lines) == 1, lines
    assert lines[0].startswith("gpu.sh: no GPU here: "), lines
    assert ("torch" if nvidia_smi else "nvidia-smi is not on PATH") in lines[0], lines
    assert took < 60, took  # nothing ran: no tests, no benchmarks
    assert not (tmp_path / "report").exists()  # and no report was started


@no_gpu_here
@pytest.mark.timeout(120)
@pytest.mark.parametrize("script", ["overhead.py", "train_step.py"])
def test_benchmark_device_cuda_without_a_gpu_says_so(script):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--device", "cuda"],
                         capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --device cuda needs 1 CUDA device(s): "), out.stderr
    assert "Traceback" not in out.stdout + out.stderr
