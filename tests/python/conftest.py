"""Shared fixtures and markers for torch_ext's tests."""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))


def pytest_collection_modifyitems(config, items):
    # GPU tests skip without CUDA, except on a GPU runner (TORCH_EXT_GPU_RUNNER=1),
    # where missing GPUs are a failure rather than a silent skip.
    gpu_runner = os.environ.get("TORCH_EXT_GPU_RUNNER") == "1"
    have = torch.cuda.is_available()
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        need = int(marker.kwargs.get("count", 1))
        count = torch.cuda.device_count() if have else 0
        if count >= need:
            continue
        if not gpu_runner:
            item.add_marker(pytest.mark.skip(reason=f"needs {need} CUDA device(s), found {count}"))


@pytest.fixture(autouse=True)
def _gpu_runner_guard(request):
    marker = request.node.get_closest_marker("gpu")
    if marker is not None and os.environ.get("TORCH_EXT_GPU_RUNNER") == "1":
        need = int(marker.kwargs.get("count", 1))
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count < need:
            pytest.fail(f"GPU runner: test needs {need} CUDA device(s) but {count} are visible")
