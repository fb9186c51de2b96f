"""Every command README.md and docs/ show runs as written in CI, or says why not (issue 69).

scripts/doc_commands.py finds them (fenced and indented blocks, code spans) and gives each a verdict:
run here as written, run by the doc-sample runner (its output is a sample), its flags parsed by the
benchmark's own parser, or not run with a reason. A command with no verdict fails here.
"""
from __future__ import annotations

import os
import sys
import tempfile

import pytest

from harness import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import doc_commands  # noqa: E402
import doc_samples  # noqa: E402

COMMANDS = doc_commands.commands()


def test_every_documented_command_has_a_verdict():
    missing = [f"{c.path}:{c.line}: {c.text}" for c in COMMANDS if doc_commands.verdict(c) is None]
    assert not missing, "commands in the docs with no rule in scripts/doc_commands.py RULES:\n" + "\n".join(missing)


def test_the_finder_sees_the_commands_readers_copy():
    # The test above can fail only if the finder sees them: the README's two commands, an indented benchmark
    # command with its comment, an inline one, a command continued on the next line.
    found = {c.text: doc_commands.verdict(c).how for c in COMMANDS}
    assert found["bash scripts/demo.sh"] == found["bash scripts/test.sh"] == "skip"
    assert found["torch-ext-diagnose --version"] == "run"
    assert found["python benchmarks/step_sync.py"] == "flags"
    assert found["python examples/bugs/rank0_dies.py stop"] == "sample"
    assert any(t.startswith("PIP_CONFIG_FILE=/dev/null /work/v215/bin/pip install torch==2.15.0") and
               t.endswith("torchmetrics==1.9.0") for t in found), sorted(found)
    assert len(COMMANDS) > 150, len(COMMANDS)


def test_every_sample_verdict_names_a_program_the_doc_sample_runner_runs():
    sources = open(os.path.join(ROOT, "scripts", "doc_samples.py"), encoding="utf-8").read()
    for c in COMMANDS:
        rule = doc_commands.verdict(c)
        if rule is None or rule.how != "sample" or not c.text.startswith(("python examples/", "torchrun ")):
            continue
        script = next(w for w in c.text.split() if w.endswith(".py"))
        assert os.path.isfile(os.path.join(ROOT, script)), c
        assert os.path.basename(script) in sources, f"{c}: no doc-sample source runs {script}"
    assert all(r.why in doc_samples.SOURCES for r in doc_commands.RULES
               if r.how == "sample" and r.why in ("demo", "killed_rank_torchrun", "straggler_ddp", "report_facts"))


@pytest.mark.timeout(300)
def test_the_quick_documented_commands_run_as_written_and_print_nothing_unclean():
    runs = [c for c in COMMANDS if (r := doc_commands.verdict(c)) and r.how == "run"]
    assert runs
    with tempfile.TemporaryDirectory(prefix="doc_commands_") as tmp:
        doc_commands.tree_copy(tmp)
        for c in runs:
            status, out = doc_commands.run(c, tmp)
            assert status == int(doc_commands.verdict(c).why), f"{c.path}:{c.line}: `{c.text}` exited {status}:\n{out}"
            assert not doc_samples.noise(out), f"{c.path}:{c.line}: `{c.text}` printed:\n{out}"


@pytest.mark.timeout(300)
def test_every_documented_benchmark_command_parses_with_its_script():
    flags = [c for c in COMMANDS if (r := doc_commands.verdict(c)) and r.how == "flags"]
    assert len(flags) > 40, len(flags)
    problems = doc_commands.check_flags(flags)
    assert not problems, "\n".join(problems)
    # ... and the check can fail: a flag the script does not have.
    bad = doc_commands.Command("x.md", 1, "python benchmarks/waited.py --world 2 --no-such-flag")
    assert doc_commands.check_flags([bad])
