"""PyTorch's own point-to-point tests (the wheel's distributed_test.py) on guard, in the
default check mode and in strict mode: send/recv, isend, irecv and tagged pairs in the
orders PyTorch's suite uses pass unchanged (issue 23: no false alarm in any mode; the
irecv-before-isend programs are in test_verify.py).

Each test of the suite starts two ranks; spawned as in PyTorch's CI, each imports torch
and the suite again (5-20 s per test on 2 cores), so the ranks are forked from the
runner, which has imported them once (``--start-method fork``: the whole file in about
10 s instead of 80). The full suite on spawned ranks: ``tests/conformance``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("expecttest", reason="torch.testing._internal needs expecttest (scripts/setup.sh installs it)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNNER = os.path.join(ROOT, "tests", "conformance", "run_torch_suite.py")
P2P = ["test_irecv", "test_isend", "test_send_recv_with_tag"]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("mode", ["verify", "strict"])
def test_torch_suite_p2p_tests_pass_on_guard(tmp_path, mode):
    out = tmp_path / "guard.json"
    cmd = [sys.executable, RUNNER, "--backend", "guard", "--out", str(out), "--log-dir", str(tmp_path / "logs"),
           "--test-timeout", "120", "--tests", ",".join(P2P), "--start-method", "fork"]
    env = dict(os.environ, TORCH_EXT_CHECK=mode)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=380)
    assert out.exists(), f"runner wrote no result:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    results = json.loads(out.read_text())["results"]
    bad = {n: r for n, r in results.items() if n in P2P and r["status"] != "passed"}
    missing = [n for n in P2P if n not in results]
    assert not bad and not missing, f"{mode}: not passed: {bad}; missing: {missing}\n{proc.stdout[-3000:]}"
