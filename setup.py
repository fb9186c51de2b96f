"""Builds torch_ext._C: the C++ core (csrc/**) plus its one pybind11 bindings file.

The extension must be compiled against the torch it will run with, so it is always
built without build isolation (an isolated build would download another torch,
usually a multi-GB CUDA one):

    pip install --no-build-isolation -e .                 # a checkout, editable
    pip install --no-build-isolation .                    # a checkout, as a wheel
    pip wheel --no-build-isolation torch_ext-X.tar.gz     # from the sdist

What this file adds to torch's BuildExtension:
- a clear error, naming the fix, for a setuptools older than pyproject.toml's
  floor and for a build that cannot import torch (an isolated one);
- every include path is absolute: ninja runs in the build directory, not here;
- the build directory is ``build/temp.<platform>-<python>`` under this folder, also
  for editable installs (setuptools would use a fresh temporary one), and the
  decision what to recompile is left to ninja, which knows every header
  (torch's too): an unchanged tree rebuilds in seconds;
- with ccache installed (torch's build then uses it), objects are shared with
  builds of the same sources in other folders (an unpacked sdist);
- a unity build: the sources are compiled as five translation units (one per
  folder of the core, the bindings alone), each including its folder's .cpp
  files, so torch's headers are parsed 5 times instead of 61: a fresh build
  takes about a third of the CPU time (docs/testing.md, "CI time");
- ``torch_ext/_build_info.py`` records the torch the extension was compiled
  against, so ``import torch_ext`` can refuse another torch with a clear error
  before loading ``_C`` (which would fail with an undefined symbol, or crash).
"""
import os
import re
import sys
from pathlib import Path

import setuptools

# Absolute: setuptools may run this file as a relative "setup.py", and a relative
# include directory breaks the compile (ninja runs in the build directory).
ROOT = Path(__file__).resolve().parent
PACKAGE = "torch_ext"


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version)[:3])


# The floor declared in pyproject.toml, which CI builds with (tests/python/
# test_packaging.py). pip does not check build requirements without build
# isolation, and an older setuptools fails obscurely: before 77 on
# pyproject.toml's license field, 77.x on torch's BuildExtension.with_options.
SETUPTOOLS_FLOOR = re.search(r'"setuptools>=([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
if _release(setuptools.__version__) < _release(SETUPTOOLS_FLOOR):
    sys.exit(f"torch_ext needs setuptools>={SETUPTOOLS_FLOOR} to build, found {setuptools.__version__} "
             f"({setuptools.__file__}).\nUpgrade it, then build again without build isolation:\n"
             f"  pip install 'setuptools>={SETUPTOOLS_FLOOR}'")
try:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError as e:
    sys.exit(f"torch_ext compiles against the installed torch, but torch cannot be imported ({e}).\n"
             "Install torch first, then build without build isolation (an isolated build has no torch):\n"
             "  pip install --no-build-isolation .")

# torch's build compiles through ccache when it is installed. With paths under
# this folder hashed relative to it (base_dir), and no debug info (-g0, below),
# a build of the same sources in another folder (an unpacked sdist, a second
# checkout) reuses the objects.
os.environ.setdefault("CCACHE_BASEDIR", str(ROOT))


def _files(pattern: str) -> list[str]:
    # Relative to this folder (where pip and build run this file): the sdist
    # refuses absolute paths. torch makes the sources absolute for ninja.
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob(pattern))


# The unity build's translation units: name -> the .cpp files (relative to csrc)
# it includes. The bindings (csrc/python) are one of their own (bindings.cpp): the GoogleTest
# suite (tests/cpp) links the others, the Python-free core. A file-private name
# (anonymous namespace, static) must not repeat in another file of its unit;
# scripts/check_torch_headers.sh --unity (in CI) compiles all of them as one.
UNITY_DIR = ROOT / "build" / "unity"


def _unity_name(source: str) -> str:
    parts = Path(source).relative_to("csrc").parts
    if parts[0] == "python":
        # The longest unit (torch's pybind headers: about 33 CPU-s of a 120 CPU-s build), named to sort first:
        # ninja starts the units in name order, and on 2 cores this one then runs beside the others rather
        # than alone at the end (a build from scratch: 75 -> 66 s).
        return "bindings"
    if parts[0] == "guard":
        return f"guard_{parts[1]}" if parts[1] in ("report", "collective", "modes") else "guard"
    return "ops"  # nccl_sim, ops, sampling, and any new folder


def _unity_sources(sources: list[str]) -> list[str]:
    """Writes build/unity/<name>.cpp (only where its text changed, so ninja's times stay) and returns them.

    Sources outside csrc/ (a unit already, on a second build in one process) are kept as they are.
    """
    units: dict[str, list[str]] = {}
    out = [s for s in sources if Path(s).parts[0] != "csrc"]
    for source in sorted(s for s in sources if Path(s).parts[0] == "csrc"):
        units.setdefault(_unity_name(source), []).append(str(Path(source).relative_to("csrc")))
    UNITY_DIR.mkdir(parents=True, exist_ok=True)
    for stale in UNITY_DIR.glob("*.cpp"):  # a unit renamed or gone: the C++ tests link every unit's object
        if stale.stem not in units:
            stale.unlink()
    for name, members in sorted(units.items()):
        text = ("// Generated by setup.py (a unity build of torch_ext._C); not in git or the sdist.\n"
                + "".join(f'#include "{m}"\n' for m in members))
        path = UNITY_DIR / f"{name}.cpp"
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        out.append(str(path.relative_to(ROOT)))
    return out


def _build_info() -> str:
    return (
        "# Generated by setup.py when torch_ext._C was compiled (not in git, not in the sdist).\n"
        "# torch_ext/_extension.py compares TORCH_VERSION with the running torch before loading _C.\n"
        f"TORCH_VERSION = {str(torch.__version__)!r}\n"
    )


class BuildTorchExt(BuildExtension):
    def finalize_options(self) -> None:
        super().finalize_options()
        # One persistent build directory per platform and Python, also for
        # editable installs, whose default is a fresh temporary one (a full
        # rebuild every time). Same path as a non-editable in-tree build.
        tag = f"temp.{self.plat_name}-{sys.implementation.cache_tag}"
        self.build_temp = str(ROOT / "build" / tag)
        # setuptools skips an extension whose output is newer than its sources;
        # it knows neither our headers' nor torch's changes. ninja does (depfiles,
        # command lines), so always ask it: nothing to do costs one link.
        self.force = True

    def build_extensions(self) -> None:
        # The declared sources stay the .cpp files (the sdist holds them); the
        # compiler gets the unity units that include them.
        for ext in self.extensions:
            ext.sources = _unity_sources(ext.sources)
        super().build_extensions()

    def run(self) -> None:
        super().run()
        targets = {Path(self.build_lib) / PACKAGE}
        if self.inplace:
            build_py = self.get_finalized_command("build_py")
            targets.add(Path(build_py.get_package_dir(PACKAGE)).resolve())
        for folder in targets:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "_build_info.py").write_text(_build_info(), encoding="utf-8")

    def get_outputs(self) -> list[str]:
        return [*super().get_outputs(), str(Path(self.build_lib) / PACKAGE / "_build_info.py")]


setuptools.setup(
    ext_modules=[
        CppExtension(
            name=f"{PACKAGE}._C",
            sources=_files("*.cpp"),
            # Headers too: they go into the sdist, and setuptools knows them.
            depends=_files("*.h"),
            include_dirs=[str(ROOT / "csrc")],
            # -g0 overrides the -g of Python's own flags: debug info for torch's
            # headers made each object a third slower to compile (16.8 s against
            # 10.1 s for GuardBackend.cpp) and the library 45 MB.
            # -std=c++20: the code needs C++20 (defaulted operator==, ...), and
            # BuildExtension's default is the standard torch was built with:
            # -std=c++17 in torch 2.11 (what the GPU runners have), c++20 in 2.13.
            # BuildExtension adds its own -std only when these flags have none, so
            # this is the only one on the command line (after Python's flags).
            # Only .cpp sources: no nvcc flags to set.
            # -Wno-subobject-linkage: in a unity unit a class of one .cpp holding a
            # type of its anonymous namespace looks like a header's (a false alarm).
            # -O1, not -O2: -O2's inlining and passes took half the build's CPU
            # (167 CPU-s against 110 for the five units; 90 s against 67 s for a
            # fresh `pip install -e .` on 2 cores), and bought nothing measurable
            # where the guard spends its time, which is mutexes, atomics and
            # maps: its own cost per collective over the no-op inner and the
            # world-2 loops of benchmarks/waited.py read the same, alternated
            # (docs/performance.md, "Build optimisation level").
            extra_compile_args={"cxx": ["-O1", "-g0", "-Wall", "-Wno-unused-parameter", "-Wno-subobject-linkage",
                                        "-std=c++20"]},
        )
    ],
    cmdclass={"build_ext": BuildTorchExt.with_options(use_ninja=True)},
)
