"""The README's configuration table is the one list of settings: it must name every
TORCH_EXT_* variable the core parses, with its GuardOptions field, and nothing else."""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys

import torch_ext

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _readme() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_readme_table_lists_every_setting_once():
    rows = re.findall(r"^\| `(TORCH_EXT_[A-Z_]+)` \| `([a-z_]+)` \| [^|]* \| (job|rank) \|", _readme(), flags=re.M)
    documented = {env: (field, scope) for env, field, scope in rows}
    assert len(rows) == len(documented), "a variable appears twice"
    # Each variable's field and scope (job-wide: agreed when a group is created) as the core's table says.
    core = {env: (option, scope) for option, env, _default, scope, _meaning in torch_ext._C.env_var_docs()}
    assert documented == core
    core = {env: option for env, (option, _scope) in core.items()}
    fields = {f.name for f in dataclasses.fields(torch_ext.GuardOptions)}
    assert set(core.values()) == fields


def test_resolved_settings_list_every_option_typed():
    # GuardOptions.resolved() comes from the same table: every option, typed.
    resolved = torch_ext.GuardOptions(store_budget=0, abort_after=2.5).resolved()
    options = {option for option, _env, _default, _scope, _meaning in torch_ext._C.env_var_docs()}
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
                if not name.endswith((".py", ".cpp", ".h")):
                    continue
                with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                    text = f.read()
                # The guard's settings are read in Config.cpp, nccl_sim's switches in its
                # NcclSimSettings.cpp: each file reads only its own.
                own = {"Config.cpp": r"TORCH_EXT_(?!NCCL_SIM_)", "NcclSimSettings.cpp": r"TORCH_EXT_NCCL_SIM_"}
                # A named variable is a read; the bare prefix is not (torch_ext/testing/replay.py starts its
                # ranks without the caller's TORCH_EXT_* settings, then sets the job's).
                for m in re.finditer(r"(getenv|environ)[^\n]*?(TORCH_EXT_\w+)", text):
                    if name not in own or not re.match(own[name], m[2]):
                        offenders.append(f"{os.path.join(dirpath, name)}: {m[2]}")
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


# --- sample outputs: made by scripts/doc_samples.py from real runs ------------------------

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import doc_samples  # noqa: E402

doc_samples.WARM = True  # the examples forked from a warm interpreter (torch_ext.testing._warm)

# Output blocks that are not (yet) made by doc_samples.py, each with why. Every other fenced
# block showing torch_ext's output must be a marked sample. Keyed by file and the block's first line.
NOT_GENERATED = {
    ("docs/diagnostics.md", "collective #3 all_reduce(float32[4], SUM)"): "from a test function "
        "(test_hang_diagnostics.py::_uneven), not a script users run",
    ("docs/diagnostics.md", "collective #28 all_gather(float32[])"): "Lightning job under torchrun "
        "(tests/python/jobs/callsites), about 30 s: checked in substance by test_call_sites",
    ("docs/diagnostics.md", "collective #7 all_gather(float32[1])"): "Accelerate job (tests/python/jobs/callsites)",
    ("docs/diagnostics.md", "collective #25 barrier()"): "Lightning job (tests/python/jobs/callsites)",
    ("docs/diagnostics.md", "collective #1 on group \"default_pg\" (3 ranks)"): "from a test function "
        "(test_library_labels.py::_accelerate_rank0), checked in substance there",
    ("docs/diagnostics.md", 'collective #13 on group "default_pg" (2 ranks)'): "from a test function "
        "(test_tensor_labels.py::_ddp_buffer_replaced_on_rank_1), checked in substance there",
    ("docs/diagnostics.md", 'collective #2 on group "default_pg" (2 ranks)'): "from a test function "
        "(test_tensor_labels.py::_fsdp2_module_skipped_on_rank_1), checked in substance there",
    ("docs/diagnostics.md", "collective #28 barrier()"): "Lightning job (tests/python/jobs/callsites), about 30 s: "
        "checked in substance by test_call_sites' epoch metric sync test",
    ("docs/performance.md", "collective #2 all_reduce(float32[1], SUM)"): "32 ranks (benchmarks/checks.py scale): "
        "a benchmark's recorded run, not a CI-sized one",
    ("docs/testing.md", "test_train.py::test_one_rank_skips_an_all_reduce"): "pytest plugin output, trimmed by hand "
        "(marked 'trimmed' in the text)",
    ("docs/diagnostics.md", '{"ph": "X", "cat": "guard,completed"'): "excerpt of post_mortem/trace.json, wrapped "
        "by hand; its fields are checked by test_post_mortem.py's trace test",
    ("docs/diagnostics.md", '{"ph": "i", "s": "p", "name": "culprit: rank 3'): "excerpt of post_mortem/trace.json, "
        "wrapped by hand (as above)",
    ("docs/diagnostics.md", '[rank1] 02:59:06 torch_ext WARNING: group "default_pg": check=verify here'): "a job "
        "whose ranks have different environments (tests/python/jobs/join_job.py): the line is checked by test_join.py",
    ("docs/diagnostics.md", "[rank0] 03:02:50 torch_ext WARNING: guard group"): "a rank held before "
        "init_process_group under torchrun (test_join.py checks the error's lines)",
}
_OUTPUT = re.compile(r"collective #\d|torch_ext (WARNING|ERROR)|raised \w+Error|torch_ext diagnose:|\{\"ph\": ")


def _fenced_output_blocks():
    for rel in doc_samples.DOCS:
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            lines = f.read().split("\n")
        i = 0
        while i < len(lines):
            if lines[i].strip().startswith("```"):
                end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
                if lines[i].strip() == "```":  # no language: output, not code
                    yield rel, i, lines[i - 1] if i else "", lines[i + 1:end]
                i = end + 1
            else:
                i += 1


def test_every_sample_is_known_and_marked_once():
    assert doc_samples.check_names() == []


def test_every_block_of_torch_ext_output_is_a_generated_sample_or_says_why_not():
    unmarked = []
    exempt_seen = set()
    for rel, i, before, body in _fenced_output_blocks():
        if doc_samples.MARKER.match(before) or not body or not _OUTPUT.search("\n".join(body)):
            continue
        key = next((k for k in NOT_GENERATED if k[0] == rel and body[0].lstrip("$ ").startswith(k[1])), None)
        if key:
            exempt_seen.add(key)
        else:
            unmarked.append(f"{rel}:{i + 1}: {body[0][:80]}")
    assert unmarked == [], "output blocks without '<!-- sample: NAME -->' (add them to scripts/doc_samples.py)"
    assert exempt_seen == set(NOT_GENERATED), set(NOT_GENERATED) - exempt_seen  # no stale exemption


def test_output_blocks_hold_no_absolute_path_of_a_machine():
    for rel, i, _before, body in _fenced_output_blocks():
        text = "\n".join(body)
        assert not re.search(r"(^|[\s(\['\"])/(work|home|tmp|root|__w|Users)/", text), f"{rel}:{i + 1}"


def test_a_sample_edited_by_hand_fails_the_check_and_write_restores_it(tmp_path):
    # A copy of the docs with one sample edited by hand, checked against one real run.
    copy = tmp_path / "copy"
    (copy / "docs").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "README.md"), copy / "README.md")
    for rel in doc_samples.DOCS[1:]:
        shutil.copy(os.path.join(ROOT, rel), copy / rel)
    path = copy / "docs" / "diagnostics.md"
    original = path.read_text()
    block = next(b for b in doc_samples.blocks(str(copy)) if b.name == "rank0-only-reduce")
    assert "in log_metrics" in block.text
    path.write_text(original.replace(block.text, block.text.replace("in log_metrics", "in log_metric")))
    script = os.path.join(ROOT, "scripts", "doc_samples.py")
    outputs = tmp_path / "outputs"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, script, *args, "--root", str(copy)], capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))

    out = run("--check", "rank0-only-reduce", "--keep", str(outputs))  # the one real run
    assert out.returncode == 1, out.stdout + out.stderr
    assert "docs/diagnostics.md:" in out.stderr and "sample 'rank0-only-reduce' differs" in out.stderr, out.stderr
    assert "-  rank 0:    reduce(float32[1], SUM, dst=0)  at rank0_only_reduce.py:19 in log_metric" in out.stderr
    # --write puts the real output back; the check then passes.
    out = run("--write", "rank0-only-reduce", "--reuse", str(outputs))
    assert out.returncode == 0 and "rewrote samples in docs/diagnostics.md" in out.stdout, out.stdout + out.stderr
    assert doc_samples.mask(path.read_text()) == doc_samples.mask(original)
    out = run("--check", "rank0-only-reduce", "--reuse", str(outputs))
    assert out.returncode == 0 and "1 sample(s) from 1 run(s) match the docs" in out.stdout, out.stdout + out.stderr


def test_readme_lists_every_nccl_sim_switch():
    with open(os.path.join(ROOT, "csrc", "nccl_sim", "NcclSimSettings.cpp"), encoding="utf-8") as f:
        parsed = set(re.findall(r'"(TORCH_EXT_NCCL_SIM_[A-Z]+)"', f.read()))
    assert parsed, "NcclSimSettings.cpp reads the nccl_sim switches"
    listed = set(re.findall(r"^\| `(TORCH_EXT_NCCL_SIM_[A-Z]+)` \|", _readme(), flags=re.M))
    assert listed == parsed
