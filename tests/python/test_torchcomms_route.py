"""torchcomms and the guard (issue 55): refused at import where torch would send ``guard`` there, else unchanged.

From torch 2.13, with torchcomms installed and TORCH_DISTRIBUTED_USE_TORCHCOMMS=1,
torch creates every process-group backend but ``fake`` through
``torchcomms.new_comm``, so ``init_process_group("guard")`` would never reach the
guard (torchcomms would fail, naming a library path). torch 2.15 sends only the
backends torchcomms has built or registered there and lets other plugins through.

torchcomms is not on the package index (PyPI's ``torchcomms`` is an empty
placeholder), so these tests give torch a stand-in package with the names it
imports; torch's own routing decides the rest. Each run is real processes.
"""
from __future__ import annotations

import os
import textwrap

import pytest
import torch
import torch.distributed as dist

from harness import ROOT, run_script

# The names torch's distributed_c10d imports from torchcomms (2.13 to 2.15). The stand-in "builds" gloo and nccl,
# as the real one does, and creates no comm.
STAND_IN = {
    "__init__.py": """
        def new_comm(backend, device, **kwargs):
            raise RuntimeError(f"torchcomms stand-in: torch asked for a {backend!r} comm")

        def is_backend_built(name):
            return name in ("gloo", "nccl")
    """,
    "_comms.py": """
        class _BackendWrapper:
            pass

        def _is_backend_registered(name):
            return False
    """,
    "hooks.py": """
        class FlightRecorderHook:
            pass
    """,
}

JOB = """
import os
import torch
import torch.distributed as dist
import torch_ext

dist.init_process_group("guard")
t = torch.full((3,), float(dist.get_rank() + 1))
dist.all_reduce(t)
print(f"[rank {dist.get_rank()}] {torch_ext.describe()} -> {t.tolist()}", flush=True)
dist.destroy_process_group()
"""

# torch 2.15 and later ask torchcomms which backends it handles; before, it takes them all.
GUARD_PASSES = hasattr(dist.distributed_c10d, "_torchcomms_handles_backend")


def _stand_in(tmp_path) -> str:
    root = tmp_path / "site"
    (root / "torchcomms").mkdir(parents=True)
    for name, text in STAND_IN.items():
        (root / "torchcomms" / name).write_text(textwrap.dedent(text), encoding="utf-8")
    return str(root)


def _job(tmp_path, **env: str):
    job = tmp_path / "job.py"
    job.write_text(JOB, encoding="utf-8")
    return run_script([str(job)], tmp_path, 120, nproc=2, PYTHONWARNINGS="ignore", **env)


def _ran_guarded(proc) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    for rank in (0, 1):
        assert f"[rank {rank}] GuardBackend(" in out and "-> [3.0, 3.0, 3.0]" in out, out[-6000:]


def test_the_switch_with_torchcomms_refuses_import_in_one_line_or_lets_the_guard_run(tmp_path):
    env = {"TORCH_DISTRIBUTED_USE_TORCHCOMMS": "1", "PYTHONPATH": _path(_stand_in(tmp_path))}
    if GUARD_PASSES:
        _ran_guarded(_job(tmp_path, **env))
        return
    proc = run_script(["-c", "import torch_ext"], tmp_path, 120, **env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: torch_ext: TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 with torchcomms installed "
                           "makes torch "), proc.stderr
    assert "'guard' included, through torchcomms.new_comm, which has no guard: unset it" in last, last
    assert proc.stderr.count("torch_ext:") == 1, proc.stderr


def test_the_config_switch_is_refused_too(tmp_path):
    """``torch.distributed.config.use_torchcomms = True`` set before the import, not the variable."""
    if GUARD_PASSES:
        pytest.skip(f"torch {torch.__version__} lets the guard through (the test above runs a guard job)")
    code = "import torch.distributed.config as c; c.use_torchcomms = True; import torch_ext"
    proc = run_script(["-c", code], tmp_path, 120, PYTHONPATH=_path(_stand_in(tmp_path)))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ImportError: torch_ext: torch.distributed.config.use_torchcomms = True with torchcomms" in proc.stderr


def test_the_switch_without_torchcomms_changes_nothing(tmp_path):
    _ran_guarded(_job(tmp_path, TORCH_DISTRIBUTED_USE_TORCHCOMMS="1"))


def test_torchcomms_installed_without_the_switch_changes_nothing(tmp_path):
    _ran_guarded(_job(tmp_path, PYTHONPATH=_path(_stand_in(tmp_path))))


def _path(site: str) -> str:
    """The stand-in first, then the project root (an explicit PYTHONPATH replaces run_script's)."""
    return os.pathsep.join([site, ROOT, os.environ.get("PYTHONPATH", "")])
