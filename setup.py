"""Builds torch_ext._C: the C++ core (csrc/**) plus its one pybind11 bindings file.

Build in place with ``pip install --no-build-isolation -e .`` so the installed torch is
used (an isolated build would download a CUDA torch).
"""
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = Path(__file__).parent
sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.cpp"))

setup(
    ext_modules=[
        CppExtension(
            name="torch_ext._C",
            sources=sources,
            include_dirs=[str(ROOT / "csrc")],
            extra_compile_args={"cxx": ["-O2", "-Wall", "-Wno-unused-parameter"]},
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
