"""The sample outputs in README.md and docs/*.md, made from real runs, so they cannot go stale.

A sample is a fenced block right after a line ``<!-- sample: NAME -->``. Each
NAME is cut out of the output of a *source*: a real run of an example, as its
docstring tells users to run it (``python examples/bugs/slow_rank.py``, the
demo under torchrun, ``python -m torch_ext.diagnose ...`` on the dumps it
wrote), in a fresh temporary folder. Several samples share one run.

    python scripts/doc_samples.py --write [NAME ...]   run the sources, rewrite the blocks
    python scripts/doc_samples.py --check [NAME ...]   run them, fail naming each block that differs
    python scripts/doc_samples.py --list               the samples, their sources and files

What varies between runs (clock times, durations, ports, pids, dates, gloo's
own error text) is masked when comparing, never when writing: the docs show the
real output of one run. What would leak the machine (the repository's and the
temporary folder's absolute paths, torch's build paths in gloo's messages) is
rewritten before anything is written or compared, so samples hold
repository-relative paths only.

The tests run the same sources (tests/python/test_examples.py runs each example
once and checks its samples with ``check_source``; test_docs.py checks that
every sample is marked and that a block edited by hand fails ``--check``).
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(os.path.join("docs", n) for n in os.listdir(os.path.join(ROOT, "docs"))
                              if n.endswith(".md"))
MARKER = re.compile(r"^<!-- sample: ([a-z0-9-]+) -->\s*$")
# The tests set it: the programs a source runs (the example, then diagnose or a replay) are forked from
# a warm interpreter that imported torch once (torch_ext.testing._warm: the same programs, output and exit,
# without 1-2 CPU-s of torch's import each; a stack in a guard's report starts at the program's own top
# level, so the warm interpreter's frames below it are not in the samples); a torchrun source's workers too.
WARM = False


# --- running the sources ------------------------------------------------------

def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    # As a reader runs them: warnings on, and no setting the page does not show (the examples under
    # examples/bugs write their dumps to ./torch_ext_dumps themselves: their launcher's default).
    for name in [n for n in env if n.startswith("TORCH_EXT_") or n == "PYTHONWARNINGS"]:
        del env[name]
    env.update(extra or {})
    return env


def _run(argv: list[str], cwd: str, timeout: float, echo: str | None = None, fails: bool = False) -> str:
    """``python ARGV`` in ``cwd``: its stdout and stderr, as a user sees them, after ``$ ECHO`` if given.

    ``fails``: the command is to exit non-zero (torchrun over a failed job), and runs in fresh interpreters
    (the warm shim would stand between torchrun and a worker killed by a signal)."""
    # One stream, as in a terminal: the ranks' log lines (stderr) where they came.
    if WARM and not fails:
        from torch_ext.testing import _warm

        env = _env()
        _warm.start(env, argv, cwd)  # outside the timeout: the first start imports torch
        torchrun = argv[:2] == ["-m", "torch.distributed.run"]
        if torchrun:  # its workers: PYTHON_EXEC ARGS, warm too
            env.setdefault("PYTHON_EXEC", _warm.shim(env, argv[-1:], cwd))
        # Without torchrun, what the program starts as `sys.executable ARGS` (Lightning's launcher's ranks,
        # a diagnose replay) goes through the zygote's shim: warm too.
        proc = _warm.run(argv, env=env, cwd=cwd, timeout=timeout, merge=True, warm_executable=not torchrun)
    else:
        proc = subprocess.run([sys.executable, *argv], cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
    out = proc.stdout
    if (proc.returncode != 0) != fails:
        raise RuntimeError(f"`python {' '.join(argv)}` exited {proc.returncode}:\n{out[-6000:]}")
    return (f"$ {echo}\n" if echo else "") + out


def _example(path: str, *args: str) -> Callable[[str], str]:
    return lambda cwd: _run([os.path.join(ROOT, path), *args], cwd, 180)


def _demo(cwd: str) -> str:
    # As scripts/demo.sh runs it: 4 CPU ranks under torchrun.
    return _run(["-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port", "0", "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", "127.0.0.1:0", os.path.join(ROOT, "examples", "demo.py")], cwd, 240)


def _killed_rank_torchrun(cwd: str) -> str:
    # As the README shows it: torchrun --standalone --nproc-per-node 3 examples/bugs/killed_rank.py
    return _run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                 os.path.join(ROOT, "examples", "bugs", "killed_rank.py")], cwd, 240, fails=True)


def _torchrun_summary(out: str) -> str:
    """torchrun's failure summary: from the rule under ``ChildFailedError:`` to the end."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("torch.distributed.elastic.multiprocessing"
                                                                       ".errors.ChildFailedError"))
    return "\n".join(lines[start + 1:]).rstrip("\n")


def _slow_rank(*args: str, diagnose: str) -> Callable[[str], str]:
    """examples/bugs/slow_rank.py ARGS, then ``python -m torch_ext.diagnose DIAGNOSE`` on the dumps it wrote."""
    def run(cwd: str) -> str:
        out = _run([os.path.join(ROOT, "examples", "bugs", "slow_rank.py"), *args], cwd, 180)
        cmd = f"python -m torch_ext.diagnose {diagnose}"
        return out + "\n" + _run(cmd.split()[1:], cwd, 60, echo=cmd)
    return run


_FR_ENTRY = ("import pickle, pprint; d = pickle.load(open('post_mortem/fr/torch_ext_fr_rank_0', 'rb')); "
             "pprint.pprint(d['entries'][-1], width=110, sort_dicts=False)")


def _crossed_groups(cwd: str) -> str:
    """examples/bugs/crossed_groups.py, then ``python -m torch_ext.diagnose torch_ext_dumps``."""
    out = _run([os.path.join(ROOT, "examples", "bugs", "crossed_groups.py")], cwd, 180)
    cmd = "python -m torch_ext.diagnose torch_ext_dumps"
    return out + "\n" + _run(cmd.split()[1:], cwd, 60, echo=cmd)


def _pipeline_deadlock(cwd: str) -> str:
    """examples/bugs/pipeline_deadlock.py, then ``python -m torch_ext.diagnose torch_ext_dumps --html report.html``."""
    out = _run([os.path.join(ROOT, "examples", "bugs", "pipeline_deadlock.py")], cwd, 180)
    cmd = "python -m torch_ext.diagnose torch_ext_dumps --html report.html"
    return out + "\n" + _run(cmd.split()[1:], cwd, 60, echo=cmd)


def _straggler(cwd: str) -> str:
    """examples/bugs/straggler.py, then ``python -m torch_ext.diagnose torch_ext_dumps --trace trace.json``."""
    out = _run([os.path.join(ROOT, "examples", "bugs", "straggler.py")], cwd, 180)
    cmd = "python -m torch_ext.diagnose torch_ext_dumps --trace trace.json"
    return out + "\n" + _run(cmd.split()[1:], cwd, 60, echo=cmd)


def _repro(cwd: str) -> str:
    """examples/bugs/rank0_only_reduce.py, ``diagnose torch_ext_dumps --repro repro.py``, then ``python repro.py``."""
    out = _run([os.path.join(ROOT, "examples", "bugs", "rank0_only_reduce.py")], cwd, 180)
    cmd = "python -m torch_ext.diagnose torch_ext_dumps --repro repro.py"
    out += "\n" + _run(cmd.split()[1:], cwd, 60, echo=cmd)
    # What sed prints (python here: the same lines, from "RANKS = {" to the "}" that closes it).
    show = "t = open('repro.py').read(); print(t[t.index('RANKS = {'):t.index('\\n}\\n') + 2])"
    out += "\n" + _run(["-c", show], cwd, 60, echo="sed -n '/^RANKS = {/,/^}/p' repro.py")
    return out + "\n" + _run(["repro.py"], cwd, 240, echo="python repro.py")


def _replay_summary(out: str) -> str:
    """``python repro.py``'s first line and its summary (the ranks' own lines between them interleave)."""
    lines = out.splitlines()
    start = lines.index("$ python repro.py")
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("rank 0 exit code"))
    return "\n".join(lines[start:start + 2] + ["..."] + lines[first:]).rstrip("\n")


def _post_mortem(cwd: str) -> str:
    out = _run([os.path.join(ROOT, "examples", "post_mortem.py")], cwd, 240)
    # One entry of rank 0's Flight Recorder file, as pickle.load gives it.
    return out + "\n" + _run(["-c", _FR_ENTRY], cwd, 60, echo="python -c \"" + _FR_ENTRY + "\"")


# name -> what runs it (in a fresh temporary folder, which it may fill).
SOURCES: dict[str, Callable[[str], str]] = {
    "demo": _demo,
    "rank0_only_reduce": _repro,  # the example, then its dumps replayed (--repro)
    "mixed_metrics": _example("examples/bugs/mixed_metrics.py"),
    "deferred_metric": _example("examples/bugs/deferred_metric.py"),
    "lightning_metric_keys": _example("examples/bugs/lightning_metric_keys.py"),
    "rank0_metric_compute": _example("examples/bugs/rank0_metric_compute.py"),
    "mismatched_shapes": _example("examples/bugs/mismatched_shapes.py"),
    "fsdp2_rank_local_shapes": _example("examples/bugs/fsdp2_rank_local_shapes.py"),
    "skipped_module": _example("examples/bugs/skipped_module.py"),
    "skipped_module_strict": _example("examples/bugs/skipped_module.py", "strict"),
    "rank0_validation": _example("examples/bugs/rank0_validation.py"),
    "killed_rank": _example("examples/bugs/killed_rank.py"),
    "killed_rank_torchrun": _killed_rank_torchrun,
    "ddp_uneven_steps": _example("examples/bugs/ddp_uneven_steps.py"),
    "ddp_unused_parameter": _example("examples/bugs/ddp_unused_parameter.py"),
    "slow_rank": _slow_rank(diagnose="torch_ext_dumps --html report.html"),
    "slow_rank_recovers": _slow_rank("recovers", diagnose="torch_ext_dumps"),
    "rank0_dies": _example("examples/bugs/rank0_dies.py"),
    "stalled_stream": _example("examples/bugs/stalled_stream.py"),
    "rank0_dies_stop": _example("examples/bugs/rank0_dies.py", "stop"),
    "post_mortem": _post_mortem,
    "crossed_groups": _crossed_groups,
    "pipeline_deadlock": _pipeline_deadlock,
    "looks_stuck": _example("examples/bugs/looks_stuck.py"),
    "long_checkpoint": _example("examples/bugs/long_checkpoint.py"),
    "straggler": _straggler,
    "straggler_ddp": _example("examples/straggler_ddp.py", "step"),
    "report_facts": _example("examples/report_facts.py"),
}


def run_source(name: str, cwd: str | None = None) -> str:
    """The cleaned output of source ``name``, run in ``cwd`` (a new temporary folder if None)."""
    if cwd is not None:
        return clean(SOURCES[name](os.fspath(cwd)), os.fspath(cwd))
    with tempfile.TemporaryDirectory(prefix="doc_samples_") as tmp:
        return clean(SOURCES[name](tmp), tmp)


# --- cleaning (always) and masking (to compare) --------------------------------

def clean(text: str, cwd: str) -> str:
    """Machine-independent output: repository-relative paths, torch's build paths folded."""
    for folder in {cwd, os.path.realpath(cwd)}:
        text = text.replace(folder + os.sep, "")
    for folder in {ROOT, os.path.realpath(ROOT)}:
        text = text.replace(folder + os.sep, "")
    # gloo's messages name the folder torch was built in (/__w/pytorch/pytorch/third_party/gloo/...).
    text = re.sub(r"\[[^\[\]]*/third_party/gloo/(gloo/[^\]]*)\]", r"[.../\1]", text)
    # ... and go on for two more sentences of advice; the first says what happened.
    text = re.sub(r"(\[\.\.\./gloo/[^\]]*\] [^\n]*?\.) [^)\n]*\)", r"\1 ...)", text)
    # torchrun's error files live in a fresh temporary folder per run.
    text = re.sub(r"/\S*/torchelastic_[^/\s]+/[^/\s]+/attempt_(\d+)/", r"<tmp>/torchelastic_<run>/attempt_\1/", text)
    # torch's Flight Recorder analyzer says this where the optional tabulate package is missing.
    text = text.replace("tabulate is not installed. Proceeding without it.\n", "")
    return text


_MASKS = [
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"), "<date>"),
    (re.compile(r"\b\d\d:\d\d:\d\d\b"), "<time>"),
    (re.compile(r"\b\d+(?:\.\d+)? (s|min|h|days)\b"), r"<n> \1"),
    (re.compile(r"\b\d+(?:\.\d+)? ms\b"), "<n> ms"),  # a straggler's extra wait per collective
    (re.compile(r"\b\d+%"), "<n>%"),  # ... and the ranks' shares of the time waiting
    (re.compile(r"\b\d+(?:\.\d+)? [kMG]B to and from storage"), "<bytes> to and from storage"),  # a busy rank's I/O
    # Where a busy rank's main thread is in a loop of work (a paced checkpoint write) is a race.
    (re.compile(r"(long_checkpoint\.py:)\d+( in save_checkpoint)"), r"\1<n>\2"),
    (re.compile(r"\d+ h \d+ min"), "<n> h"),
    (re.compile(r"(127\.0\.0\.1\]?:|MASTER_PORT=)\d+"), r"\1<port>"),
    (re.compile(r"\[\.\.\./gloo/[^\]]*\][^)\n]*"), "<gloo error>"),
    # Which rank's gloo saw a closed connection first is a race.
    (re.compile(r"rank \d+ saw: <gloo error>"), "rank <r> saw: <gloo error>"),
    (re.compile(r"\bpid \d+"), "pid <n>"),
    # torchrun's failure summary: its times, the worker's pid, the host's name, each worker's error file.
    (re.compile(r"\d{4}-\d\d-\d\d_\d\d:\d\d:\d\d"), "<date>"),
    (re.compile(r"\(pid: \d+\)"), "(pid: <n>)"),
    (re.compile(r"received by PID \d+"), "received by PID <n>"),
    (re.compile(r"^(  host +: ).*$", re.M), r"\1<host>"),
    (re.compile(r"(error_file: )/\S+/(\d+)/error\.json"), r"\1<torchrun's log dir>/\2/error.json"),
    # A stack's frames in torch's own files: their lines move between torch releases (all_reduce's
    # wait is distributed_c10d.py:3252 on 2.13, :4181 on 2.15).
    (re.compile(r"(\btorch \.\.\./[\w/]+\.py):\d+"), r"\1:<line>"),
    # A silent rank's last status may have been published just before or just after it issued
    # its next collective (rank0-dies: "issued #3" or "#4" on the rank that was waiting).
    (re.compile(r"(last heartbeat <n> s ago, issued #)\d+"), r"\1<n>"),
    # ... and so may its last completion (rank0-dies-stop read "completed #2" for "#3" under the
    # load of four tests at a time).
    (re.compile(r"(last heartbeat <n> s ago, issued #<n>, completed #)\d+"), r"\1<n>"),
    # Which of a rank's store calls meets the dead store first (the exchange's read of its ring
    # neighbours, or raising the incident) is a race too, and so is how the socket says it:
    # "connection reset during multi_get", "connection closed during compare_set", "broken pipe
    # during multi_get" (rank0-dies differed by each in clean-clone CI runs).
    (re.compile(r"is gone: (?:connection \w+|broken pipe) during \w+"), "is gone: <connection lost> during <call>"),
    (re.compile(r"\(host [^,\s]+,"), "(host <host>,"),
    (re.compile(r"\(host [^,\s)]+\)"), "(host <host>)"),
    (re.compile(r"\b\d{16,}\b"), "<ns>"),
    # A deadlock's collective in the dumps: still waiting, or already failed when a peer's abort
    # closed gloo's connections before this rank's dump was last written (pipeline-deadlock-diagnose
    # differed by that in a clean-clone CI run). The loop's edges below it are the same either way.
    (re.compile(r'^(deadlock across groups [^:\n]+: collective #\d+ [^\n]*? on group "[^"]+") '
                r"(?:has waited <n> s|failed in the inner backend \(rank <r> saw: <gloo error>\))", re.M),
     r"\1 <waited or failed>"),
    # A certain deadlock ends every group on the cycle with the verdict that reached the rank
    # first, found from whichever group's collective or send/recv wait (Watchdog::endCycleGroups;
    # a recv on "pp" headed it in a clean-clone CI run): the loop's edges
    # below it are the same either way.
    (re.compile(r'(deadlock across groups [^:\n]+: )(?:collective #\d+ )?[^\n]*? on group "[^"]+" '
                r"(?:<waited or failed>|has waited <n> s)(; it can never complete)"),
     r"\1<a collective of the cycle> <waited or failed>\2"),
    # A written replay's length: its JOB literal wraps the job's paths, which differ between machines.
    (re.compile(r"\(\d+ lines: (\d+ operation)"), r"(<n> lines: \1"),
    # The job's store_timeout, replayed: the tests' environment raises it for every rank (conftest.py).
    (re.compile(r"(the job's guard settings: .*\bstore_timeout=)\d+"), r"\1<s>"),
    # When a straggler is first named: the windows of collectives seen by then.
    (re.compile(r"collectives \d+-\d+"), "collectives <a>-<b>"),
    (re.compile(r"\(\d+ windows of collectives out of \d+ there\)"), "(<n> windows of collectives out of <n> there)"),
]


def mask(text: str) -> str:
    """``text`` with what varies between runs replaced by placeholders."""
    lines = [line.rstrip() for line in text.strip("\n").splitlines()]
    out = "\n".join(lines)
    for pattern, repl in _MASKS:
        out = pattern.sub(repl, out)
    return out


# --- cutting samples out of an output -------------------------------------------

_NEW_RANK_LINE = re.compile(r"^(\[rank\d+\] (raised |\d\d:\d\d:\d\d )|rank \d+ exit code|launcher: |\$ )")


def _raised(rank: int, error: str, header: bool = True) -> Callable[[str], str]:
    """The report rank ``rank`` printed for the error it raised (examples/bugs/_launch.py prints it)."""
    def cut(out: str) -> str:
        lines = out.splitlines()
        start = lines.index(f"[rank{rank}] raised {error}:")
        end = start + 1
        while end < len(lines) and lines[end] and not _NEW_RANK_LINE.match(lines[end]):
            end += 1
        return "\n".join(lines[start if header else start + 1:end])
    return cut


def _logged(rank: int, first: int | None = None, level: str = "") -> Callable[[str], str]:
    """Rank ``rank``'s labelled torch_ext log lines (the first ``first`` only, if given; of ``level`` only,
    if given)."""
    def cut(out: str) -> str:
        lines = [line for line in out.splitlines()
                 if re.match(rf"\[rank{rank}\] \d\d:\d\d:\d\d torch_ext {level}", line)]
        return "\n".join(lines[:first])
    return cut


def _printed_by_ranks(out: str) -> str:
    """The lines the ranks' own code printed ("[rankN] ..." with no log label), in rank order (they race)."""
    return "\n".join(sorted(line for line in out.splitlines()
                            if re.match(r"\[rank\d+\] (?!\d\d:\d\d:\d\d torch_ext)(?!raised )", line)))


def _warned(rank: int) -> Callable[[str], str]:
    """Rank ``rank``'s labelled torch_ext WARNING lines (a hang report; the errors after it are a race)."""
    def cut(out: str) -> str:
        return "\n".join(line for line in out.splitlines()
                         if re.match(rf"\[rank{rank}\] \d\d:\d\d:\d\d torch_ext WARNING:", line))
    return cut


def _uneven_warning(out: str) -> str:
    """The uneven-data warning (torch_ext/epochs.py), without its rank label: the rank
    that logs it is the last to end the epoch, which is a race."""
    for line in out.splitlines():
        m = re.match(r"\[rank\d+\] \d\d:\d\d:\d\d (torch_ext WARNING: uneven data: .*)", line)
        if m:
            return m.group(1)
    raise ValueError("no uneven-data warning in the output")


def _both(*cuts: Callable[[str], str]) -> Callable[[str], str]:
    return lambda out: "\n".join(cut(out) for cut in cuts)


def _command(prefix: str) -> Callable[[str], str]:
    """From the line ``$ PREFIX...`` to the next ``$ `` line (or the end), trailing blank lines dropped."""
    def cut(out: str) -> str:
        lines = out.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("$ " + prefix))
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("$ ")), len(lines))
        return "\n".join(lines[start:end]).rstrip("\n")
    return cut


def _demo_error(error: str) -> Callable[[str], str]:
    """The report the demo prints for the first ``[rank N] ERROR:`` (the others say "same report")."""
    def cut(out: str) -> str:
        lines = out.splitlines()
        start = next(i for i, line in enumerate(lines) if re.fullmatch(rf"\[rank \d+\] {error}:", line))
        end = next(i for i in range(start + 1, len(lines)) if not lines[i] or lines[i].startswith("[rank"))
        return "\n".join(lines[start:end])
    return cut


def _demo_hang(out: str) -> str:
    """Rank 0's report of scene 2 (the group "scene2")."""
    lines = _logged(0)(out).splitlines()
    start = next(i for i, line in enumerate(lines) if 'on group "scene2" has waited' in line)
    end = start + 1
    while end < len(lines) and re.match(r"\[rank0\] \S+ torch_ext WARNING:   ", lines[end]):
        end += 1
    return "\n".join(lines[start:end])


def _json_line(rank: int) -> Callable[[str], str]:
    """The one-line JSON record rank ``rank`` printed (``{"rank": N, ...}``)."""
    return lambda out: next(line for line in out.splitlines() if line.startswith(f'{{"rank": {rank},'))


def _after(prefix: str) -> Callable[[str], str]:
    """What the command ``$ PREFIX...`` printed, without the command line."""
    return lambda out: "\n".join(_command(prefix)(out).splitlines()[1:])


def _deadlock_found(prefix: str) -> Callable[[str], str]:
    """The command line ``$ PREFIX...`` and the first deadlock it printed (its first line and edges).

    The rest of its output is a race: which incident wrote each rank's last dump (the abort, or
    the failure its peers' exit caused) and where each main thread was then (still waiting, or
    already at exit).
    """
    def cut(out: str) -> str:
        lines = _command(prefix)(out).splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("deadlock across groups"))
        end = next(i for i in range(start + 1, len(lines)) if not re.match(r"  ranks? [\d,-]+ waits? in ", lines[i]))
        return "\n".join([lines[0], *lines[start:end]])
    return cut


def _deadlock_raised(rank: int) -> Callable[[str], str]:
    """The DeadlockError rank ``rank`` raised, up to its last edge: the stacks after it are a race
    (the groups on the cycle end at once, so a peer's main thread is still waiting, or already at exit)."""
    def cut(out: str) -> str:
        lines = _raised(rank, "DeadlockError")(out).splitlines()
        end = next(i for i in range(2, len(lines)) if not re.match(r"  ranks? [\d,-]+ waits? in ", lines[i]))
        return "\n".join(lines[:end])
    return cut


def _live(ranks: tuple[int, ...] | None = None) -> Callable[[str], str]:
    """What ``torch-ext-diagnose live`` printed in examples/bugs/looks_stuck.py (the command line included);
    with ``ranks``, only those ranks' sections (and the header and verdict)."""
    def cut(out: str) -> str:
        lines = _command("torch-ext-diagnose live")(out).splitlines()
        end = next(i for i, line in enumerate(lines) if line.startswith("[rank0] all_reduce gave"))
        lines = lines[:end]
        while lines and not lines[-1].strip():
            lines.pop()
        if ranks is None:
            return "\n".join(lines)
        keep: list[str] = []
        section: int | None = -1  # -1: the header; None: a rank left out
        for line in lines:
            m = re.match(r"\[(?:live|absent)\] rank (\d+)", line)
            if m:
                section = int(m.group(1)) if int(m.group(1)) in ranks else None
            elif line.startswith("[live] ") or line.startswith("not answering"):
                section = -1  # the verdict
            if section is not None:
                keep.append(line)
        return "\n".join(keep)
    return cut


@dataclasses.dataclass(frozen=True)
class Sample:
    source: str
    cut: Callable[[str], str]


SAMPLES: dict[str, Sample] = {
    "demo-mismatch": Sample("demo", _demo_error("CollectiveMismatchError")),
    "demo-hang": Sample("demo", _demo_hang),
    "rank0-only-reduce": Sample("rank0_only_reduce", _raised(1, "CollectiveMismatchError")),
    "repro-diagnose": Sample("rank0_only_reduce", _command("python -m torch_ext.diagnose")),
    "repro-file": Sample("rank0_only_reduce", _command("sed -n")),
    "repro-run": Sample("rank0_only_reduce", _replay_summary),
    "mixed-metrics": Sample("mixed_metrics", _raised(0, "CollectiveMismatchError")),
    "deferred-metric": Sample("deferred_metric", _raised(0, "CollectiveMismatchError")),
    "lightning-metric-keys": Sample("lightning_metric_keys", _raised(0, "CollectiveMismatchError")),
    "rank0-metric-compute": Sample("rank0_metric_compute", _raised(0, "CollectiveMismatchError")),
    "mismatched-shapes": Sample("mismatched_shapes", _raised(0, "CollectiveMismatchError", header=False)),
    "fsdp2-rank-local-shapes": Sample("fsdp2_rank_local_shapes", _raised(0, "CollectiveMismatchError")),
    "skipped-module": Sample("skipped_module", _raised(1, "CollectiveMismatchError")),
    "skipped-module-strict": Sample("skipped_module_strict", _raised(1, "CollectiveMismatchError", header=False)),
    "rank0-validation": Sample("rank0_validation", _raised(0, "CollectiveMismatchError", header=False)),
    "slow-rank": Sample("slow_rank", _both(_logged(0), _raised(0, "CollectiveTimeoutError"))),
    "slow-rank-labels": Sample("slow_rank", _logged(0, first=2)),
    "slow-rank-diagnose": Sample("slow_rank", _command("python -m torch_ext.diagnose")),
    "slow-rank-recovered-diagnose": Sample("slow_rank_recovers", _command("python -m torch_ext.diagnose")),
    "killed-rank": Sample("killed_rank", _raised(0, "CollectiveFailureError")),
    "killed-rank-torchrun": Sample("killed_rank_torchrun", _torchrun_summary),
    "ddp-uneven-steps": Sample("ddp_uneven_steps", _raised(0, "CollectiveMismatchError")),
    "ddp-uneven-steps-rank1": Sample("ddp_uneven_steps", _raised(1, "CollectiveMismatchError")),
    "ddp-uneven-steps-warning": Sample("ddp_uneven_steps", _uneven_warning),
    "ddp-unused-parameter": Sample("ddp_unused_parameter", _raised(1, "RuntimeError")),
    "stalled-stream": Sample("stalled_stream", _raised(0, "CollectiveTimeoutError")),
    "rank0-dies": Sample("rank0_dies", _raised(1, "StoreLostError")),
    "rank0-dies-stop": Sample("rank0_dies_stop", _raised(2, "StoreLostError")),
    # ERROR only: under load a rank still on its way into its wait makes the look at warn_after
    # find the loop only possible, and rank 0 warns before the verdict (seen once in a loaded run).
    "crossed-groups": Sample("crossed_groups", _logged(0, level="ERROR")),
    "crossed-groups-error": Sample("crossed_groups", _deadlock_raised(1)),
    "crossed-groups-diagnose": Sample("crossed_groups", _deadlock_found("python -m torch_ext.diagnose")),
    "pipeline-deadlock": Sample("pipeline_deadlock", _deadlock_raised(0)),
    "pipeline-deadlock-diagnose": Sample("pipeline_deadlock", _deadlock_found("python -m torch_ext.diagnose")),
    "post-mortem-diagnose": Sample("post_mortem", _command("python -m torch_ext.diagnose")),
    "post-mortem-torchfrtrace": Sample("post_mortem", _command("torchfrtrace")),
    "post-mortem-fr-entry": Sample("post_mortem", _after("python -c \"import pickle")),
    "long-checkpoint": Sample("long_checkpoint", _both(_logged(1), _printed_by_ranks)),
    "looks-stuck-live": Sample("looks_stuck", _live()),
    "looks-stuck-live-short": Sample("looks_stuck", _live(ranks=(2,))),
    "straggler-diagnose": Sample("straggler", _command("python -m torch_ext.diagnose")),
    "straggler-live": Sample("straggler_ddp", _warned(0)),
    "report-facts": Sample("report_facts", _json_line(0)),
}


# --- the blocks in the docs --------------------------------------------------------

@dataclasses.dataclass
class Block:
    name: str
    path: str  # repository-relative
    start: int  # index of the first line inside the fence
    end: int  # index of the closing fence
    text: str


def blocks(root: str = ROOT) -> list[Block]:
    """Every marked block of README.md and docs/*.md under ``root``."""
    found: list[Block] = []
    for rel in DOCS:
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            lines = f.read().split("\n")
        for i, line in enumerate(lines):
            m = MARKER.match(line)
            if not m:
                continue
            if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
                raise ValueError(f"{rel}:{i + 1}: '<!-- sample: {m.group(1)} -->' must be followed by a ``` fence")
            end = next((j for j in range(i + 2, len(lines)) if lines[j].startswith("```")), None)
            if end is None:
                raise ValueError(f"{rel}:{i + 2}: the fence of sample {m.group(1)} is never closed")
            found.append(Block(m.group(1), rel, i + 2, end, "\n".join(lines[i + 2:end])))
    return found


def check_names(root: str = ROOT) -> list[str]:
    """Problems with the markers: unknown names, samples marked twice or not at all."""
    problems = []
    seen: dict[str, str] = {}
    for b in blocks(root):
        if b.name not in SAMPLES:
            problems.append(f"{b.path}:{b.start}: unknown sample '{b.name}' "
                            "(add it to SAMPLES in scripts/doc_samples.py)")
        elif b.name in seen:
            problems.append(f"{b.path}:{b.start}: sample '{b.name}' also marked in {seen[b.name]}")
        seen.setdefault(b.name, f"{b.path}:{b.start}")
    for name in SAMPLES:
        if name not in seen:
            problems.append(f"sample '{name}' is marked nowhere in README.md or docs/")
    return problems


# What a run a reader makes must not print, whether a sample shows that part or not: a Python
# warning ("x.py:83: FutureWarning: ..."), a traceback, a C++ stack (torch's "Exception raised
# from ..." and its "frame #N:" lines). A sample that shows an error shows the guard's report.
_NOISE = re.compile(
    r"^\S.*:\d+: \w*Warning: |^Traceback \(most recent call last\)|^Exception raised from |^frame #\d+: ", re.MULTILINE)


# Sources whose story is a process or its store dying: there torch's own TCPStore client logs
# each failed socket call of the survivors with a C++ stack, which no wrapper of its store can stop.
DYING = {"rank0_dies", "rank0_dies_stop", "killed_rank", "killed_rank_torchrun"}


def noise(output: str) -> list[str]:
    """The lines of ``output`` that a clean run does not print (``_NOISE``), the first few."""
    return [m.group(0) + output[m.end():].split("\n", 1)[0] for m in _NOISE.finditer(output)][:5]


def differences(outputs: dict[str, str], root: str = ROOT, names: list[str] | None = None) -> list[str]:
    """One message per marked block (of the sources in ``outputs``) that differs from its real output, and one
    per source whose output has a warning, a traceback or a C++ stack in it."""
    problems = []
    for source, output in outputs.items():
        shown = any(SAMPLES[n].source == source and (not names or n in names) for n in SAMPLES)
        if shown and source not in DYING and noise(output):
            problems.append(f"source '{source}' printed what a clean run does not (a warning, a traceback, a C++ "
                            "stack):\n  " + "\n  ".join(noise(output)))
    for b in blocks(root):
        sample = SAMPLES.get(b.name)
        if sample is None or sample.source not in outputs or (names and b.name not in names):
            continue
        try:
            want = sample.cut(outputs[sample.source])
        except (ValueError, StopIteration):
            problems.append(f"{b.path}:{b.start}: sample '{b.name}' is not in the output of its source "
                            f"'{sample.source}' (the output changed shape? its cut in scripts/doc_samples.py):\n"
                            + outputs[sample.source][-3000:])
            continue
        if mask(want) != mask(b.text):
            diff = "\n".join(difflib.unified_diff(mask(b.text).splitlines(), mask(want).splitlines(),
                                                  f"{b.path} (sample {b.name})", "real output", lineterm=""))
            problems.append(f"{b.path}:{b.start}: sample '{b.name}' differs from the output of its source "
                            f"'{sample.source}' (run `python scripts/doc_samples.py --write {b.name}`):\n{diff}")
    return problems


def check_source(source: str, output: str, root: str = ROOT) -> None:
    """Raises AssertionError when a sample cut from ``output`` (source ``source``, cleaned) differs from the docs."""
    problems = differences({source: output}, root)
    assert not problems, "\n\n".join(problems)


def write(outputs: dict[str, str], root: str = ROOT, names: list[str] | None = None) -> list[str]:
    """Rewrites the blocks of the sources in ``outputs``; returns the files changed."""
    changed = []
    for rel in DOCS:
        path = os.path.join(root, rel)
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        mine = [b for b in blocks(root) if b.path == rel and b.name in SAMPLES
                and SAMPLES[b.name].source in outputs and (not names or b.name in names)]
        for b in sorted(mine, key=lambda b: -b.start):
            new = [line.rstrip() for line in SAMPLES[b.name].cut(outputs[SAMPLES[b.name].source]).split("\n")]
            lines[b.start:b.end] = new
        text = "\n".join(lines)
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                continue
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        changed.append(rel)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="fail naming each sample that differs from a real run")
    mode.add_argument("--write", action="store_true", help="rewrite the samples from real runs")
    mode.add_argument("--list", action="store_true", help="list the samples, their sources and where they are")
    ap.add_argument("names", nargs="*", help="samples or sources to run (default: all)")
    ap.add_argument("--root", default=ROOT, help="the checkout whose docs to check or write (default: this one)")
    ap.add_argument("--jobs", type=int, default=2, help="sources run at a time (default 2)")
    ap.add_argument("--keep", metavar="DIR", help="also save each source's output to DIR/<source>.txt")
    ap.add_argument("--reuse", metavar="DIR", help="use the outputs --keep saved in DIR instead of running the "
                    "sources (to work on the cuts; a check must run them)")
    args = ap.parse_args(argv)
    problems = check_names(args.root)
    if args.list:
        where = {b.name: f"{b.path}:{b.start}" for b in blocks(args.root)}
        for name, s in SAMPLES.items():
            print(f"{name:26} {s.source:18} {where.get(name, '(not marked)')}")
        return 0
    unknown = [n for n in args.names if n not in SAMPLES and n not in SOURCES]
    if unknown:
        print(f"error: unknown sample or source: {', '.join(unknown)} (see --list)", file=sys.stderr)
        return 2
    names = [n for n in SAMPLES if not args.names or n in args.names or SAMPLES[n].source in args.names]
    sources = sorted({SAMPLES[n].source for n in names})
    if args.reuse:
        outputs = {}
        for src in sources:
            with open(os.path.join(args.reuse, f"{src}.txt"), encoding="utf-8") as f:
                outputs[src] = clean(f.read(), args.reuse)
    else:
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            outputs = dict(zip(sources, pool.map(run_source, sources)))
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        for src, text in outputs.items():
            with open(os.path.join(args.keep, f"{src}.txt"), "w", encoding="utf-8") as f:
                f.write(text)
    if args.write:
        for rel in write(outputs, args.root, names):
            print(f"rewrote samples in {rel}")
    else:
        problems += differences(outputs, args.root, names)
    for p in problems:
        print(p, file=sys.stderr)
    if not problems and args.check:
        print(f"{len(names)} sample(s) from {len(sources)} run(s) match the docs")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
