"""Export guard dumps as PyTorch Flight Recorder files: ``diagnose DUMP_DIR --fr OUT_DIR``.

PyTorch's analyzer (``torchfrtrace``, ``torch/distributed/flight_recorder/``) reads
one pickle per rank, named ``<prefix><rank>``, each a dict with ``version`` ("X.Y"),
``pg_config`` (per group: ``desc`` and ``ranks`` as a string) and one flat list of
``entries`` for the whole process. This module writes that format from the
per-rank guard dumps; the dumps themselves are unchanged.

What each field becomes, and why (see also docs/architecture.md):

- ``record_id``: one counter per process, as in torch (the guard's ledger ids
  count per group). With one group it is the ledger id minus one; with several,
  the windows are merged by creation time after the records that fell out of
  each window.
- ``collective_seq_id``: the guard's seq for collectives; a send/recv keeps the
  seq of the last collective before it and gets ``p2p_seq_id``, the group's
  count of point-to-point ops so far (torch's numbering).
- ``profiling_name``: ``<inner backend>:<torch op name>``, p2p as
  ``send 0->1`` / ``recv 1<-0`` (group ranks). An inner backend torch's
  analyzer does not know (a plugin) is labelled by device: ``gloo`` on CPU,
  ``nccl`` on CUDA.
- ``output_sizes``: derived from the op (the ledger records the tensors that are
  the same on every rank): all_gather outputs are ``world`` times the input,
  reduce_scatter inputs ``world`` times the output, all-to-all totals come from
  the recorded splits.
- ``state``: ``scheduled`` or ``completed``; an op that failed (inner error,
  abort, mismatch) never completed, so it is ``scheduled`` with ``retired``
  true, as torch writes an errored work.
"""
from __future__ import annotations

import os
import pickle
import re
import tempfile
from typing import Any

from torch_ext.diagnose import Analysis, Dump

__all__ = ["FR_VERSION", "DEFAULT_PREFIX", "ExportError", "fr_dump", "export"]

# The Flight Recorder format version written by torch 2.13 (ProcessGroupNCCL and
# gloo); torch's analyzer parses it as "major.minor" and picks its matching rules by it.
FR_VERSION = "2.10"
DEFAULT_PREFIX = "torch_ext_fr_rank_"

# Backend prefixes torch's analyzer accepts in profiling_name (types.Op).
_KNOWN_BACKENDS = {"nccl", "ncclx", "xccl", "gloo", "rccl", "rcclx", "mccl", "hccl"}
_DEVICE_FALLBACK = {"cpu": "gloo", "cuda": "nccl"}

# guard op -> the name torch's c10d backends record (torch's analyzer matches on it).
_TORCH_NAMES = {
    "broadcast": "broadcast",
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "allreduce_coalesced",
    "all_reduce_sparse": "all_reduce",
    "reduce": "reduce",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "_all_gather_base",
    "all_gather_coalesced": "ALLGATHER_coalesced",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "gather": "gather",
    "scatter": "scatter",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",  # torch records alltoall_base as all_to_all too
    "barrier": "barrier",
}


class ExportError(Exception):
    """The export cannot be written (bad output folder, nothing to export)."""


def _torch_dtype_name(name: str, cache: dict[str, str] = {}) -> str:  # noqa: B006 - a memo
    """'float32' -> 'Float': the c10 ScalarType name torch's Flight Recorder writes."""
    if name not in cache:
        import torch

        dtype = getattr(torch, name, None)
        out = name
        if isinstance(dtype, torch.dtype):
            try:
                out = torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")
            except (RuntimeError, TypeError):
                out = name
        cache[name] = out
    return cache[name]


def _inner_backends(config: str) -> dict[str, str]:
    """'inner=cpu:gloo,cuda:nccl check=async ...' -> {'cpu': 'gloo', 'cuda': 'nccl'}."""
    m = re.search(r"(?:^|\s)inner=(\S+)", config or "")
    out: dict[str, str] = {}
    if m:
        for part in m.group(1).split(","):
            dev, _, name = part.partition(":")
            if name:
                out[dev] = name
    return out


def _backend_label(device: str, inner: dict[str, str]) -> str:
    device = device or "cpu"
    name = inner.get(device, "")
    if name in _KNOWN_BACKENDS:
        return name
    return _DEVICE_FALLBACK.get(device, "gloo")


_SPLITS = re.compile(r"send=\[([0-9,]*)\], recv=\[([0-9,]*)\]\)$")


def _sizes(e: dict[str, Any], world: int, is_root: bool) -> tuple[list[list[int]], list[list[int]]]:
    """(input_sizes, output_sizes) as torch records them, from the guard's entry."""
    op = e["op"]
    rec = [list(s) for s in e["input_sizes"]]  # the tensors the guard fingerprinted
    if op in ("all_gather", "all_gather_coalesced"):
        return rec, [[world, *s] for s in rec]
    if op in ("all_gather_into_tensor", "all_gather_into_tensor_coalesced"):
        return rec, [[world * s[0], *s[1:]] if s else [world] for s in rec]
    if op == "reduce_scatter":
        return [[world, *s] for s in rec], rec
    if op in ("reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"):
        return [[world * s[0], *s[1:]] if s else [world] for s in rec], rec
    if op == "gather":
        return rec, ([[world, *s] for s in rec] if is_root else [])
    if op == "scatter":
        return ([[world, *s] for s in rec] if is_root else []), rec
    if op in ("all_to_all", "all_to_all_single"):
        m = _SPLITS.search(e.get("fingerprint", ""))
        if m and rec:
            send = [int(x) for x in m.group(1).split(",") if x]
            recv = [int(x) for x in m.group(2).split(",") if x]
            if op == "all_to_all":
                return [[sum(send)]], [[sum(recv)]]
            row = 1
            for d in rec[0][1:]:
                row *= d
            out_rows = sum(recv) // row if row else 0
            return rec, [[out_rows, *rec[0][1:]]]
        return rec, rec  # splits not recorded (more than 16 peers): no size check possible
    if op == "barrier":
        return [], []
    # all_reduce and friends, broadcast, reduce, send/recv: the output is the input.
    return rec, rec


def _group_desc(g: dict[str, Any]) -> str:
    desc = g.get("desc") or ""
    return desc if desc else "undefined"


def fr_dump(dump: Dump) -> dict[str, Any]:
    """One rank's guard dump as a Flight Recorder dump (the dict torch pickles)."""
    data = dump.data
    inner = _inner_backends(data.get("config", ""))
    groups = data.get("groups", [])
    rows: list[tuple[int, int, int, dict[str, Any]]] = []  # (time, group index, ledger id, entry)
    before_windows = 0
    pg_config: dict[str, Any] = {}
    pg_status: dict[str, Any] = {}
    for gi, g in enumerate(groups):
        name, desc, world = g["name"], _group_desc(g), int(g["size"])
        pg_config[name] = {"name": name, "desc": desc, "ranks": str([int(r) for r in g["ranks"]])}
        pg_status[name] = {
            "last_enqueued_collective": int(g["last_seq"]),
            "last_started_collective": -1,
            "last_completed_collective": int(g["last_completed_seq"]),
        }
        entries = g.get("entries", [])
        if not entries:
            continue
        before_windows += int(entries[0]["record_id"]) - 1
        # The seq of the last collective before the window's first entry.
        first_coll = next((e for e in entries if not e["is_p2p"]), None)
        last_coll = int(first_coll["collective_seq_id"]) - 1 if first_coll else int(g["last_seq"])
        for e in entries:
            ledger_id = int(e["record_id"])
            if not e["is_p2p"]:
                last_coll = int(e["collective_seq_id"])
            # Ledger ids count collectives and p2p ops alike: the p2p ops so far are the difference.
            coll_seq, p2p_seq = last_coll, ledger_id - last_coll
            me, peer = int(g["rank"]), int(e.get("peer", -1))
            backend = _backend_label(e.get("device", ""), inner)
            if e["op"] == "send":
                name_ = f"send {me}->{peer}"
            elif e["op"] in ("recv", "recv_any_source"):
                name_ = f"recv {me}<-{peer}"
            else:
                name_ = _TORCH_NAMES.get(e["op"], e["op"])
            ins, outs = _sizes(e, world, is_root=peer == me)
            dtypes = [_torch_dtype_name(d) for d in e["input_dtypes"]]
            in_dtypes = dtypes if ins else []
            out_dtypes = dtypes if outs else []
            completed = e["state"] == "completed"
            done = e.get("time_discovered_completed_ns") if completed else None
            fr = {
                "pg_id": gi,
                "process_group": (name, desc),
                "collective_seq_id": coll_seq,
                "p2p_seq_id": p2p_seq,
                "profiling_name": f"{backend}:{name_}",
                "time_created_ns": int(e["time_created_ns"]),
                "duration_ms": e.get("duration_ms") if completed else None,
                "input_sizes": ins,
                "input_dtypes": in_dtypes,
                "output_sizes": outs,
                "output_dtypes": out_dtypes,
                "state": "completed" if completed else "scheduled",
                "time_discovered_started_ns": None,
                "time_discovered_completed_ns": done,
                "retired": e["state"] != "scheduled",
                "timeout_ms": int(e.get("timeout_ms") or g.get("timeout_ms") or 0),
                "is_p2p": bool(e["is_p2p"]),
                "frames": [dict(f) for f in e.get("frames", [])],
                # torch_ext's own view of the entry (torch's analyzer ignores extra keys).
                "torch_ext": {"op": e["op"], "fingerprint": e.get("fingerprint", ""), "state": e["state"],
                              "ledger_record_id": ledger_id, "device": e.get("device", ""),
                              **({"error": e["error"]} if e.get("error") else {}),
                              **({"label": e["label"]} if e.get("label") else {})},
            }
            rows.append((int(e["time_created_ns"]), gi, ledger_id, fr))
    if len(groups) > 1:
        rows.sort(key=lambda r: (r[0], r[1], r[2]))  # merge the groups' windows by creation time
    else:
        rows.sort(key=lambda r: r[2])
    entries_out = []
    for i, (_, _, _, fr) in enumerate(rows):
        rid = before_windows + i
        entries_out.append({"record_id": rid, **fr, "op_id": rid})
    return {
        "version": FR_VERSION,
        "pg_config": pg_config,
        "pg_status": pg_status,
        "entries": entries_out,
        "torch_ext": {
            "source": os.path.basename(dump.path),
            "rank": dump.rank,
            "pid": data.get("pid"),
            "hostname": data.get("hostname"),
            "time_ns": data.get("time_ns"),
            "incident": data.get("incident"),
            "main_thread": data.get("main_thread"),
        },
    }


def export(a: Analysis, out_dir: str | os.PathLike[str], prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Writes ``<out_dir>/<prefix><rank>`` for every valid dump; returns the paths.

    ``out_dir`` is created if needed. It must hold nothing but earlier exports
    (files named ``<prefix><N>``, which are replaced), since torch's analyzer
    reads every file whose name contains the prefix.
    """
    out_dir = os.fspath(out_dir)
    if not a.dumps:
        raise ExportError("no valid dumps to export (point diagnose at the TORCH_EXT_DUMP_DIR the job wrote)")
    if not prefix or not re.fullmatch(r"[\w\-]+", prefix) or prefix[-1].isdigit():
        raise ExportError(f"Flight Recorder prefix {prefix!r} must be letters, digits, '_' or '-' and not end "
                          "in a digit (torch's analyzer reads the rank from the digits after it)")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ExportError(f"cannot create {out_dir!r}: {e.strerror} (pass --fr a folder you can write)") from None
    ours = re.compile(re.escape(prefix) + r"\d+")
    others = sorted(n for n in os.listdir(out_dir) if not ours.fullmatch(n))
    if others:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        raise ExportError(f"{out_dir!r} holds other files ({shown}); torch's analyzer reads every file in it, "
                          "so pass --fr an empty or new folder")
    if not os.access(out_dir, os.W_OK):
        raise ExportError(f"cannot write to {out_dir!r}: permission denied (pass --fr a folder you can write)")
    for stale in os.listdir(out_dir):  # an earlier export, possibly of more ranks
        os.remove(os.path.join(out_dir, stale))
    paths = []
    for d in sorted(a.dumps, key=lambda d: d.rank):
        path = os.path.join(out_dir, f"{prefix}{d.rank}")
        payload = pickle.dumps(fr_dump(d), protocol=2)
        try:
            fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            os.replace(tmp, path)
        except OSError as e:
            raise ExportError(f"cannot write {path!r}: {e.strerror} (pass --fr a folder you can write)") from None
        paths.append(path)
    return paths
