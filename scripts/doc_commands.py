"""Every command README.md and docs/ show, and how CI runs it as written (issue 69).

A reader copies commands from fenced blocks, indented blocks and inline code spans. This script
finds each one and gives it exactly one verdict from RULES:

- ``run``: run as written by tests/python/test_doc_commands.py (quick ones), in a copy of the
  tree, with warnings on and no TORCH_EXT_* variable the page does not show; it must exit as the
  rule says and print no warning, traceback or C++ stack;
- ``sample``: its output is a doc sample, so the doc-sample runner (scripts/doc_samples.py) runs
  it as written, in every CI run, under the same checks; the rule names the source;
- ``flags``: a benchmark's documented command: its flags are parsed by the benchmark's own parser
  (every one, in one process), not measured: the figures take minutes (tests/python/test_benchmarks.py
  runs short forms of the main ones end to end);
- ``skip``: not run by CI, with the reason (it installs into the environment, it is CI itself, it
  needs a GPU, or it is a placeholder such as HOST:PORT).

A command no rule matches fails the test: a new command in the docs gets a verdict with it.

    python scripts/doc_commands.py            # every command, its verdict and where it is shown
    python scripts/doc_commands.py --run      # run the `run` ones and parse the `flags` ones here
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a command a reader runs starts with.
_STARTS = re.compile(r"^(?:[A-Z_]+=\S*\s+)*(?:(?:\S*/)?(?:python3?|pip)|torchrun|bash|torch-ext-diagnose|git|"
                     r"tests/|scripts/|d=\$\(|export|MAX_JOBS=|PIP_CONFIG_FILE=|PATH=)\b")


@dataclasses.dataclass(frozen=True)
class Command:
    path: str  # repository-relative
    line: int
    text: str


@dataclasses.dataclass(frozen=True)
class Rule:
    pattern: str  # a regular expression the whole command matches (re.fullmatch)
    how: str  # run, sample, flags, skip
    why: str  # run: the exit status wanted ("0"); sample: the source; flags: the script; skip: the reason

    def matches(self, text: str) -> bool:
        return re.fullmatch(self.pattern, text) is not None


_PLACEHOLDER = "a placeholder or a name in prose, not a command to run as shown"
_INSTALLS = "installs into the environment it runs in (CI's set-up runs the README's own)"
_CI = "CI itself: .ci/run runs it on a fresh machine"
_BENCH = r"(?:OMP_NUM_THREADS=\d+ )?python benchmarks/(\w+)\.py(?: .*)?"

RULES: list[Rule] = [
    # The two commands of the README's first screen, and what they run: CI runs them.
    Rule(r"bash scripts/demo\.sh.*", "skip", _CI + " (the README's demo command)"),
    Rule(r"(?:[A-Z_]+=\S+ )*bash scripts/gpu\.sh.*", "skip", "needs a GPU (tests/python/test_benchmarks.py "
         "checks it parses and stops at once without one)"),
    Rule(r"(?:[A-Z_]+=\S+ )*bash scripts/cpu_worlds\.sh.*", "skip", "needs a core per rank and one spare "
         "(tests/python/test_benchmarks.py checks it parses and stops at once with fewer)"),
    Rule(r"bash scripts/test\.sh.*|scripts/test\.sh --cpu-profile|bash \.ci/run|d=\$\(mktemp -d\).*\.ci/run",
         "skip", _CI + " (the README's test command)"),
    Rule(r"scripts/setup\.sh (?:demo|test)", "skip", _CI),
    Rule(r"torchrun --standalone --nproc-per-node 4 examples/demo\.py", "sample", "demo"),
    Rule(r"python -m build --sdist --no-isolation|pip wheel --no-build-isolation --no-deps -w dist .*|"
         r"pip install dist/.*\.whl|pip (?:wheel|install) --no-build-isolation \.", "skip",
         "builds and installs the package: tests/python/test_packaging.py does the same in a fresh venv"),
    Rule(r"(?:[A-Z_]+=\S+ )*(?:(?:\S*/)?pip .*|python3? setup\.py .*)|python3? -m venv.*|PIP_CONFIG_FILE=.*|"
         r"git worktree .*", "skip", _INSTALLS),
    Rule(r"export PYTHONPATH=\$PWD|PATH=/work/v215/bin:\$PATH .*", "skip", "a step of the recipe around it, run "
         "with it"),
    Rule(r"bash scripts/check_torch_headers\.sh .*", "skip", "fetches a torch release's headers (network)"),
    # Placeholders.
    Rule(r".*(?:HOST:PORT|<name>|<tree>|\bX\.py|\bFILE\b|\bARGS\b|\bDUMP_DIR\b|\bDUMPS\b|\bOUT\.py|\.\.\.|"
         r"\bVERSION\b|train\.py|\[guard\|gloo\]).*|python -m|python -m torch_ext\.diagnose|"
         r"python -m torch_ext\.testing\.replay|python -m compileall|torch-ext-diagnose live|python3? -m venv|"
         r"TORCH_EXT_[A-Z_]+=\S+(?: TORCH_EXT_[A-Z_]+=\S+)*|TORCH_EXT_GPU_RUNNER: .*", "skip", _PLACEHOLDER),
    Rule(r"python3? -c ['\"]while True: pass['\"].*", "skip", "a load generator beside a benchmark (never ends)"),
    # The examples and what follows them: doc-sample sources.
    Rule(r"torchrun --standalone --nproc-per-node 3 examples/bugs/killed_rank\.py", "sample", "killed_rank_torchrun"),
    Rule(r"python examples/bugs/(\w+)\.py(?: \w+)?", "sample", "examples/bugs"),
    Rule(r"python examples/straggler_ddp\.py step", "sample", "straggler_ddp"),
    Rule(r"python examples/report_facts\.py", "sample", "report_facts"),
    Rule(r"python -m torch_ext\.diagnose (?:torch_ext_dumps|post_mortem/dumps)(?: .*)?|python repro\.py|"
         r"torch-ext-diagnose live 127\.0\.0\.1:\d+", "sample", "the run before it (its dumps, its job)"),
    # Quick ones: run as written.
    Rule(r"torch-ext-diagnose --version", "run", "0"),
    Rule(r"python scripts/doc_samples\.py --list.*", "run", "0"),
    Rule(r"python scripts/doc_commands\.py", "run", "0"),
    Rule(r"python scripts/doc_commands\.py --run", "skip", "what tests/python/test_doc_commands.py runs (the run "
         "commands, the flags check)"),
    Rule(r"python -c \"import torch\.testing\._internal\.distributed as d, os; .*\"", "run", "0"),
    Rule(r"python scripts/doc_samples\.py --(?:check|write).*", "skip", "the doc-sample runner: the tests run every "
         "source and check every sample (test_examples.py, test_docs.py)"),
    Rule(r"python scripts/test_profile\.py .*", "skip", "reads the profile a profiled test run wrote"),
    # Benchmarks and the conformance suite: minutes each.
    Rule(_BENCH, "flags", "benchmarks"),
    Rule(r"(?:TORCH_EXT_CHECK=\w+ )?python tests/conformance/.*|tests/conformance/run_all\.sh .*|"
         r"python -m pytest tests/conformance/.*", "skip", "torch's own distributed suite under the guard: hours on "
         "2 cores (its smoke test runs in CI: tests/conformance/test_conformance_smoke.py)"),
    Rule(r"python -m pytest -m sweep .*", "skip", "the exactness sweep: minutes; its fast slice runs in every CI run"),
    Rule(r"tests/cpp/ .*", "skip", "a line of the layout listing, not a command"),
]


def _candidates(text: str) -> list[tuple[int, str]]:
    """(line, command) of each command-like text in a Markdown file: fenced and indented blocks, code spans."""
    out: list[tuple[int, str]] = []
    lines = text.split("\n")
    fence = None  # the fence's language while inside one
    previous_blank = True
    pending: tuple[int, str] | None = None  # a command continued with a trailing backslash
    for i, raw in enumerate(lines, 1):
        stripped = raw.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip()
            previous_blank = False
            continue
        block = fence is not None or (raw.startswith("    ") and (previous_blank or pending or
                                                                   (out and out[-1][0] == i - 1)))
        previous_blank = not stripped
        if pending is not None:
            start, head = pending
            joined = head + " " + stripped.rstrip("\\").strip()
            pending = (start, joined) if stripped.endswith("\\") else None
            if pending is None:
                out.append((start, joined))
            continue
        if block:
            shell = fence in ("bash", "sh", "shell", "console") or fence is None
            command = stripped[2:] if stripped.startswith("$ ") else (stripped if shell else "")
            command = re.sub(r"\s+#(?: .*)?$", "", command).strip()  # a trailing comment
            command = re.sub(r"\s+\(.*\)$", "", command) if fence is None else command  # "(the 16,384 row)"
            if command and _STARTS.match(command):
                if command.endswith("\\"):
                    pending = (i, command.rstrip("\\").strip())
                else:
                    out.append((i, command))
            continue
        for span in re.findall(r"`([^`\n]+)`", raw):
            if " " in span.strip() and _STARTS.match(span.strip()):
                out.append((i, span.strip()))
    return out


def commands(root: str = ROOT) -> list[Command]:
    """Every command README.md and docs/*.md show, in file order."""
    found = []
    for path in ["README.md", *sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md")))]:
        with open(os.path.join(root, path), encoding="utf-8") as f:
            found += [Command(path, line, text) for line, text in _candidates(f.read())]
    return found


def verdict(command: Command) -> Rule | None:
    """The first rule the command matches (None: no rule, a failure)."""
    return next((r for r in RULES if r.matches(command.text)), None)


def tree_copy(dest: str, root: str = ROOT) -> None:
    """The tracked files of the tree (as a fresh clone has them) copied to ``dest``, plus the built extension."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, check=True).stdout
    for rel in filter(None, files.split("\0")):
        src, dst = os.path.join(root, rel), os.path.join(dest, rel)
        if not os.path.isfile(src):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(src, "rb") as a, open(dst, "wb") as b:
            b.write(a.read())


def run(command: Command, cwd: str, timeout: float = 120.0) -> tuple[int, str]:
    """Runs the command as a reader does (bash, in ``cwd``, warnings on, no TORCH_EXT_* set): (status, output)."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import doc_samples

    env = doc_samples._env()  # noqa: SLF001 - the same environment as the doc samples'
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(["bash", "-c", command.text], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return proc.returncode, proc.stdout


_FLAGS_SHIM = r"""
import argparse, runpy, sys
class Parsed(Exception):
    pass
original = argparse.ArgumentParser.parse_args
def parse_args(self, args=None, namespace=None):
    original(self, args, namespace)
    raise Parsed()
argparse.ArgumentParser.parse_args = parse_args
bad = []
for line in sys.stdin.read().splitlines():
    argv = line.split("\0")
    sys.argv = argv
    sys.path.insert(0, __import__("os").path.dirname(argv[0]))
    try:
        runpy.run_path(argv[0], run_name="__main__")
        bad.append(f"{' '.join(argv)}: ran without parsing its flags")
    except Parsed:
        pass
    except SystemExit as e:
        bad.append(f"{' '.join(argv)}: exit {e.code} while parsing its flags")
    finally:
        sys.path.pop(0)
print("\n".join(bad))
"""


def check_flags(cmds: list[Command], root: str = ROOT) -> list[str]:
    """Each benchmark command's flags parsed by the benchmark's own parser, all in one process: the problems."""
    argvs = []
    for c in cmds:
        words = [w for w in shlex.split(c.text) if not re.fullmatch(r"[A-Z_]+=\S*", w)]
        argvs.append("\0".join([os.path.join(root, words[1]), *words[2:]]))
    proc = subprocess.run([sys.executable, "-c", _FLAGS_SHIM], input="\n".join(argvs), cwd=root,
                          capture_output=True, text=True, timeout=300)
    problems = [line for line in proc.stdout.splitlines() if line.strip()]
    if problems:  # argparse's own words on what it refused
        problems.append("the parsers said:\n" + proc.stderr[-3000:])
    if proc.returncode != 0:
        problems.append(f"the flag check itself failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="store_true", help="run the `run` commands and parse the `flags` ones")
    args = ap.parse_args()
    cmds = commands()
    failed = 0
    for c in cmds:
        rule = verdict(c)
        print(f"{c.path}:{c.line}: {rule.how if rule else 'NO RULE'}: {c.text}")
        failed += rule is None
    if args.run:
        with tempfile.TemporaryDirectory(prefix="doc_commands_") as tmp:
            tree_copy(tmp)
            for c in cmds:
                rule = verdict(c)
                if rule and rule.how == "run":
                    status, out = run(c, tmp)
                    ok = status == int(rule.why)
                    print(f"{'ok' if ok else 'FAILED'} ({status}): {c.text}")
                    failed += not ok
        problems = check_flags([c for c in cmds if (r := verdict(c)) and r.how == "flags"])
        print("\n".join(problems) or "every benchmark command's flags parse")
        failed += len(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
