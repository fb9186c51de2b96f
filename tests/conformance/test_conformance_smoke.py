"""A small, representative slice of PyTorch's distributed_test.py, run on guard.

Runs run_torch_suite.py in a subprocess (the suite reads its configuration from
the environment at import time, so it cannot share pytest's process) on a few
tests that cover each kind of operation guard forwards: collectives, p2p,
object collectives, subgroups and DDP. Every test listed here passed on guard
(and on gloo) in the full run recorded in docs/conformance.md.

Marked ``slow``: each test of the suite spawns two fresh interpreters that import
torch, about 5-20 s per test on a shared 2-core machine, so the slice takes one
to two minutes. Run it with::

    PYTHONPATH=$PWD python -m pytest tests/conformance/test_conformance_smoke.py -m slow
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("expecttest", reason="torch.testing._internal needs expecttest (pip install expecttest)")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

SLICE = [
    "test_get_backend",
    "test_all_reduce_sum_async",
    "test_broadcast_full_group",
    "test_send_recv_with_tag",
    "test_all_gather_object_subgroup",
    "test_DistributedDataParallelCPU",
]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_suite_slice_passes_on_guard(tmp_path):
    out = tmp_path / "guard.json"
    cmd = [sys.executable, os.path.join(HERE, "run_torch_suite.py"), "--backend", "guard",
           "--out", str(out), "--log-dir", str(tmp_path / "logs"), "--test-timeout", "120",
           "--tests", ",".join(SLICE)]
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=580)
    assert out.exists(), f"runner wrote no result:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    results = json.loads(out.read_text())["results"]
    assert results, "no test ran"
    bad = {n: r for n, r in results.items() if n in SLICE and r["status"] != "passed"}
    missing = [n for n in SLICE if n not in results]
    assert not bad and not missing, f"not passed: {bad}; missing: {missing}"
