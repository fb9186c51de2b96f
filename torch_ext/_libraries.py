"""Labels for the collectives libraries issue for the user: torchmetrics, Accelerate, FSDP2, DDP's buffers.

A metric computed on some ranks only is the classic hang of evaluation code: the
collective runs inside the library (``torchmetrics``'s state sync, Accelerate's
``gather``), so the call site a report names is the line that called the
library, and the report does not say which metric or call it was. When the guard
backend creates a process group, :func:`install` wraps, on the class and once:

- ``torchmetrics.Metric.sync`` (every state sync goes through it: ``compute()``,
  ``forward()`` with ``dist_sync_on_step``, an explicit ``sync()``): its
  collectives are labelled ``torchmetrics MulticlassAccuracy.compute()`` with
  ``metric=<class name>``, the line that called ``compute()`` as the origin, and
  a hint;
- ``accelerate.Accelerator.gather`` / ``gather_for_metrics`` / ``reduce``:
  labelled ``accelerate gather_for_metrics()`` with ``call=<name>``, the caller's
  line as the origin, and a hint. The outermost call names the label
  (``gather_for_metrics`` calls ``gather``).

- torch's own FSDP2 (``FSDPParamGroup.unshard`` / ``post_backward``) and DDP's broadcasts of the
  module's state at construction and of its buffers before each forward: labelled with the module
  path, the parameters or the buffers, each with its shape on this rank (the tensor behind the
  collective: the rank whose model differs shows which parameter or buffer).

Nothing is imported and no dependency is added: a library already imported
(``sys.modules``) is wrapped at once, one imported later is wrapped right after
its import (a finder on ``sys.meta_path`` that looks at two module names and
lets the import system do the rest). Each wrapper captures a code object and a
line (no strings) and enters a label: a dict lookup per call.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.abc
import os
import sys
import threading
import weakref
from types import FrameType
from typing import Any, Callable

import torch

from torch_ext._core import _C
from torch_ext.labels import Origin, label

__all__ = ["install"]

TORCHMETRICS_HINT = (
    "a torchmetrics metric syncs its state across all ranks when it is computed: call compute() on every rank "
    "(not under `if rank == 0:`), or create the metric with sync_on_compute=False for a rank-local value"
)
ACCELERATE_HINT = (
    "Accelerator.gather / gather_for_metrics / reduce are collectives: every process must call them, not only "
    "the main one (not under `if accelerator.is_main_process:`); gather first, then print or save on the main process"
)

_WRAPPED = "_torch_ext_labelled"
_local = threading.local()  # .busy: inside a wrapped call on this thread (the outermost names the label)
_lock = threading.Lock()
# torch, torch_ext, and contextlib (torchmetrics' sync_context is a generator
# context manager) are never the line that asked.
_SKIP = (
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
    os.path.dirname(os.path.abspath(__file__)) + os.sep,  # torch_ext's own folder
    contextlib.__file__,
)


def _package_dir(module_name: str) -> str | None:
    mod = sys.modules.get(module_name)
    path = getattr(mod, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) + os.sep if path else None


def _caller(frame: FrameType | None, skip: tuple[str, ...]) -> Origin | None:
    """The first frame outside the library, torch and torch_ext: the line that called it."""
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
    return Origin(frame.f_code, frame.f_lineno) if frame is not None else None


# --- torchmetrics -----------------------------------------------------------------


def _torchmetrics_call(frame: FrameType | None, skip: tuple[str, ...]) -> str:
    """Which public call of the metric asked for the sync: compute, forward or sync."""
    name = "sync"
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        co = frame.f_code.co_name
        if co == "sync_context":
            name = "compute"
        elif co in ("forward", "__call__", "_forward_reduce_state_update", "_forward_full_state_update"):
            name = "forward"
            break
        frame = frame.f_back
    return name


# Frameworks that compute metrics for the user (Lightning's epoch end) name them
# better than the class: ``fn(frame, class_name)`` gets the first frame outside
# torchmetrics and returns the label to use, or None. ddp_guard registers one.
_torchmetrics_labellers: list[Callable[[FrameType, str], Any]] = []


def register_torchmetrics_labeller(fn: Callable[[FrameType, str], Any]) -> None:
    if fn not in _torchmetrics_labellers:
        _torchmetrics_labellers.append(fn)


def _first_outside(frame: FrameType | None, skip: tuple[str, ...]) -> FrameType | None:
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
    return frame


def _wrap_torchmetrics() -> bool:
    mod = sys.modules.get("torchmetrics.metric")
    metric_cls = getattr(mod, "Metric", None)
    if metric_cls is None:
        return False
    sync = metric_cls.sync
    if getattr(sync, _WRAPPED, False):
        return True
    skip = (_package_dir("torchmetrics") or "\0",) + _SKIP

    @functools.wraps(sync)
    def labelled_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        should_sync = kwargs.get("should_sync", args[2] if len(args) > 2 else True)
        if not should_sync or getattr(_local, "busy", False):
            # forward() without dist_sync_on_step asks for no sync: nothing to label.
            return sync(self, *args, **kwargs)
        f = sys._getframe(1)
        name = type(self).__name__
        lab = None
        outside = _first_outside(f, skip)
        for labeller in _torchmetrics_labellers if outside is not None else ():
            lab = labeller(outside, name)
            if lab is not None:
                break
        if lab is None:
            origin = Origin(outside.f_code, outside.f_lineno) if outside is not None else None
            lab = label(f"torchmetrics {name}.{_torchmetrics_call(f, skip)}()", origin=origin,
                        hint=TORCHMETRICS_HINT, metric=name, library="torchmetrics")
        _local.busy = True
        try:
            with lab:
                return sync(self, *args, **kwargs)
        finally:
            _local.busy = False

    setattr(labelled_sync, _WRAPPED, True)
    metric_cls.sync = labelled_sync
    return True


# --- Accelerate -------------------------------------------------------------------


def _accelerate_wrapper(method: Callable[..., Any], call: str, skip: tuple[str, ...]) -> Callable[..., Any]:
    @functools.wraps(method)
    def labelled(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_local, "busy", False):
            return method(self, *args, **kwargs)
        lab = label(f"accelerate {call}()", origin=_caller(sys._getframe(1), skip), hint=ACCELERATE_HINT,
                    call=call, library="accelerate")
        _local.busy = True
        try:
            with lab:
                return method(self, *args, **kwargs)
        finally:
            _local.busy = False

    setattr(labelled, _WRAPPED, True)
    return labelled


def _wrap_accelerate() -> bool:
    mod = sys.modules.get("accelerate.accelerator")
    cls = getattr(mod, "Accelerator", None)
    if cls is None:
        return False
    skip = (_package_dir("accelerate") or "\0",) + _SKIP
    for call in ("gather", "gather_for_metrics", "reduce"):
        method = getattr(cls, call, None)
        if method is None or getattr(method, _WRAPPED, False):
            continue
        setattr(cls, call, _accelerate_wrapper(method, call, skip))
    return True


# --- torch's own: FSDP2's parameter groups, DDP's buffers ----------------------------------

FSDP2_HINT = (
    "FSDP2 issues these collectives for each fully_shard module, in module order, on every rank: the ranks parted "
    "here if this module ran on some ranks only (a branch that skips it: run it on every rank, e.g. on an empty "
    "batch) or if its parameters' shapes differ across ranks (build the same model everywhere)"
)
DDP_BUFFERS_HINT = (
    "DDP broadcasts the module's buffers (broadcast_buffers=True) before each forward: every rank's model must hold "
    "the same buffers, in the same order, with the same shapes and dtypes (a buffer registered on some ranks only, "
    "or sized by rank-local data, parts them here)"
)
_FSDP2_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
# The labels made per FSDP2 parameter group and per DDP module: beside them, not in their __dict__, which
# torch.save pickles and EMA callbacks deepcopy.
_fsdp2_labels: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ddp_labels: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_DDP_MODULE = "torch.nn.parallel.distributed"


def _listed(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _shaped(name: str, size: Any) -> str:
    """``name`` with its shape, ``1.weight[16x8]``: the line of the rank whose shape differs shows which."""
    return f"{name}[{'x'.join(str(d) for d in size)}]" if size is not None else name


def _with_label(fn: Callable[..., Any], label_of: Callable[..., label | None]) -> Callable[..., Any]:
    """``fn``, run with the label ``label_of(*args, **kwargs)`` gives (None: none) active on this thread; the
    label id is set and restored directly (re-entrant, and safe on autograd's threads). Marked as wrapped."""
    @functools.wraps(fn)
    def labelled(*args: Any, **kwargs: Any) -> Any:
        lab = label_of(*args, **kwargs)
        if lab is None:
            return fn(*args, **kwargs)
        saved = _C._set_label(lab._label_id())
        try:
            return fn(*args, **kwargs)
        finally:
            _C._set_label(saved)

    setattr(labelled, _WRAPPED, True)
    return labelled


def _fsdp2_label(group: Any, what: str) -> label | None:
    """The label of FSDP2 parameter group ``group``'s ``what`` ("unshard" or "reduce"), made once per group."""
    labels = _fsdp2_labels.get(group)
    if labels is None:
        labels = _fsdp2_labels[group] = {}
    found = labels.get(what)
    if found is None:
        fqn = getattr(group, "_module_fqn", None)
        params = [_shaped(getattr(p, "_param_fqn", None) or "?", getattr(p, "_orig_size", None))
                  for p in getattr(group, "fsdp_params", ())]
        if fqn is None:  # before FSDP2's lazy init has named them: label nothing yet
            return None
        module = f"module '{fqn}'" if fqn else "the root module"
        call = "unshard: all_gather" if what == "unshard" else "gradient reduction: reduce_scatter"
        found = labels[what] = label(
            f"FSDP2 {call} of {module} ({len(params)} parameters: {_listed(params)})", hint=FSDP2_HINT,
            module=fqn, parameters=",".join(params), library="fsdp2")
    return found


def _wrap_fsdp2() -> bool:
    cls = getattr(sys.modules.get(_FSDP2_MODULE), "FSDPParamGroup", None)
    if cls is None:
        return False
    for call, what in (("unshard", "unshard"), ("post_backward", "reduce")):
        method = getattr(cls, call, None)
        if method is not None and not getattr(method, _WRAPPED, False):
            setattr(cls, call, _with_label(method, lambda group, *_, _what=what, **__: _fsdp2_label(group, _what)))
    return True


def _ddp_buffers_label(ddp: Any) -> label | None:
    """The label of DDP module ``ddp``'s buffer broadcast: its buffers' names and shapes as they are now (DDP
    reads them again before the broadcast: a buffer replaced in a forward counts), made again when they change."""
    try:
        ignored = getattr(ddp, "parameters_to_ignore", ()) or ()
        buffers = [(name, tuple(t.shape)) for name, t in ddp.module.named_buffers() if name not in ignored]
    except Exception:
        return None
    if not buffers:
        return None
    cached = _ddp_labels.get(ddp)
    if cached is not None and cached[0] == buffers:
        return cached[1]
    names = [_shaped(name, shape) for name, shape in buffers]
    lab = label(f"DDP's broadcast of the module's buffers ({len(names)}: {_listed(names)})", hint=DDP_BUFFERS_HINT,
                buffers=",".join(name for name, _ in buffers), library="ddp")
    _ddp_labels[ddp] = (buffers, lab)
    return lab


def _ddp_states_label(module: Any) -> label | None:
    """The label of DDP's broadcast of ``module``'s parameters and buffers at construction. DDP has compared
    the parameters' shapes across ranks just before it, so the buffers are named first."""
    try:
        buffers = [_shaped(name, t.shape) for name, t in module.named_buffers()]
        params = sum(1 for _ in module.parameters())
    except Exception:  # not an nn.Module after all: DDP will say so
        return None
    listed = f"buffers: {_listed(buffers)}; " if buffers else ""
    return label(f"DDP's broadcast of the module's state at construction ({listed}{params} parameters)",
                 hint=DDP_BUFFERS_HINT.replace("before each forward", "at construction and before each forward"),
                 library="ddp")


def _wrap_ddp() -> bool:
    mod = sys.modules.get(_DDP_MODULE)
    cls = getattr(mod, "DistributedDataParallel", None)
    method = getattr(cls, "_sync_buffers", None)
    sync_states = getattr(mod, "_sync_module_states", None)  # DDP's own reference to torch.distributed.utils'
    if method is None:
        return False
    if not getattr(method, _WRAPPED, False):
        cls._sync_buffers = _with_label(method, lambda ddp, *_, **__: _ddp_buffers_label(ddp))
    if sync_states is not None and not getattr(sync_states, _WRAPPED, False):
        mod._sync_module_states = _with_label(
            sync_states, lambda *args, **kwargs: _ddp_states_label(args[0] if args else kwargs.get("module")))
    return True


# --- libraries imported later -------------------------------------------------------

_WATCHED = {"torchmetrics.metric": _wrap_torchmetrics, "accelerate.accelerator": _wrap_accelerate,
            _FSDP2_MODULE: _wrap_fsdp2, _DDP_MODULE: _wrap_ddp}


class _Watcher(importlib.abc.MetaPathFinder):
    """Wraps a watched module right after it is first imported (a library imported
    after the process group was created). Any other import: one dict lookup."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        wrap = _WATCHED.get(fullname)
        if wrap is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_wrap(module: Any) -> None:
            exec_module(module)
            sys.modules[fullname] = module  # as the import system will (wrap reads it)
            with _lock:
                wrap()

        loader.exec_module = exec_and_wrap  # this module's loader object only
        return spec


_watcher = _Watcher()


def install() -> dict[str, bool]:
    """Wraps the libraries already imported (idempotent), and watches for the
    others' import; says which are wrapped now."""
    with _lock:
        done = {"torchmetrics": _wrap_torchmetrics(), "accelerate": _wrap_accelerate(), "fsdp2": _wrap_fsdp2(),
                "ddp": _wrap_ddp()}
        if not all(done.values()) and _watcher not in sys.meta_path:
            sys.meta_path.insert(0, _watcher)
        return done
