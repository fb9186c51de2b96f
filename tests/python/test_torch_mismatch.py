"""``import torch_ext`` with a ``_C`` compiled against another torch: one clear ImportError,
naming both versions and the rebuild command, raised before ``_C`` is loaded.

The package (with its built ``_C``) is copied to a temporary folder and its
recorded torch version faked; a fresh interpreter imports the copy. The copy with
the true record must import (so the failures come from the check, not the copy).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from packaging.version import Version

import torch_ext
from harness import run_script
from torch_ext import _extension

RUNNING = str(torch.__version__)

PROBE = """\
import sys
# This interpreter's editable install of torch_ext (a meta path finder) would
# resolve torch_ext._C from its own tree when the copy lacks one: drop it.
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
try:
    import torch_ext
    print("imported", torch_ext._C.__file__)
except ImportError as e:
    print("ImportError:", e)
print("_C loaded:", "torch_ext._C" in sys.modules)
print("checked by:", sys.modules["torch_ext._extension"].__file__)
"""


def _copy(tmp_path: Path, recorded: str | None, checkout: bool = False, with_c: bool = True) -> Path:
    """A copy of the built package under ``tmp_path``, laid out as an installed wheel or a checkout."""
    ignore = ["__pycache__", "_build_info.py"] + ([] if with_c else ["_C.*"])
    shutil.copytree(Path(torch_ext.__file__).parent, tmp_path / "torch_ext", ignore=shutil.ignore_patterns(*ignore))
    if recorded is not None:
        (tmp_path / "torch_ext" / "_build_info.py").write_text(f"TORCH_VERSION = {recorded!r}\n", encoding="utf-8")
    if checkout:
        (tmp_path / "setup.py").write_text("# a checkout\n", encoding="utf-8")
        (tmp_path / "csrc").mkdir()
    return tmp_path


def _import(root: Path) -> str:
    proc = run_script(["-c", PROBE], root, 120, source_tree=False, PYTHONPATH=str(root))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"checked by: {root / 'torch_ext' / '_extension.py'}" in out, out  # the copy, not the tree
    return out


def _other_label(version: str) -> str:
    """The same release as ``version``, built differently (another local label)."""
    v = Version(version)
    return f"{v.public}+{'cu128' if v.local != 'cu128' else 'cpu'}"


def test_the_build_recorded_the_running_torch():
    assert _extension.built_against() == RUNNING


def test_copy_with_the_true_record_imports(tmp_path):
    out = _import(_copy(tmp_path, RUNNING))
    assert "imported " + str(tmp_path / "torch_ext") in out and "_C loaded: True" in out, out


@pytest.mark.parametrize("built", ["2.12.0", "other-label"])
def test_another_torch_is_refused_before_loading_C(tmp_path, built):
    if built == "other-label":
        built = _other_label(RUNNING)
    out = _import(_copy(tmp_path, built))
    assert (f"ImportError: torch_ext {torch_ext.__version__} was compiled against torch {built}, "
            f"but torch {RUNNING} is installed") in out, out
    # An installed wheel holds no sources: rebuild from the sdist.
    assert (f"-m pip install --no-build-isolation --force-reinstall --no-deps "
            f"torch_ext-{torch_ext.__version__}.tar.gz") in out, out
    assert "_C loaded: False" in out and "undefined symbol" not in out, out


def test_in_a_checkout_the_message_names_the_editable_rebuild(tmp_path):
    built = _other_label(RUNNING)
    out = _import(_copy(tmp_path, built, checkout=True))
    assert f"compiled against torch {built}, but torch {RUNNING} is installed" in out, out
    assert f"-m pip install --no-build-isolation -e {tmp_path}\n" in out, out
    assert "_C loaded: False" in out, out


def test_unbuilt_checkout_says_how_to_build(tmp_path):
    out = _import(_copy(tmp_path, None, checkout=True, with_c=False))
    assert f"ImportError: torch_ext._C is not built in {tmp_path / 'torch_ext'}" in out, out
    assert f"-m pip install --no-build-isolation -e {tmp_path}" in out, out


@pytest.mark.parametrize("built, running, same", [
    ("2.13.0+cpu", "2.13.0+cpu", True),
    ("2.13.0", "2.13.0", True),
    ("2.13", "2.13.0", True),           # the same release, spelled shorter
    ("2.13.0+cpu", "2.13.0+cu128", False),  # a CPU and a CUDA build of one release
    ("2.13.0", "2.13.0+cpu", False),
    ("2.13.0", "2.13.1", False),
    ("2.13.0a0+git1234", "2.13.0a0+git5678", False),  # two source builds
])
def test_what_counts_as_another_torch(built, running, same):
    assert _extension.same_torch(built, running) is same


@pytest.mark.parametrize("running, supported", [
    ("2.10.1", False),
    ("2.11.0", True),
    ("2.11.0+cu130", True),        # what the GPU runners have
    ("2.13.0+cpu", True),
    ("2.15.0a0+git1234", True),    # a pre-release of a supported release
    ("2.16.0", False),
    ("3.0.0", False),
])
def test_which_torch_releases_are_supported(running, supported):
    assert _extension.supported_torch(running) is supported
    if not supported:
        msg = _extension.unsupported_message("0.1.0", running)
        assert f"supports torch 2.11 to 2.15, but torch {running} is installed" in msg, msg
        assert "pip install 'torch>=2.11,<2.16'" in msg, msg


def test_flight_recorders_hook_leaves_guard_groups_alone_only_where_the_inner_backends_record(monkeypatch):
    # torch 2.15's distributed_c10d._FR_SELF_RECORDING_BACKENDS (gloo, nccl-legacy, ...): the
    # backends whose groups its Flight Recorder hook skips. Absent before 2.15: nothing happens.
    import torch.distributed as dist

    from torch_ext import _compat

    monkeypatch.delattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", raising=False)
    assert _compat.mark_flight_recorder_native("guard", {"gloo"}) is False
    native = {"gloo", "nccl-legacy", "fake"}
    monkeypatch.setattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", native, raising=False)
    # 2.15's default NCCL (nccl2) does not record itself: the hook's entries are the only ones.
    assert _compat.mark_flight_recorder_native("guard", {"gloo", "nccl"}) is False
    assert "guard" not in native
    assert _compat.mark_flight_recorder_native("guard", {"gloo"}) is True
    assert native == {"gloo", "nccl-legacy", "fake", "guard"}
