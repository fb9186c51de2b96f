"""What DDP was doing: gradient buckets named in the guard's reports.

DDP's reducer issues one ``all_reduce`` per gradient bucket from inside
``loss.backward()``, in bucket order, so a report line such as::

    rank 0: all_reduce(float32[2177], SUM)  at train.py:53 in train

names the user's line but not which bucket, nor which parameters. The layout
lives only in the reducer (and changes once, after the first step, when DDP
rebuilds its buckets in gradient order), so it is read here, in the process
that raises, when the error's text is first read:

    rank 0: all_reduce(float32[2177], SUM)  at train.py:53 in train
            DDP gradient bucket 1 of 1: 0.weight, 0.bias, 2.weight, 2.bias

The reducer's buckets (``Reducer._get_zeros_like_grad_buckets``, through
``_compat``) are read for every live ``DistributedDataParallel`` (found by the
garbage collector's list: on the error path only, never per collective). The
report's facts (``GuardError.report``: each operation it names, as values) give
the all_reduces of one flat tensor, each matched to the buckets of the same
element count and dtype, and the note goes under each line that shows that
operation. Buckets agree across ranks (DDP checks the parameters' shapes at
construction and rank 0's rebuilt order is broadcast), so the other ranks'
lines are named from this rank's layout. Nothing here can change an error:
every failure leaves the text as it was.
"""
from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch

from torch_ext import _compat, errors
from torch_ext._groups import group_state

_NAMES_SHOWN = 6


@dataclass(frozen=True)
class Bucket:
    index: int
    count: int
    numel: int
    dtype: str  # "float32", as reports write it
    params: tuple[str, ...]

    def describe(self) -> str:
        names = ", ".join(self.params[:_NAMES_SHOWN])
        if len(self.params) > _NAMES_SHOWN:
            names += f" and {len(self.params) - _NAMES_SHOWN} more"
        return f"DDP gradient bucket {self.index + 1} of {self.count}: {names}"


def _ddp_modules() -> list[torch.nn.parallel.DistributedDataParallel]:
    ddp = torch.nn.parallel.DistributedDataParallel
    # type(o), not isinstance: isinstance reads o.__class__, which some objects compute (with warnings).
    return [o for o in gc.get_objects() if issubclass(type(o), ddp)]


def _layout(module: torch.nn.parallel.DistributedDataParallel) -> list[Bucket]:
    """``module``'s gradient buckets, as its reducer holds them now."""
    names = {id(p): n for n, p in module.module.named_parameters()}
    return [Bucket(index, count, numel, str(dtype).replace("torch.", ""), tuple(names.get(id(p), "?") for p in params))
            for index, count, numel, dtype, params in _compat.ddp_grad_buckets(module)]


def buckets() -> list[Bucket]:
    """The gradient buckets of every live DDP module in this process."""
    out: list[Bucket] = []
    for module in _ddp_modules():
        try:
            out += _layout(module)
        except Exception:  # noqa: BLE001 - a module torch could not describe is left out
            continue
    return out


def _note(layout: list[Bucket], dtype: str, numel: int) -> str:
    matches = [b for b in layout if b.dtype == dtype and b.numel == numel]
    if len(matches) == 1:
        return matches[0].describe()
    if matches:  # same size: the report cannot tell which
        which = " or ".join(str(b.index + 1) for b in matches)
        return f"DDP gradient bucket {which} of {matches[0].count} (the same size)"
    return ""


def _gradient_like(op: str, reduce_op: str, sizes: tuple[int, ...] | list[int], tensors: int) -> bool:
    """Whether an operation could be a DDP bucket's: an all_reduce (SUM or AVG) of one flat tensor."""
    return op == "all_reduce" and reduce_op in ("SUM", "AVG") and tensors == 1 and len(sizes) == 1


def annotate(text: str, report: errors.Report | None) -> str:
    """``text`` with each line that shows a DDP gradient bucket's all_reduce followed by its bucket and parameters."""
    named = report.ops if report is not None else ()
    ops = [f for f in named if _gradient_like(f.op, f.reduce_op, f.sizes, f.tensors)]
    if not ops:
        return text
    layout = buckets()
    notes = [(f.text, note) for f in ops if (note := _note(layout, f.dtype, f.numel))]
    if not notes:
        return text
    lines = []
    for i, line in enumerate(text.split("\n")):
        lines.append(line)
        for shown, note in notes:
            at = line.find(shown)
            if at >= 0:  # under the op; under the report's first line (its headline), indented
                lines.append(" " * (2 if i == 0 else at) + note)
                break
    return "\n".join(lines)


# DDP's words when a backward did not reduce every bucket (find_unused_parameters=False and a
# parameter without a gradient on this rank), raised by the next forward.
UNFINISHED = "Expected to have finished reduction in the prior iteration"


def _where(entry: dict) -> str:
    frames = entry.get("frames") or []
    if not frames:
        return ""
    f = frames[0]
    return f" at {os.path.basename(str(f.get('filename', '')))}:{f.get('line', '?')} in {f.get('name', '?')}"


def unfinished_reduction_note() -> str:
    """What the guard knows after DDP's "Expected to have finished reduction" on this rank: which of
    its last backward's gradient buckets it issued, from which line, and what that means for the
    peers. "" when there is no DDP module on a guarded group, or nothing to add."""
    notes = []
    for module in _ddp_modules():
        try:
            state = group_state(module.process_group, 256)
            layout = _layout(module)
        except Exception:  # noqa: BLE001 - not a guarded group, or a module torch cannot describe
            continue
        if not layout:
            continue
        sizes = {(b.dtype, b.numel) for b in layout}
        # The trailing run of gradient all_reduces: whole backwards, then the unfinished one.
        run = []
        for e in reversed(state.get("entries", [])):
            shapes, dtypes = e.get("input_sizes") or [], e.get("input_dtypes") or []
            gradient = bool(shapes and dtypes) and _gradient_like(str(e.get("op")), str(e.get("reduce_op")),
                                                                  shapes[0], len(shapes))
            if not gradient or (str(dtypes[0]), int(shapes[0][0])) not in sizes:
                break
            run.append(e)
        run.reverse()
        count = len(layout)
        issued = len(run) % count
        group = state.get("desc") or state.get("name") or "?"
        last = state.get("entries", [])[-1] if state.get("entries") else None
        head = f"torch_ext: after DDP's error above, rank {state.get('rank', '?')} of group \"{group}\""
        if issued:
            where = _where(run[-1])
            done = f"issued gradient buckets 1-{issued} of {count} in its last backward{where}"
        else:
            where = _where(run[-1]) if run else (_where(last) if last else "")
            done = (f"issued none of the {count} gradient buckets of its last backward "
                    f"(the backward before it ran{where})")
        held = layout[issued] if issued < count else None
        seq = last.get("collective_seq_id") if last else None
        text = (f"{head} {done}. DDP issues its buckets in order, so the first bucket holding a parameter "
                f"that got no gradient on this rank holds back itself and every bucket after it")
        if held is not None:
            text += f": {held.describe()}"
        text += (". Ranks whose parameters all got gradients issued those buckets and wait for this rank"
                 + (f" from collective #{seq + 1} on" if isinstance(seq, int) else "")
                 + ". Use every parameter in every forward on every rank, or DDP(find_unused_parameters=True).")
        notes.append(text)
    return "\n".join(notes)


def explain(exc: BaseException) -> str:
    """What the guard knows about ``exc``, an error torch raised outside the guard; "" for nothing.

    For DDP's "Expected to have finished reduction in the prior iteration" (a
    parameter without a gradient on this rank): how many of its last backward's
    gradient buckets this rank issued, the bucket holding the rest back with its
    parameters, and the collective from which the other ranks wait for this one.
    An uncaught one is followed by this text at exit; a program that catches it
    can log it. Runs on the error path only (it reads every DDP module's buckets).
    """
    # Not the guard's own errors: a peer's report may quote DDP's words from the rank that raised them.
    if isinstance(exc, RuntimeError) and not isinstance(exc, errors.GuardError) and UNFINISHED in str(exc):
        return unfinished_reduction_note()
    return ""


# A guard error's text names each gradient bucket under its all_reduce lines.
errors.add_annotator(annotate)
