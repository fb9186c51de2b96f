"""torchrun's own failure summary carries the guard's report (issue 69).

torchrun's agent stops the surviving workers with SIGTERM as soon as one worker's process ends, before
the guard could name it, and prints for each worker the error file it wrote. A stopped survivor waits
for the verdict already on its way, prints it, writes it to the error file and ends with -15 as asked; a
rank whose guard error ends it writes the error file at exit. Run as a user runs it: torchrun, 3 local
ranks in fresh interpreters (a warm shim would stand between torchrun and a killed worker), the default
settings.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from harness import ROOT, needs, run_script

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import doc_samples  # noqa: E402

doc_samples.WARM = True  # its torchrun source runs fresh interpreters anyway (fails=True)

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs", "torchrun_summary.py")


def _summary(out: str) -> dict[int, str]:
    """torchrun's failure summary, one entry per failed worker's global rank."""
    assert "ChildFailedError" in out, out[-6000:]
    summary = out[out.index("ChildFailedError"):]
    entries = re.split(r"\n\[\d+\]:\n", summary)[1:]
    by_rank = {}
    for e in entries:
        m = re.search(r"rank +: (\d+) \(local_rank", e)
        assert m, e
        by_rank[int(m.group(1))] = e
    return by_rank


def test_survivors_stopped_by_torchrun_put_the_guards_report_in_its_summary(tmp_path):
    # torchrun --standalone --nproc-per-node 3 examples/bugs/killed_rank.py: rank 2 is killed at step 3.
    out = doc_samples.run_source("killed_rank_torchrun", tmp_path)
    entries = _summary(out)
    assert sorted(entries) == [0, 1, 2], out[-6000:]
    assert "Root Cause (first observed failure)" in out and "exitcode  : -9" in entries[2], out[-6000:]
    stopped = 0
    for r in (0, 1):
        e = entries[r]
        assert "exitcode  : -15" in e, e  # ended as torchrun asked
        assert "error_file: <N/A>" not in e, e
        if f"rank {r} (pid " in e and "before a verdict" in e:
            # torchrun's monitor stopped it before the guard's verdict (seen once in a clean-clone CI run
            # on a loaded machine): the guard's stop entry names the collective it waited in and what
            # each rank had issued, the killed rank among them.
            assert f"rank {r} (pid " in e and "was stopped by its launcher (SIGTERM) before a verdict, in:" in e, e
            assert "pending here: collective #4 all_reduce(float32[16], SUM) at killed_rank.py:" in e, e
            assert re.search(r"rank 2: (last heartbeat|no heartbeat|exited)", e), e
            assert out.count(f"torch_ext: rank {r} (pid ") == 1, out[-6000:]
            continue
        if f"rank {r} (pid " in e:  # stopped by torchrun while the verdict came: the guard's stop entry
            assert 'was stopped by its launcher (SIGTERM) after group "default_pg" failed' in e, e
            # The log has it too, before the summary: once (the full report, or a line pointing to it).
            assert out.count(f"torch_ext: rank {r} (pid ") == 1, out[-6000:]
            stopped += 1
        else:
            # It raised the guard's error before torchrun's SIGTERM came (torchrun's monitor runs late on
            # a loaded machine: seen once in CI): the entry is its own error, which is the guard's report.
            assert "torch_ext.errors.CollectiveFailureError: " in e, e
        assert 'collective #4 all_reduce(float32[16], SUM) on group "default_pg" failed in the inner backend' in e, e
        assert re.search(r"rank 2: (no heartbeat|exited)", e), e  # names the rank that went
    # Each survivor's dump holds the verdict's moment.
    dumps = sorted(n for n in os.listdir(tmp_path / "torch_ext_dumps") if n.endswith(".json"))
    assert dumps == ["rank0.json", "rank1.json"], out[-3000:]
    if stopped == 2:  # the README's sample shows the usual order: both survivors stopped by torchrun
        doc_samples.check_source("killed_rank_torchrun", out)


def test_a_mismatch_under_torchrun_is_the_root_cause_in_its_summary(tmp_path):
    proc = run_script([JOB, "mismatch"], tmp_path, 150, nproc=3, fresh=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-6000:]
    root = out[out.index("Root Cause (first observed failure)"):]
    assert "error_file: <N/A>" not in root, root
    assert "torch_ext.errors.CollectiveMismatchError: collective #4 on group \"default_pg\" (3 ranks) differs" in root
    assert re.search(r"rank 1: +all_reduce\(float32\[5\], SUM\) +at torchrun_summary.py:\d+ in main", root), root
    assert "To enable traceback see" not in out[out.index("ChildFailedError"):], out[-6000:]


def test_a_child_forked_by_a_rank_still_dies_of_sigterm(tmp_path):
    # DataLoader workers are forked from the rank and ended with SIGTERM: the rank's handler is not theirs.
    proc = run_script([JOB, "fork"], tmp_path, 120, nproc=2, fresh=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert sorted(re.findall(r"rank (\d): forked child ended by signal 15", out)) == ["0", "1"], out[-6000:]


def test_under_lightning_the_survivors_entries_carry_the_guards_report(tmp_path):
    # Lightning replaces the SIGTERM handler during fit (its own broadcasts a flag, which raises the
    # group's failure): the guard's error ends each survivor, and the exit writes it to the error file.
    needs("lightning")
    proc = run_script([JOB, "lightning"], tmp_path, 180, nproc=3, fresh=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-6000:]
    entries = _summary(out)
    assert "exitcode  : -9" in entries[1], out[-6000:]
    for r in (0, 2):
        e = entries[r]
        assert "error_file: <N/A>" not in e, e
        assert "torch_ext.errors.CollectiveFailureError: collective #" in e, e
        assert re.search(r"rank 1: (no heartbeat|exited)", e), e


def test_a_stopped_job_says_where_each_rank_stood_and_what_its_peers_last_did(tmp_path):
    # Cancelling a job (SIGTERM to torchrun, as scancel or Ctrl-C of the agent does) while rank 0 waits in a
    # collective for rank 1, which computes: no verdict is coming, so each rank says at once where it stood.
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    agent = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                              JOB, "stopped", str(ctl)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while not all((ctl / f"ready{r}").exists() for r in (0, 1)):
            assert agent.poll() is None and time.monotonic() < deadline, agent.communicate(timeout=30)[0][-6000:]
            time.sleep(0.05)  # polling for the ranks' files, not waiting on a guess
        port = int((ctl / "ready0").read_text().split()[1])
        from torch_ext.diagnose.live import ask

        # Rank 0 is in collective #2 (asked through the store, as `torch-ext-diagnose live` asks).
        while ask(f"127.0.0.1:{port}", timeout=5.0).ranks[0].state != "in_collective":
            assert time.monotonic() < deadline, "rank 0 never waited in collective #2"
        agent.send_signal(signal.SIGTERM)
        out = agent.communicate(timeout=60)[0]
    finally:
        agent.kill()
    said = {int(m.group(1)): m.group(0) for m in re.finditer(
        r"torch_ext: rank (\d) \(pid \d+\) was stopped by its launcher \(SIGTERM\)[^\n]*(\n  .*)*", out)}
    assert sorted(said) == [0, 1], out[-6000:]
    assert said[0].startswith("torch_ext: rank 0 (pid ") and "before a verdict, in:" in said[0], said[0]
    assert '\n  group "default_pg" (2 ranks):\n  pending here: collective #2 all_reduce(float32[4], SUM) at ' \
        "torchrun_summary.py:" in said[0], said[0]
    assert re.search(r"\n  rank 1: last heartbeat [\d.]+ s ago, issued #1, completed #1", said[0]), said[0]
    assert "outside any guarded collective" in said[1], said[1]
    # The one traceback is torchrun's own (its agent raises SignalException): the ranks end without one.
    assert out.count("Traceback (most recent call last)") == 1 and "SignalException: Process" in out, out[-6000:]
