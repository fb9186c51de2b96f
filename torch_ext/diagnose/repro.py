"""``torch-ext-diagnose DUMP_DIR --repro OUT.py``: a job's failure as a script that reproduces it on a laptop.

From the per-rank dumps alone (no code, data or model of the job) this writes
one Python file: the job's groups, and for each rank the collectives it issued
in the window the verdict needs, each with its call site; ``python OUT.py``
replays them on CPU (``torch_ext/testing/replay.py``) and checks that the
replay ends in the job's verdict: the same kind, culprit ranks and differing
collectives, named at the job's lines.

The window: per group, from CONTEXT collectives before the last one every
dumped rank completed to CONTEXT after the first one a rank never saw complete
(or the verdict's); point-to-point operations as the ledgers hold them. A rank
without a dump stands in as its groups' other ranks saw it: it issues the
collectives before its group's verdict, then is gone (the verdict says so) or
stops issuing. docs/diagnostics.md ("A repro that runs anywhere") says the rest.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import pprint
import re
import shlex
import sys
from typing import Any

from torch_ext.diagnose import Analysis, Dump, culprits

__all__ = ["ReproError", "build", "script", "pytest_file", "summarize", "compare"]

# Collectives every dumped rank completed that a replay keeps before the first that not all did.
CONTEXT = 2
# Guard settings that every rank of a job shares (README's "job" scope), replayed as the job had them.
_JOB_SETTINGS = ("check", "warn_after", "abort_after", "end_deadlocks", "stream_gate", "epoch_check", "interval",
                 "store_budget", "straggler", "store_timeout")
_REPLAYED_OPS = {"all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "gather", "scatter",
                 "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier", "send",
                 "recv", "recv_any_source"}
# Ranks a replay starts as processes on one machine.
MAX_WORLD = 64
# A replay that waits for abort_after waits at most this long past warn_after.
_ABORT_CAP_S = 6.0
# The longest warn_after a replay waits for (the guard's default): its ranks compute nothing between
# operations, so a rank that never arrives is as absent at this look as at the job's later one.
_WARN_CAP_S = 10.0
_P2P = ("send", "recv", "recv_any_source")
_SPLITS = re.compile(r"send=\[([\d,]*)\], recv=\[([\d,]*)\]")


class ReproError(ValueError):
    """The dumps cannot be replayed; the message says why and what would make them replayable."""


def summarize(verdict: dict[str, Any]) -> dict[str, Any]:
    """What a verdict must keep in a replay: its kind, culprits, differing collectives and where they were issued."""
    out: dict[str, Any] = {"group": verdict.get("group"), "group_name": verdict.get("group_name"),
                           "kind": verdict.get("kind"),
                           "seq": verdict.get("seq"), "culprits": {str(r): why for r, why in culprits(verdict).items()}}
    if verdict.get("kind") == "mismatch" and verdict.get("ranks"):
        out["calls"] = {str(line["rank"]): [line.get("op") if line.get("issued", True) else "(not issued)",
                                            line.get("where", "")] for line in verdict["ranks"]}
    if verdict.get("kind") in ("hang", "failure"):
        out["op"] = verdict.get("op")
        out["not_arrived"] = list(verdict.get("not_arrived", []))
        out["gone"] = list(verdict.get("gone", []))
        out["wait_shape"] = verdict.get("wait_shape")
    if verdict.get("store_lost_host") is not None:  # StoreLostError: the store went down with this rank's process
        out["store_lost_host"] = verdict["store_lost_host"]
        out["store_health"] = verdict.get("store_health")  # "lost" (it exited) or "not answering" (it froze)
    return out


def compare(expected: list[dict[str, Any]], verdicts: list[dict[str, Any]],
            skipped: dict[str, int] | None = None) -> list[str]:
    """The differences between the job's verdicts (summaries) and a replay's; empty: the same.

    ``skipped``: per group name, the collectives the replay left out before its
    window; the replay's collective #N is the job's #N + skipped.
    """
    # By group name: two groups may share a label ("dp" of ranks 0,1 and "dp" of ranks 2,3).
    got = {v.get("group_name"): summarize(v) for v in verdicts if v.get("kind") not in (None, "none")}
    out: list[str] = []
    for want in expected:
        group = want.get("group")
        have = got.get(want.get("group_name"))
        if have is None:
            out.append(f'group "{group}": the job ended in a {want["kind"]} verdict, the replay in none')
            continue
        have = dict(have)
        if isinstance(have.get("seq"), int):
            have["seq"] += (skipped or {}).get(want.get("group_name"), 0)
        if want.get("gone"):
            # A gone rank, seen at another moment: whether the inner backend's error had reached the last
            # pending collective when the dump was written (a failure) or not yet (a hang) is a race, and so is
            # which of the collectives pending together (DDP's buckets) the verdict names.
            if {want.get("kind"), have.get("kind")} == {"hang", "failure"}:
                have["kind"] = want["kind"]
            if [have.get("seq"), have.get("op")] in want.get("pending", []):
                have["seq"], have["op"] = want.get("seq"), want.get("op")
        for key, value in want.items():
            if key == "pending":
                continue
            if have.get(key) != value:
                out.append(f'group "{group}": {key}: the job {value!r}, the replay {have.get(key)!r}')
    for name, have in got.items():
        if not any(w.get("group_name") == name for w in expected):
            out.append(f'group "{have["group"]}": the replay ended in a {have["kind"]} verdict the job did not have')
    return out


def _config(dump: Dump) -> dict[str, str]:
    out = {}
    for token in str(dump.data.get("config", "")).split():
        key, _, value = token.partition("=")
        out[key] = value
    return out


def _seconds(value: str) -> float | None:
    try:
        return float(value[:-1] if value.endswith("s") else value)
    except ValueError:
        return None


def _settings(config: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The replay's guard settings (environment) and notes on what it changed from the job's."""
    env: dict[str, str] = {}
    notes: list[str] = []
    for key in _JOB_SETTINGS:
        if key not in config:
            continue
        value = config[key]
        if key in ("warn_after", "interval", "abort_after", "store_timeout"):
            secs = _seconds(value)
            if secs is None:  # abort_after=timeout: the group's timeout
                continue
            value = f"{secs:g}"
        env["TORCH_EXT_" + key.upper()] = value
    warn = _seconds(config.get("warn_after", "10")) or 10.0
    if warn > _WARN_CAP_S:
        notes.append(f"warn_after is {_WARN_CAP_S:g} s here (the job's: {config['warn_after']}): the replay's ranks "
                     "compute nothing between operations, so a rank that never arrives shows at this look as at "
                     "the job's")
        warn = _WARN_CAP_S
        env["TORCH_EXT_WARN_AFTER"] = f"{warn:g}"
    abort = _seconds(config.get("abort_after", ""))
    if abort is None or abort > warn + _ABORT_CAP_S:
        capped = warn + _ABORT_CAP_S
        notes.append(f"abort_after is {capped:g} s here (the job's: {config.get('abort_after', '?')}): the verdict "
                     "comes at warn_after's look or at this abort")
        env["TORCH_EXT_ABORT_AFTER"] = f"{capped:g}"
    return env, notes


def _groups(dumps: list[Dump]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The job's groups besides the default one, in creation order, and every group's name -> label."""
    found: dict[str, dict[str, Any]] = {}
    for d in dumps:
        for name, info in d.data.get("pg_config", {}).items():
            g = found.setdefault(name, {"name": name, "desc": "", "ranks": list(info.get("ranks", []))})
            desc = info.get("desc", "")
            if desc and desc != name and not g["desc"]:
                g["desc"] = desc
        for g in d.data.get("groups", []):
            if g["name"] in found and g.get("desc") and g["desc"] != g["name"] and not found[g["name"]]["desc"]:
                found[g["name"]]["desc"] = g["desc"]

    def order(name: str) -> tuple:
        return (0, int(name)) if name.isdigit() else (1, name)

    names = sorted(found, key=order)
    labels = {n: (found[n]["desc"] or n) for n in names}
    return [found[n] for n in names[1:]], labels


def _op(entry: dict[str, Any], group: str) -> dict[str, Any]:
    op: dict[str, Any] = {"group": group, "op": entry["op"], "sizes": entry.get("input_sizes", []),
                          "dtypes": entry.get("input_dtypes", [])}
    if entry.get("reduce_op"):
        op["reduce_op"] = entry["reduce_op"]
    if entry["op"] in ("broadcast", "reduce", "gather", "scatter", "send", "recv"):
        op["peer"] = int(entry.get("peer", -1))
    if entry.get("tag"):
        op["tag"] = int(entry["tag"])
    if entry["op"] == "all_to_all_single":
        m = _SPLITS.search(entry.get("fingerprint", ""))
        if m and m.group(1) and m.group(2):
            op["send_splits"] = [int(x) for x in m.group(1).split(",")]
            op["recv_splits"] = [int(x) for x in m.group(2).split(",")]
    recorded = entry.get("frames", [])
    frames = [{"filename": f["filename"], "name": f["name"], "line": int(f["line"])} for f in recorded]
    # The call site (the user's frame, then the framework frame it went through), then its path:
    # the user frames that called it, replayed around it so that the replay's call paths are the job's.
    site = 2 if len(recorded) > 1 and recorded[1].get("library") else 1
    if frames:
        op["frames"] = frames[:site]
    if frames[site:]:
        op["callers"] = frames[site:]
    if entry.get("label"):
        op["label"] = entry["label"]
    if entry.get("state") != "completed":
        op["stuck"] = True  # the job's rank never saw it complete: where it waited, or what failed
    op["seq"] = int(entry.get("collective_seq_id") or 0)
    op["fingerprint"] = entry.get("fingerprint", "")
    return op


@dataclasses.dataclass
class _Row:
    created: int  # ns, the issuing process's wall clock
    record: int  # ledger record id: the order within one group
    ended: int | None  # ns; None: never completed
    op: dict[str, Any]


def _with_waits(rows: list[_Row]) -> list[dict[str, Any]]:
    """The rank's operations, each with the earlier ones (indices) that the job had waited for before issuing it.

    An operation the job completed before it created the next one was waited
    right away (a blocking call); one still running when later ones were created
    was async (DDP's buckets, isend/irecv) and is waited where the job had it done.
    """
    out: list[dict[str, Any]] = []
    outstanding: list[int] = []
    for j, row in enumerate(rows):
        op = {k: v for k, v in row.op.items() if k != "wait"}  # a copy: a stand-in rank reuses another's ops
        due = [i for i in outstanding if rows[i].ended is not None and rows[i].ended <= row.created]
        if due:
            op["wait"] = due
        outstanding = [i for i in outstanding if i not in due] + [j]
        out.append(op)
    return out


def _stalled_streams(dumps: list[Dump], skipped: int) -> str:
    """``RANK:N`` for nccl_sim's stall switch: the rank whose default-group stream never began the earliest
    collective that any rank's stream never began (N counts the replay's operations); "" for none."""
    first: dict[int, int] = {}
    for d in dumps:
        for g in d.data.get("groups", []):
            if g["name"] != "0":
                continue
            seqs = [int(e["collective_seq_id"]) for e in g.get("entries", [])
                    if e.get("stream_started") is False and not e.get("is_p2p")]
            if seqs:
                first[d.rank] = min(seqs)
    if not first:
        return ""
    low = min(first.values())
    stalled = [r for r, seq in first.items() if seq == low]
    if len(stalled) != 1 or low <= skipped:  # the switch stalls one rank's stream
        return ""
    return f"{stalled[0]}:{low - skipped}"


def _comebacks(analysis: Analysis) -> dict[int, dict[str, Any]]:
    """For a rank a hang verdict says never arrived: the collective the others waited in, which it issues once
    they have ended (a rank back from a long validation; its error is the one the job's rank got there)."""
    out: dict[int, dict[str, Any]] = {}
    for v in analysis.verdicts:
        if v.get("kind") != "hang" or not v.get("not_arrived") or not v.get("seq"):
            continue
        for d in analysis.dumps:
            if d.rank not in v.get("waiting", []):
                continue
            for g in d.data.get("groups", []):
                if g["name"] != v.get("group_name"):
                    continue
                for e in g.get("entries", []):
                    if int(e.get("collective_seq_id") or 0) == int(v["seq"]) and not e.get("is_p2p"):
                        op = {k: val for k, val in _op(e, g["name"]).items() if k != "stuck"}
                        for r in v["not_arrived"]:
                            out.setdefault(int(r), op)
    return out


def _pending_together(dumps: list[Dump], want: dict[str, Any]) -> list[list[Any]]:
    """[seq, op] of the collectives the waiting ranks had pending on the verdict's group (a gone rank's verdict
    may name any of them)."""
    out: list[list[Any]] = []
    for d in dumps:
        for g in d.data.get("groups", []):
            if g["name"] != want.get("group_name"):
                continue
            for e in g.get("entries", []):
                pair = [int(e.get("collective_seq_id") or 0), e.get("fingerprint")]
                if not e.get("is_p2p") and e.get("state") != "completed" and pair not in out:
                    out.append(pair)
    return sorted(out, key=lambda p: p[0])


def _completed_through(group: dict[str, Any]) -> int:
    """The last collective seq before which every one completed on this rank (a failed one did not)."""
    done = int(group.get("last_completed_seq", 0))
    for e in group.get("entries", []):
        seq = int(e.get("collective_seq_id") or 0)
        if seq and not e.get("is_p2p") and e.get("state") != "completed":
            done = min(done, seq - 1)
    return done


def build(analysis: Analysis, dump_dir: str, command: str | None = None) -> tuple[dict[str, Any], dict[int, dict]]:
    """The replay of the dumps' verdict: ``(JOB, RANKS)`` as ``torch_ext.testing.replay.run`` takes them."""
    dumps = analysis.dumps
    if not dumps:
        raise ReproError(f"no torch_ext dump in {dump_dir!r}: nothing to replay")
    expected = [summarize(v) for v in analysis.verdicts if v.get("kind") not in (None, "none")]
    for want in expected:
        if want.get("gone"):
            want["pending"] = _pending_together(dumps, want)
    if not expected:
        raise ReproError("the dumps hold no verdict (no hang, mismatch or failure was pending when they were "
                         "written): there is nothing to reproduce")
    sizes = [int(g["size"]) for d in dumps for g in d.data.get("groups", []) if g["name"] == "0"]
    world = max(sizes) if sizes else max(d.rank for d in dumps) + 1
    if world > MAX_WORLD:
        raise ReproError(f"the job had {world} ranks; a replay runs one process per rank on this machine, at most "
                         f"{MAX_WORLD}, and replaying only the ranks a verdict involves is not done yet")
    groups, labels = _groups(dumps)
    config = _config(dumps[0])
    settings, notes = _settings(config)
    devices = {e.get("device") for d in dumps for g in d.data.get("groups", []) for e in g.get("entries", [])}
    # A job on NCCL (or on nccl_sim) replays on nccl_sim: NCCL's host semantics on CPU.
    backend = "nccl_sim" if "cuda" in devices or "cpu:nccl_sim" in config.get("inner", "") else "gloo"
    agreed, start = _window_starts(dumps)
    for name, n in sorted(start.items()):
        if n:
            notes.append(f'group "{labels.get(name, name)}": the replay starts after the job\'s collective #{n}, which '
                         f"every rank completed: its #N is the job's #{n}+N")
    if backend == "nccl_sim":
        stall = _stalled_streams(dumps, start.get("0", 0))
        if stall:
            settings["TORCH_EXT_NCCL_SIM_STALL"] = stall
            notes.append(f"nccl_sim's stream stalls as the job's did (TORCH_EXT_NCCL_SIM_STALL={stall}: rank, "
                         "then the replayed operation of the default group that never began)")
    verdict_seq = {v.get("group_name"): int(v.get("seq") or 0) for v in analysis.verdicts}
    rows, unreplayable = _rows(dumps, start, verdict_seq)
    ranks: dict[int, dict[str, Any]] = {rank: {"ops": _with_waits(rs)} for rank, rs in rows.items()}
    gone = {int(r) for v in analysis.verdicts for r in v.get("gone", [])}
    for rank, op in _comebacks(analysis).items():
        if rank in ranks and rank not in gone:
            ranks[rank]["then"] = op
    members: dict[str, list[int]] = {g["name"]: g["ranks"] for g in groups}
    members["0"] = list(range(world))
    through = {name: verdict_seq[name] - 1 if verdict_seq.get(name) else agreed.get(name, 0) for name in members}
    for r in range(world):
        if r in ranks:
            if r in gone:
                ranks[r]["end"] = "gone"
            continue
        ranks[r] = {"ops": _with_waits(_stand_in_rows(r, members, rows, through)),
                    "end": "gone" if r in gone else "stops", "stand_in": True}
        notes.append(f"rank {r} left no dump: it stands in with the collectives its groups' other ranks got past, "
                     f"then {'is gone' if r in gone else 'stops issuing'}")
    if unreplayable:
        notes.append("not replayed (no replay for these operations yet): " + ", ".join(sorted(unreplayable)))
    # Launched with plain env:// (srun, mpirun), the job's rank 0 hosted the store: so does the replay's, and a
    # gone rank 0 takes it along (StoreLostError) as the job's did.
    store = "rank0" if any(d.data.get("store_host_rank") == 0 for d in dumps) else "launcher"
    if store == "rank0":
        notes.append("the store runs in rank 0's process, as in the job (a plain env:// launch)")
        if ranks[0].get("end") == "gone" and any(w.get("store_health") == "not answering" for w in expected):
            ranks[0]["end"] = "frozen"
            notes.append("rank 0 freezes (SIGSTOP) where the job's did: its store stops answering, as the job's "
                         "did; it is killed once the others have ended")
    import torch

    import torch_ext

    written = [int(d.data["time_ns"]) for d in dumps if isinstance(d.data.get("time_ns"), int)]
    job = {
        "world": world,
        "backend": backend,
        "store": store,
        "settings": settings,
        "groups": [{"name": g["name"], "desc": g["desc"], "ranks": g["ranks"]} for g in groups],
        "expected": expected,
        "skipped": {name: n for name, n in sorted(start.items()) if n},
        "source": {"dump_dir": dump_dir, "command": command or "", "written_ns": max(written) if written else None,
                   "job_config": dumps[0].data.get("config", ""), "dumped_ranks": analysis.ranks,
                   "job_software": dumps[0].data.get("software") or "(not in the dumps: written by an older torch_ext)",
                   "made_with": f"torch {torch.__version__}, torch_ext {torch_ext.__version__}, "
                                f"Python {platform.python_version()}"},
        "notes": notes,
    }
    return job, ranks


def _window_starts(dumps: list[Dump]) -> tuple[dict[str, int], dict[str, int]]:
    """Per group name: the last collective every dumped member completed, and the replay's start CONTEXT before."""
    agreed: dict[str, int] = {}
    for d in dumps:
        for g in d.data.get("groups", []):
            done = _completed_through(g)
            agreed[g["name"]] = min(agreed.get(g["name"], done), done)
    return agreed, {name: max(0, seq - CONTEXT) for name, seq in agreed.items()}


def _rows(dumps: list[Dump], start: dict[str, int],
          verdict_seq: dict[str, int]) -> tuple[dict[int, list[_Row]], set[str]]:
    """Each dumped rank's operations in the window, in the order it created them; and the ops not replayed."""
    unreplayable: set[str] = set()
    out: dict[int, list[_Row]] = {}
    for d in dumps:
        rows = []
        for g in d.data.get("groups", []):
            # The window ends CONTEXT collectives after the first this rank never saw complete, or after the
            # verdict's (a stream backend's ledger may hold completed collectives as not yet seen complete).
            stuck = [int(e.get("collective_seq_id") or 0) for e in g.get("entries", [])
                     if not e.get("is_p2p") and e.get("state") != "completed"]
            end = max(min(stuck), verdict_seq.get(g["name"], 0)) + CONTEXT if stuck else None
            for e in g.get("entries", []):
                seq = int(e.get("collective_seq_id") or 0)
                if not e.get("is_p2p") and (seq <= start.get(g["name"], 0) or (end is not None and seq > end)):
                    continue
                if e["op"] not in _REPLAYED_OPS:
                    unreplayable.add(e["op"])
                    continue
                rows.append(_Row(int(e.get("time_created_ns", 0)), int(e.get("record_id", 0)),
                                 e.get("time_discovered_completed_ns"), _op(e, g["name"])))
        rows.sort(key=lambda r: (r.created, r.record))
        out[d.rank] = rows
    return out, unreplayable


def _stand_in_rows(rank: int, members: dict[str, list[int]], rows: dict[int, list[_Row]],
                   through: dict[str, int]) -> list[_Row]:
    """What a rank without a dump issued, as far as its groups' dumped members know: per group, the collectives
    through ``through[group]`` (before the one its verdict names: every rank got past them, though a ledger may
    not have seen the last complete when the rank died), in one dumped member's order."""
    out: list[_Row] = []
    for name, rs in members.items():
        peer = next((r for r in rs if r in rows), None) if rank in rs else None
        if peer is None:
            continue
        for row in rows[peer]:
            op = row.op
            if op["group"] == name and op["op"] not in _P2P and op["seq"] and op["seq"] <= through[name]:
                out.append(row)
    return sorted(out, key=lambda x: (x.created, x.record))


def _site_text(frames: list[dict[str, Any]]) -> str:
    if not frames:
        return "(no Python call site recorded)"
    f = frames[0]
    text = f"{os.path.basename(f['filename'])}:{f['line']} in {f['name']}"
    if len(frames) > 1:
        v = frames[1]
        text += f" via {os.path.basename(v['filename'])}:{v['line']} in {v['name']}"
    return text


def _body(job: dict[str, Any], ranks: dict[int, dict[str, Any]]) -> list[str]:
    """The JOB and RANKS literals, one operation per line under a comment naming its job's line."""
    labels = {"0": "default_pg"}
    labels.update({g["name"]: g["desc"] or g["name"] for g in job["groups"]})
    lines = ["JOB = " + pprint.pformat(job, width=116, sort_dicts=False), "", "RANKS = {"]
    for r in sorted(ranks):
        info = ranks[r]
        extra = "".join(f", {k!r}: {info[k]!r}" for k in ("end", "stand_in") if k in info)
        if "then" in info:
            then = info["then"]
            lines.append(f"    # rank {r} never arrived; once the others have ended it issues #{then['seq']} "
                         f"{then['fingerprint']}, where they waited")
            extra += f", 'then': {({k: v for k, v in then.items() if k != 'fingerprint'})!r}"
        lines.append(f"    {r}: {{{extra[2:]}{', ' if extra else ''}'ops': [")
        for op in info["ops"]:
            seq = f"#{op['seq']} " if op.get("seq") else ""
            lines.append(f"        # {seq}{op['fingerprint']} on group {labels.get(op['group'], op['group'])!r} at "
                         f"{_site_text(op.get('frames', []))}")
            lines.append("        " + repr({k: v for k, v in op.items() if k != "fingerprint"}) + ",")
        lines.append("    ]},")
    lines.append("}")
    return lines


def _header(job: dict[str, Any], ranks: dict[int, dict[str, Any]], what: str) -> list[str]:
    src = job["source"]
    count = sum(len(r["ops"]) for r in ranks.values())
    head = [
        f'"""{what} of the verdict in {src["dump_dir"]}, written by torch_ext --repro.',
        "",
        f"The job: {job['world']} ranks, on {src['job_software']}; its guard config: {src['job_config']}",
        f"Made with {src['made_with']} by: {src['command']}",
        f"Replays {count} operation(s) on {job['world']} CPU process(es) over {job['backend']}, with no code, data",
        "or model of the job: zeros of the recorded shapes and dtypes, issued at the job's call sites.",
    ]
    for n in job.get("notes", []):
        head.append("Note: " + n)
    head += ["", "The job's verdict, which the replay must end in:"]
    for v in job["expected"]:
        head.append(f"  {v['kind']} on group {v['group']!r}: culprits {v['culprits']}")
    head.append('"""')
    return head


def script(job: dict[str, Any], ranks: dict[int, dict[str, Any]]) -> str:
    lines = _header(job, ranks, "A replay") + [
        "# Run: python THIS_FILE.py [--backend gloo|nccl_sim] [--keep DIR]; exit 0: the job's verdict again.",
        "import sys", "", "from torch_ext.testing import replay", "", *_body(job, ranks), "",
        'if __name__ == "__main__":', "    sys.exit(replay.main(JOB, RANKS))", ""]
    return "\n".join(lines)


def pytest_file(job: dict[str, Any], ranks: dict[int, dict[str, Any]]) -> str:
    deadline = int(float(job["settings"].get("TORCH_EXT_ABORT_AFTER", 30)) + 120)
    lines = _header(job, ranks, "A pytest case") + [
        "import pytest", "", "from torch_ext.testing import replay", "", *_body(job, ranks), "", "",
        f"@pytest.mark.timeout({deadline})",
        "def test_the_replay_ends_in_the_jobs_verdict(tmp_path):",
        "    outcome = replay.run(JOB, RANKS, keep=tmp_path)",
        "    assert outcome.same, outcome.describe()", ""]
    return "\n".join(lines)


def command_line() -> str:
    return " ".join(shlex.quote(a) for a in ["torch-ext-diagnose", *sys.argv[1:]])
