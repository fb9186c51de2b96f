"""The README's configuration table is the one list of settings: it must name every
TORCH_EXT_* variable the core parses, with its GuardOptions field, and nothing else."""
from __future__ import annotations

import dataclasses
import os
import re

import torch_ext

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _readme() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_readme_table_lists_every_setting_once():
    rows = re.findall(r"^\| `(TORCH_EXT_[A-Z_]+)` \| `([a-z_]+)` \|", _readme(), flags=re.M)
    documented = {env: field for env, field in rows}
    assert len(rows) == len(documented), "a variable appears twice"
    core = {env: option for option, env, _default, _meaning in torch_ext._C.env_var_docs()}
    assert documented == core
    fields = {f.name for f in dataclasses.fields(torch_ext.GuardOptions)}
    assert set(core.values()) == fields


def test_resolved_settings_list_every_option_typed():
    # GuardOptions.resolved() comes from the same table: every option, typed.
    resolved = torch_ext.GuardOptions(store_budget=0, abort_after=2.5).resolved()
    options = {option for option, _env, _default, _meaning in torch_ext._C.env_var_docs()}
    assert options <= set(resolved), options - set(resolved)
    assert resolved["store_budget"] == 0 and isinstance(resolved["store_budget"], int)
    assert resolved["abort_after"] == 2.5
    assert torch_ext.GuardOptions().resolved()["abort_after"] is None
    assert resolved["source"]["store_budget"] == "GuardOptions(store_budget)"


def test_no_other_module_reads_torch_ext_variables():
    offenders = []
    for base in ("torch_ext", "csrc"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, base)):
            for name in files:
                if not name.endswith((".py", ".cpp", ".h")) or name == "Config.cpp":
                    continue
                with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                    text = f.read()
                if re.search(r"(getenv|environ)[^\n]*TORCH_EXT_", text):
                    offenders.append(os.path.join(dirpath, name))
    assert offenders == []


def test_the_test_time_variable_is_read_in_one_place_and_listed():
    # TORCH_EXT_GPU_RUNNER is for test suites, not jobs: torch_ext/testing/_gpu.py
    # reads it (gpu_runner()), and the README lists it in its own table.
    readers = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "torch_ext")):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                    if "os.environ.get(GPU_RUNNER_VAR" in f.read():
                        readers.append(os.path.relpath(os.path.join(dirpath, name), ROOT))
    assert readers == [os.path.join("torch_ext", "testing", "_gpu.py")]
    assert "| `TORCH_EXT_GPU_RUNNER` |" in _readme()


def test_readme_first_screen_has_the_two_commands():
    head = _readme().split("## Use it")[0]
    assert "bash scripts/demo.sh" in head and "bash scripts/test.sh" in head
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        assert "scripts/test.sh" in f.read()
