"""Chrome Trace Event / Perfetto JSON of a dump directory: ``diagnose DUMP_DIR --trace FILE``.

The format ``torch.profiler`` exports (``{"traceEvents": [...]}``, times in
microseconds since ``baseTimeNanoseconds``), so the file opens in
ui.perfetto.dev and chrome://tracing and can sit next to a profiler trace:

- one process lane per rank (``pid`` is the rank's OS pid, as in a profiler
  trace of that rank; sorted by rank), one thread per process group;
- one complete event (``ph: X``) per ledger entry: name = the op, args = seq,
  shapes, dtypes, call site, state; a pending op lasts until the rank's dump;
- instant events for the report: the verdict (global), each culprit (on its
  lane, with its main thread's stack) and each rank's dump time;
- per rank a counter track "wait (ms)" (``ph: C``, one series per group): at
  each collective's completion, how long that rank waited in it (a straggler's
  track stays low while the others' stay high; stragglers.py names it).
"""
from __future__ import annotations

from typing import Any

from torch_ext.diagnose import Analysis, culprits, group_sizes
from torch_ext.diagnose._words import call_site, global_rank

__all__ = ["render_trace"]

_GROUP_TID_BASE = 1  # tid of the first group's thread within a rank's process


def _us(ns: int, base: int) -> float:
    return round((ns - base) / 1000.0, 3)


def _label_args(label: dict[str, Any] | None) -> dict[str, Any]:
    """A ``torch_ext.label``'s text, fields and origin as trace event args."""
    if not label:
        return {}
    args: dict[str, Any] = {"label": label.get("text", "")}
    if label.get("origin"):
        args["label origin"] = call_site(label["origin"])
    for k, v in (label.get("fields") or {}).items():
        args[f"label.{k}"] = v
    return args


def _stack(frames: list[dict[str, Any]]) -> list[str]:
    return [f"{f['name']} at {f['filename']}:{f['line']}" for f in frames]


def render_trace(a: Analysis) -> dict[str, Any]:
    """The trace as a dict (``json.dump`` it)."""
    times = [int(e["time_created_ns"]) for d in a.dumps for g in d.data.get("groups", []) for e in g.get("entries", [])]
    times += [int(d.data.get("time_ns", 0)) for d in a.dumps if d.data.get("time_ns")]
    base = (min(times) // 1_000_000_000) * 1_000_000_000 if times else 0
    end = max(times) if times else 0
    events: list[dict[str, Any]] = []
    pids: dict[int, int] = {}
    sizes = group_sizes(a.dumps)
    world = max(sizes.values(), default=0)
    for d in sorted(a.dumps, key=lambda d: d.rank):
        pid = int(d.data.get("pid") or 0) or 1_000_000 + d.rank
        pids[d.rank] = pid
        host = d.data.get("hostname") or "?"
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"rank {d.rank} (pid {d.data.get('pid')}, {host})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": d.rank}})
        dump_ns = int(d.data.get("time_ns", 0)) or end
        for gi, g in enumerate(d.data.get("groups", [])):
            tid = _GROUP_TID_BASE + gi
            label = g.get("desc") or g["name"]
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": f'group "{label}" (rank {g["rank"]} of {g["size"]})'}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
            for e in g.get("entries", []):
                start = int(e["time_created_ns"])
                stop = e.get("time_discovered_completed_ns") or dump_ns
                args = {
                    "seq": e["collective_seq_id"] if not e["is_p2p"] else None,
                    "p2p": f"#{e['p2p_seq_id']} with rank {global_rank(g, e.get('peer', -1))}" if e["is_p2p"] else None,
                    "op": e.get("fingerprint", e["op"]),
                    "shapes": e["input_sizes"],
                    "dtypes": e["input_dtypes"],
                    "call site": call_site(e.get("frames", [])),
                    "state": e["state"],
                    "record_id": e["record_id"],
                    "group": label,
                    **_label_args(e.get("label")),
                }
                if e.get("error"):
                    args["error"] = e["error"]
                if e["state"] == "scheduled":
                    args["state"] = "scheduled (still pending when the dump was written)"
                if e["state"] == "completed" and not e["is_p2p"] and e.get("time_discovered_completed_ns"):
                    events.append({"ph": "C", "cat": "guard,wait", "name": "wait (ms)", "pid": pid, "tid": 0,
                                   "ts": _us(int(stop), base), "args": {label: round((int(stop) - start) / 1e6, 3)}})
                events.append({
                    "ph": "X", "cat": "guard," + e["state"], "name": e["op"], "pid": pid, "tid": tid,
                    "ts": _us(start, base), "dur": max(round((int(stop) - start) / 1000.0, 3), 0.001),
                    "args": {k: v for k, v in args.items() if v is not None},
                    **({"cname": "terrible"} if e["state"] == "failed" else
                       {"cname": "bad"} if e["state"] == "scheduled" else {}),
                })
        main = d.data.get("main_thread", {})
        events.append({"ph": "i", "s": "p", "name": "dump written", "pid": pid, "tid": 0, "ts": _us(dump_ns, base),
                       "args": {"incident": d.data.get("incident", ""), "main thread": _stack(main.get("frames", [])),
                                "note": main.get("note", "")}})
    # Ranks without a dump still get a lane, so the culprit of a killed rank shows.
    for r in range(world):
        if r not in pids:
            pids[r] = 1_000_000 + r
            events.append({"ph": "M", "name": "process_name", "pid": pids[r], "tid": 0,
                           "args": {"name": f"rank {r} (no dump)"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pids[r], "tid": 0,
                           "args": {"sort_index": r}})
    by_rank = {d.rank: d for d in a.dumps}
    for v in a.verdicts:
        if v["kind"] == "none":
            continue
        head = v["text"].splitlines()[0] if v.get("text") else v["kind"]
        events.append({"ph": "i", "s": "g", "name": f"{v['kind']}: {head}", "pid": pids[min(pids)] if pids else 0,
                       "tid": 0, "ts": _us(end, base), "args": {"report": v["text"], "seq": v.get("seq")}})
        for r, why in culprits(v).items():
            d = by_rank.get(r)
            frames = d.data.get("main_thread", {}).get("frames", []) if d else []
            events.append({"ph": "i", "s": "p", "name": f"culprit: rank {r} {why}", "pid": pids.get(r, 1_000_000 + r),
                           "tid": 0, "ts": _us(end, base),
                           "args": {"why": why, "main thread": _stack(frames) or "(no dump from this rank)"}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "baseTimeNanoseconds": base,
            "otherData": {"producer": "torch_ext diagnose", "ranks": a.ranks}}
