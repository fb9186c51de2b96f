"""Packaging as a new user meets it, each install outside the source tree.

- The sdist, built from a clean copy of the checkout with the lowest setuptools
  pyproject.toml declares, holds every source and header; ``pip wheel
  --no-build-isolation`` builds a wheel from it (with this environment's
  setuptools, the newest we know); installed into a fresh venv as a new user
  has it (the wheel and what it declares: torch, packaging, with their own
  dependencies; none of the test set-up's packages, numpy among them, is in
  sight), that wheel
  runs a 2-rank guard job and the ``torch-ext-diagnose`` console script.
- ``pip install --no-build-isolation .`` (non-editable) from the clean copy,
  with the lowest declared setuptools, does the same.

Each build compiles the extension again (about 3 minutes on 2 cores; seconds
when ccache, which scripts/setup.sh installs, has seen the sources), so these
tests are marked ``packaging``: the default pytest run leaves them out, and
scripts/test.sh runs them beside the other tests (on one pytest-xdist worker). The
build environments reuse this interpreter's packages (torch, pip, build, ninja)
through a plain-path .pth file, so only the setuptools under test is installed
(the same torch path keeps ccache's objects valid); an editable torch_ext of
this interpreter stays out: its .pth hooks are not run. The new user's venv
sees only what pip installs with the wheel (torch, packaging and their
dependencies, linked from here).
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import tomllib
import torch

import torch_ext
from harness import ROOT, run_script

# xdist_group: under pytest -n the module's builds and environments (module fixtures) are made once, on one worker.
# slow: the group's builds take minutes; started first, it does not end the run alone (conftest.py).
pytestmark = [pytest.mark.packaging, pytest.mark.xdist_group("packaging"), pytest.mark.slow]

BUILD_TIMEOUT = 1200  # one full compile is ~3 min on 2 idle cores; CI machines are shared

JOB = '''\
"""A 2-rank guard job run by an installed torch_ext: a collective, then a mismatch it must name."""
import os
import sys
import time

import torch
import torch.distributed as dist

import torch_ext

rank = int(os.environ["RANK"])
print(f"[rank {rank}] torch_ext {torch_ext.__version__} from {torch_ext.__file__}", flush=True)
dist.init_process_group("guard")
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
print(f"[rank {rank}] all_reduce -> {t.tolist()}", flush=True)

# A cross-rank check of torch_ext's own (it gathers Python objects, without numpy).
torch_ext.BucketBatchSampler([i % 3 for i in range(12)], 2, seed=0).check_consistent()
print(f"[rank {rank}] sampler consistent", flush=True)

g = dist.new_group(backend="guard", group_desc="packaged", pg_options=torch_ext.GuardOptions(interval=0.1))
try:
    if rank == 0:
        dist.reduce(torch.ones(8), dst=0, group=g)  # rank 0 only: the classic bug
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        dist.all_reduce(torch.ones(8), group=g)
    print(f"[rank {rank}] no error", flush=True)
except torch_ext.CollectiveMismatchError as e:
    print(f"[rank {rank}] CollectiveMismatchError: {e}", flush=True)
dist.destroy_process_group()
'''


def _floor() -> str:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        requires = tomllib.load(f)["build-system"]["requires"]
    (spec,) = [r for r in requires if r.startswith("setuptools")]
    m = re.fullmatch(r"setuptools>=([\d.]+)", spec)
    assert m, f"the setuptools requirement {spec!r} must be a plain floor, `setuptools>=X`"
    return m.group(1)


def _run(cmd: list, cwd=None, timeout: float = BUILD_TIMEOUT, **extra: str) -> str:
    env = dict(os.environ, MAX_JOBS=os.environ.get("MAX_JOBS", "2"), PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{out[-8000:]}"
    return out


def _environment(path: Path, setuptools: str | None = None) -> Path:
    """A fresh environment outside the tree, seeing this interpreter's packages after its own."""
    _run([sys.executable, "-m", "venv", "--without-pip", path])
    python = path / "bin" / "python"
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    # Plain paths: the .pth files in them (an editable torch_ext among them) are not run.
    parents = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    Path(site, "_parent_packages.pth").write_text("\n".join(parents) + "\n", encoding="utf-8")
    if setuptools is not None:
        _run([python, "-m", "pip", "install", "-q", "--ignore-installed", "--no-deps", f"setuptools=={setuptools}"])
        assert _run([python, "-c", "import setuptools; print(setuptools.__version__)"]).strip() == setuptools
    return python


def _clean_checkout(dest: Path) -> Path:
    """The tree as git sees it (tracked and new files, nothing ignored): no build outputs."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = Path(ROOT, rel)
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    assert (dest / "setup.py").is_file() and not (dest / "build").exists()
    return dest


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("packaging")


@pytest.fixture(scope="module")
def checkout(work) -> Path:
    return _clean_checkout(work / "src")


@pytest.fixture(scope="module")
def floor_env(work) -> Path:
    return _environment(work / "floor-env", setuptools=_floor())


@pytest.fixture(scope="module")
def sdist(work, checkout, floor_env) -> Path:
    out = _run([floor_env, "-m", "build", "--sdist", "--no-isolation", "--outdir", work / "dist", checkout])
    (path,) = (work / "dist").glob("torch_ext-*.tar.gz")
    assert "Successfully built" in out, out
    return path


@pytest.fixture(scope="module")
def wheel_env(work, sdist) -> tuple[Path, Path]:
    """The wheel built from the sdist (this environment's setuptools), installed in a fresh environment."""
    _run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", work / "wheels", sdist],
         cwd=work)
    (wheel,) = (work / "wheels").glob("torch_ext-*.whl")
    return _newcomer_environment(work / "wheel-env", wheel), wheel


def _newcomer_environment(path: Path, wheel: Path) -> Path:
    """A new user's environment: a fresh venv that sees none of this one's packages (no numpy, no lightning) but
    what pip installs with the wheel: what it declares (torch, packaging) and their own dependencies.

    Those are linked from this interpreter's site-packages, where pip put them (installing torch again costs
    about a minute of the packaging worker); the wheel itself is installed by pip. The README's first command
    is run in a venv where pip installs torch from the index (.ci/check_demo).
    """
    _run([sys.executable, "-m", "venv", path])
    python = path / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip())
    for dist in _dependency_closure(["torch", "packaging"]):
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in sorted(tops - {"__pycache__"}):
            if not top.endswith(".pth") and not (site / top).exists():
                (site / top).symlink_to(Path(str(dist.locate_file(top))))
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel])
    # What the job below proves holds only where the test set-up's packages are out of sight.
    hidden = _run([python, "-c", "import importlib.util as u; print([m for m in ('numpy', 'lightning', 'pytest') "
                   "if u.find_spec(m)])"]).strip()
    assert hidden == "[]", f"the fresh environment sees {hidden}"
    return python


def _dependency_closure(names: list[str]) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``names`` need, theirs included (extras left out), as pip would install them."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = re.match(r"[A-Za-z0-9_.\-]+", todo.pop()).group(0)
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in found:
            continue
        found[key] = importlib.metadata.distribution(name)
        todo += [req for req in found[key].requires or [] if "extra ==" not in req]
    return list(found.values())


@pytest.fixture(scope="module")
def floor_install(floor_env, checkout) -> Path:
    """``pip install --no-build-isolation .`` from the clean checkout, with the lowest declared setuptools."""
    _run([floor_env, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "."], cwd=checkout)
    return floor_env


def test_sdist_holds_every_source_and_no_build_output(sdist, checkout):
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    sources = {str(p.relative_to(checkout)) for p in (checkout / "csrc").rglob("*") if p.is_file()}
    assert any(s.endswith(".h") for s in sources)
    assert sources <= names, f"missing from the sdist: {sorted(sources - names)}"
    assert {"setup.py", "pyproject.toml", "LICENSE", "README.md", "MANIFEST.in"} <= names
    assert not [n for n in names if n.endswith((".so", ".o")) or n.endswith("_build_info.py")], names


def test_wheel_from_sdist_records_torch_and_license(wheel_env):
    _python, wheel = wheel_env
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert [n for n in names if re.fullmatch(r"torch_ext/_C\..*\.so", n)], names
        info = z.read("torch_ext/_build_info.py").decode()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = z.read(metadata).decode()
        assert [n for n in names if n.endswith(".dist-info/licenses/LICENSE")], names
    assert f"TORCH_VERSION = {str(torch.__version__)!r}" in info
    assert "License-Expression: BSD-3-Clause" in meta
    assert f"Version: {torch_ext.__version__}\n" in meta


def _guard_job_outside_tree(python: Path, where: Path, tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB, encoding="utf-8")
    dumps = tmp_path / "dumps"
    proc = run_script([str(job)], tmp_path, 180, nproc=2, python=str(python), source_tree=False,
                      TORCH_EXT_DUMP_DIR=str(dumps), PYTHONWARNINGS="ignore")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    for rank in (0, 1):
        m = re.search(rf"\[rank {rank}\] torch_ext \S+ from (\S+)", out)
        assert m and Path(m.group(1)).resolve().is_relative_to(where.resolve()), out[-8000:]
        assert f"[rank {rank}] all_reduce -> [3.0, 3.0, 3.0, 3.0]" in out, out[-8000:]
        assert f"[rank {rank}] sampler consistent" in out, out[-8000:]
        assert f"[rank {rank}] CollectiveMismatchError" in out, out[-8000:]
    assert re.search(r"rank 0: +reduce\(float32\[8\], SUM, dst=0\)", out), out[-8000:]

    # The console script pip wrote for this environment (torch's own warning about a missing numpy left out).
    script = python.parent / "torch-ext-diagnose"
    diag = _run([script, dumps], cwd=tmp_path, timeout=120, PYTHONWARNINGS="ignore")
    assert "reduce(float32[8], SUM, dst=0)" in diag, diag
    version = _run([script, "--version"], cwd=tmp_path, timeout=120, PYTHONWARNINGS="ignore")
    assert version.split()[:2] == ["torch_ext", torch_ext.__version__], version
    assert f"(compiled against torch {torch.__version__}, running torch {torch.__version__})" in version, version
    assert Path(version.split(" at ")[-1].strip()).is_relative_to(where.resolve()), version


def test_wheel_from_sdist_runs_a_guard_job_outside_the_tree(wheel_env, work, tmp_path):
    python, _wheel = wheel_env
    _guard_job_outside_tree(python, work / "wheel-env", tmp_path)


def test_non_editable_install_with_lowest_setuptools_runs_a_guard_job(floor_install, work, tmp_path):
    _guard_job_outside_tree(floor_install, work / "floor-env", tmp_path)


def test_older_setuptools_is_refused_naming_the_upgrade(work, checkout):
    """65.5.0 is what a fresh Python 3.11 venv has; pip does not check build requirements
    without build isolation, so setup.py must, before pyproject.toml's license field fails."""
    python = _environment(work / "old-env", setuptools="65.5.0")
    proc = subprocess.run([python, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "."], cwd=checkout,
                          capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert f"torch_ext needs setuptools>={_floor()} to build, found 65.5.0" in out, out
    assert f"pip install 'setuptools>={_floor()}'" in out, out
