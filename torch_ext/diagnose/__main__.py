"""``python -m torch_ext.diagnose DUMP_DIR [--html FILE] [--trace FILE] [--fr OUT_DIR] [--repro OUT.py] [--json]``.

``torch-ext-diagnose live HOST:PORT [--json] [--ranks 0-7,12] [--timeout S] [--watch S]``: a running job (live.py).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

from torch_ext.diagnose import JobState, analyze_dir, format_text, group_sizes, job_state
from torch_ext.diagnose._words import utc
from torch_ext.diagnose.flight_recorder import DEFAULT_PREFIX, ExportError, export
from torch_ext.diagnose.html import render
from torch_ext.diagnose.stragglers import format_stragglers, stragglers_from_snapshots
from torch_ext.diagnose.trace import render_trace


def _write_text(path: str, text: str, flag: str) -> str | None:
    """Writes ``text`` to ``path``; returns an error line naming the fix, or None."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        return f"error: cannot write {flag} file {path!r}: {e.strerror} (pass {flag} a path in a folder you can write)"
    return None


def _version() -> str:
    import torch

    import torch_ext
    from torch_ext import _extension

    return (f"torch_ext {torch_ext.__version__} "
            f"(compiled against torch {_extension.built_against() or '(not recorded)'}, "
            f"running torch {torch.__version__}) at {os.path.dirname(torch_ext.__file__)}")


class _PrintVersion(argparse.Action):
    """Like argparse's "version" action, without re-wrapping the line (it holds a path)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(_version())
        parser.exit()


def _written(analysis) -> tuple[int, float] | None:
    """When the newest dump was written (wall ns) and how long ago (s); None without times."""
    times = [int(d.data["time_ns"]) for d in analysis.dumps if isinstance(d.data.get("time_ns"), int)]
    if not times:
        return None
    newest = max(times)
    return newest, max(0.0, time.time() - newest / 1e9)


def _ago(age_s: float) -> str:
    if age_s < 120:
        return f"{age_s:.0f} s"
    if age_s < 7200:
        return f"{age_s / 60:.0f} min"
    if age_s < 2 * 86400:
        return f"{int(age_s // 3600)} h {int(age_s % 3600 // 60)} min"
    return f"{age_s / 86400:.0f} days"


def _age_line(written_ns: int, age_s: float, job: JobState | None = None) -> str:
    """Old dumps must not read like a live hang: say when they were written (issue 25)."""
    head = f"dumps written {utc(written_ns)} ({_ago(age_s)} ago)"
    if job is None or job.state is None:  # dumps of a torch_ext that wrote no state
        return head + ": they show the job at that moment; a job that recovered or ended since then is not in them"
    return head + " at " + ", ".join(job.written_at)


def _state_line(job: JobState, written_ns: int) -> str:
    """The job's state as the dumps' states tell it, in plain words."""
    def after(ns: int | None) -> str:
        return f"{utc(ns, date=False)}, {max(0.0, (ns - written_ns) / 1e9):.1f} s after the dumps" if ns else "?"

    def ranks_in(state: str) -> str:
        return ",".join(str(r) for r, s in job.ranks.items() if s["state"] == state)

    if job.state == "finished":
        recovered = (f"recovered (every rank got past what it waited in by {after(job.recovered_ns)}) and "
                     if job.recovered_ns else "")
        return (f"state: finished: the job {recovered}ended cleanly by {after(job.finished_ns)}; no hang now. "
                "Below: the moment of the dumps")
    if job.state == "recovered":
        return (f"state: recovered: every rank got past what it waited in by {after(job.recovered_ns)}; no hang now "
                "(the job is still running, or ended without destroying its groups). Below: the moment of the dumps")
    if job.state == "failed":
        return f"state: failed on rank(s) {ranks_in('failed')}: the group failed (timeout, mismatch or a rank gone)"
    if job.state == "waiting":
        others = [f"rank(s) {ranks_in(s)} {s}" for s in ("recovered", "finished", "running") if ranks_in(s)]
        return (f"state: waiting on rank(s) {ranks_in('waiting')}: not past the operation they waited in "
                "when their dumps "
                "were last written (a live hang, or a job that ended in it)"
                + (f"; {', '.join(others)}" if others else ""))
    return "state: running: nothing was pending when the dumps were written"


def live_main(argv: list[str]) -> int:
    """``torch-ext-diagnose live HOST:PORT``: the report of a job that is running now."""
    from torch_ext.diagnose.live import parse_ranks

    ap = argparse.ArgumentParser(
        prog="torch-ext-diagnose live",
        description="Live cross-rank report of a running guarded job, asked through its store, without stopping it: "
                    "each rank's host, pid, the collective it is in (or since when it computes) and its Python "
                    "threads' stacks, then who waits for whom. Ranks that do not answer within the deadline "
                    "are named, never waited on.",
    )
    ap.add_argument("address", metavar="HOST:PORT",
                    help="the job's store: MASTER_ADDR:MASTER_PORT, or torchrun's --rdzv-endpoint")
    ap.add_argument("--timeout", type=float, default=None, metavar="S",
                    help="deadline in seconds for the ranks' answers (default 5, more for groups so large that "
                         "they exchange less often than every 1.3 s)")
    ap.add_argument("--ranks", metavar="LIST", help="ask only these ranks, e.g. 0-7,12: only they answer, and the "
                    "verdict covers them alone (needed above 1024 ranks, where each rank asked writes a snapshot of "
                    "up to about 55 KB + 18 bytes per rank of the job into the store)")
    ap.add_argument("--all-ranks", action="store_true", help="ask every rank of a job over 1024 ranks anyway")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--html", metavar="FILE", help="also write the post-mortem's page (one lane per rank, the stuck "
                    "op and the culprits marked) for the live state; rewritten at each --watch refresh")
    ap.add_argument("--watch", type=float, default=None, metavar="S",
                    help="ask again every S seconds until interrupted (Ctrl-C)")
    ap.add_argument("--repro", metavar="OUT.py", help="also write a script that replays the live state's verdict on "
                    "this machine's CPU (see the post-mortem's --repro); rewritten at each --watch refresh")
    ap.add_argument("--repro-test", metavar="OUT_test.py", help="also write the same replay as a pytest test")
    args = ap.parse_args(argv)
    if args.timeout is not None and args.timeout <= 0:
        print(f"error: --timeout {args.timeout:g}: expected a positive number of seconds", file=sys.stderr)
        return 2
    try:
        wanted = parse_ranks(args.ranks) if args.ranks else None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        return _live_loop(args, wanted)
    except KeyboardInterrupt:  # Ctrl-C: how --watch ends
        return 0


def _live_loop(args: argparse.Namespace, wanted: list[int] | None) -> int:
    from torch_ext.diagnose.live import LiveError, ask, format_text

    while True:
        try:
            rep = ask(args.address, timeout=args.timeout, ranks=wanted, all_ranks=args.all_ranks)
        except LiveError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(json.dumps(rep.to_json(), indent=2) if args.json else format_text(rep), flush=True)
        if args.html:
            stamp = datetime.datetime.fromtimestamp(rep.asked_ns / 1e9, datetime.timezone.utc)
            err = _write_text(args.html, render(rep.analysis(), title=f"torch_ext live report: {args.address} at "
                                                f"{stamp:%Y-%m-%d %H:%M:%S} UTC"), "--html")
            if err:
                print(err, file=sys.stderr)
                return 1
            if not args.json:
                print(f"\nwrote {args.html}")
        if args.repro or args.repro_test:
            wrote: list[str] = []
            errors: list[str] = []
            _write_repro(rep.analysis(), f"the live report of {args.address}", args, wrote, errors)
            for line in errors:
                print(line, file=sys.stderr)
            if errors:
                return 1
            if not args.json:
                print("\n" + "\n".join(wrote))
        if args.watch is None:
            return 0
        # Every rank reads each request once (2 store ops): at most one request per 2 exchange periods, and
        # per second, keeps a watched job within its store budget.
        period = max(args.watch, 1.0, 2 * rep.exchange_s)
        if period > args.watch and not args.json:
            print(f"(--watch {args.watch:g}: asking every {period:.1f} s, the fastest that keeps this job within "
                  "its store budget)")
        time.sleep(period)  # --watch: the refresh period
        if not args.json:
            print("\n" + "=" * 79)


def _write_repro(analysis, source: str, args: argparse.Namespace, wrote: list[str], errors: list[str]) -> None:
    """``--repro`` / ``--repro-test``: the replay of ``analysis``'s verdict (diagnose/repro.py)."""
    from torch_ext.diagnose import repro

    try:
        job, ranks = repro.build(analysis, source, repro.command_line())
    except repro.ReproError as e:
        errors.append(f"error: --repro: {e}")
        return
    count = sum(len(r["ops"]) for r in ranks.values())
    for path, text, flag, run in ((args.repro, repro.script, "--repro", "python {}"),
                                  (args.repro_test, repro.pytest_file, "--repro-test", "python -m pytest {}")):
        if not path:
            continue
        body = text(job, ranks)
        err = _write_text(path, body, flag)
        if err:
            errors.append(err)
        else:
            wrote.append(f"wrote {path} ({body.count(chr(10))} lines: {count} operation(s) of {job['world']} ranks); "
                         f"run it: {run.format(path)}")


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "live":
        return live_main(argv[1:])
    ap = argparse.ArgumentParser(
        prog="torch-ext-diagnose",
        usage="torch-ext-diagnose [-h] [--html FILE] [--trace FILE] [--fr OUT_DIR] [--fr-prefix PREFIX]\n"
              "                          [--repro OUT.py] [--repro-test OUT_test.py] [--json] [--version] DUMP_DIR\n"
              "       torch-ext-diagnose live [--timeout S] [--ranks LIST] [--all-ranks] [--json] [--html FILE]\n"
              "                          [--watch S] [--repro OUT.py] [--repro-test OUT_test.py] HOST:PORT\n"
              "       (python -m torch_ext.diagnose ... is the same command)",
        description="Cross-rank analysis of the per-rank dumps a guarded job wrote to TORCH_EXT_DUMP_DIR; with `live`, "
                    "of a job that is running now, asked through its store (torch-ext-diagnose live --help).",
        epilog="A job that is running now: torch-ext-diagnose live HOST:PORT (see: live --help).",
    )
    ap.add_argument("dump_dir", help="the folder holding rank<N>.json dumps")
    ap.add_argument("--html", metavar="FILE", help="also write a self-contained page: one lane per rank, the stuck op "
                    "and the culprits marked")
    ap.add_argument("--trace", metavar="FILE", help="also write a Chrome Trace Event / Perfetto JSON (open it in "
                    "ui.perfetto.dev or chrome://tracing)")
    ap.add_argument("--fr", metavar="OUT_DIR", help="also write one PyTorch Flight Recorder file per rank into OUT_DIR "
                    "(an empty or new folder), for `torchfrtrace OUT_DIR -p PREFIX`")
    ap.add_argument("--fr-prefix", default=DEFAULT_PREFIX, metavar="PREFIX",
                    help=f"file name prefix of the Flight Recorder files (default {DEFAULT_PREFIX}; the rank follows)")
    ap.add_argument("--repro", metavar="OUT.py", help="also write a script that replays the job's collectives on this "
                    "machine's CPU (no code, data or model of the job) and checks that it ends in the same verdict: "
                    "python OUT.py")
    ap.add_argument("--repro-test", metavar="OUT_test.py", help="also write the same replay as a pytest test that "
                    "asserts the verdict")
    ap.add_argument("--json", action="store_true", help="print the analysis as JSON instead of text")
    ap.add_argument("--version", action=_PrintVersion,
                    help="print torch_ext's version and the torch it was compiled against, and exit")
    args = ap.parse_args(argv)
    try:
        analysis = analyze_dir(args.dump_dir)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    written = _written(analysis)
    job = job_state(analysis.dumps)
    stragglers = stragglers_from_snapshots([d.text for d in analysis.dumps])
    if args.json:
        print(json.dumps({
            "ranks": analysis.ranks,
            "bad_files": [{"path": b.path, "reason": b.reason} for b in analysis.bad],
            "groups": analysis.verdicts,
            "written_ns": written[0] if written else None,
            "age_s": round(written[1], 1) if written else None,
            "state": job.state,
            "written_at": job.written_at,
            "recovered_ns": job.recovered_ns,
            "finished_ns": job.finished_ns,
            "dump_states": {str(r): s for r, s in job.ranks.items()},
            "stragglers": stragglers,
        }, indent=2))
    else:
        if written:
            print(_age_line(*written, job))
            if job.state is not None:
                print(_state_line(job, written[0]))
        print("\n".join([format_text(analysis, past=job.state in ("recovered", "finished")),
                         *format_stragglers(stragglers)]))
    if not analysis.dumps:
        print(f"error: no torch_ext dump in {args.dump_dir!r} (it should hold the rank<N>.json files a job wrote "
              "to TORCH_EXT_DUMP_DIR, or that torch_ext.dump() wrote)", file=sys.stderr)
        return 1
    wrote: list[str] = []
    errors: list[str] = []
    if args.html:
        err = _write_text(args.html, render(analysis, title=f"torch_ext diagnose: {args.dump_dir}"), "--html")
        errors.append(err) if err else wrote.append(f"wrote {args.html}")
    if args.trace:
        err = _write_text(args.trace, json.dumps(render_trace(analysis), separators=(",", ":")), "--trace")
        errors.append(err) if err else wrote.append(f"wrote {args.trace} (open it in ui.perfetto.dev or chrome://tracing)")
    if args.fr:
        try:
            paths = export(analysis, args.fr, args.fr_prefix)
        except ExportError as e:
            errors.append(f"error: --fr: {e}")
        else:
            world = max(group_sizes(analysis.dumps).values(), default=0)
            missing = [r for r in range(world) if r not in analysis.ranks]
            line = (f"wrote {len(paths)} Flight Recorder file(s) to {args.fr}; analyse them with: "
                    f"torchfrtrace {args.fr} -p {args.fr_prefix}")
            if missing:
                line += " --allow-incomplete-ranks (no dump from rank(s) " + ",".join(map(str, missing)) + ")"
            wrote.append(line)
    verdicts = [v for v in analysis.verdicts if v.get("kind") not in (None, "none")]
    if (args.repro or args.repro_test) and verdicts and job.state in ("recovered", "finished"):
        # The dumps hold a warning the job got past, not a verdict: a replay of the wait would end
        # in a timeout the job never reached.
        errors.append(f"error: --repro: the job {job.state} after these dumps were written (every rank got past what "
                      "it waited in): there is no verdict to reproduce, and nothing was written")
    elif args.repro or args.repro_test:
        _write_repro(analysis, args.dump_dir, args, wrote, errors)
    if wrote and not args.json:
        print("\n" + "\n".join(wrote))
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
