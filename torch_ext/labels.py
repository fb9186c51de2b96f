"""Labels: say what a guarded collective is for, and which line asked for it.

``with torch_ext.label("metric 'val_loss'", origin=origin):`` attaches the label to
every guarded collective this thread issues inside the block. The ledger keeps it
next to the call site, and it appears in ``torch_ext.ledger()``, the dumps, the
mismatch and hang reports, the Flight Recorder export and the Perfetto trace::

    rank 0: all_reduce(float32[1], SUM)  at train.py:88 in on_validation_epoch_end
            for metric 'val_loss' (asked for at model.py:41 in validation_step)

``origin`` is a call site captured earlier, where the work was asked for (a
deferred collective, e.g. a metric synced at epoch end, runs far from that line):
:func:`here` captures it as a code object and a line number, which costs about as
much as reading an attribute. The label keeps the code object; file, function and
library are resolved when the label is first read (a report, a dump,
``torch_ext.ledger()``), once, and kept (a code object whose file or function name
is not ASCII is resolved when the label is first entered instead).

Costs: the C++ side keeps one id per thread (a ``thread_local``), which every
guarded collective reads whether a label is active or not. Entering a label is a
dict lookup (labels are interned once per distinct text, fields, hint and origin)
and one call into the extension.
"""
from __future__ import annotations

import functools
import sys
import threading
from types import CodeType, FrameType
from typing import Any, Callable, TypeVar

from torch_ext._core import _C

__all__ = ["Origin", "here", "label"]

F = TypeVar("F", bound=Callable[..., Any])


class Origin:
    """A call site captured earlier: a code object and a line, innermost first.

    ``frames`` is a tuple of ``(code, line)`` pairs: the frame that asked for the
    work first, then (optionally) the frames around it that are worth naming.
    """

    __slots__ = ("frames",)

    def __init__(self, code: CodeType, line: int) -> None:
        self.frames: tuple[tuple[CodeType, int], ...] = ((code, int(line)),)

    @classmethod
    def of_frame(cls, frame: FrameType) -> "Origin":
        return cls(frame.f_code, frame.f_lineno)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Origin) and other.frames == self.frames

    def __hash__(self) -> int:
        return hash(self.frames)

    def __repr__(self) -> str:
        code, line = self.frames[0]
        return f"Origin({code.co_filename}:{line} in {code.co_name})"


def here(depth: int = 0) -> Origin:
    """The caller's call site (``depth`` frames further out), kept as a code
    object and a line number: cheap enough for a per-step call."""
    return Origin.of_frame(sys._getframe(1 + depth))


def _origin_of(origin: Any) -> tuple[tuple[CodeType, int], ...]:
    if origin is None:
        return ()
    if isinstance(origin, Origin):
        return origin.frames
    if isinstance(origin, FrameType):
        return ((origin.f_code, origin.f_lineno),)
    if isinstance(origin, tuple) and len(origin) == 2 and isinstance(origin[0], CodeType):
        return ((origin[0], int(origin[1])),)
    raise TypeError(
        "torch_ext.label: origin must be torch_ext.here(), a frame or a (code object, line) pair, "
        f"got {type(origin).__name__}"
    )


_ids: dict[tuple[Any, ...], int] = {}
_ids_lock = threading.Lock()


def _intern(text: str, fields: dict[str, Any], hint: str, origin: tuple[tuple[CodeType, int], ...]) -> int:
    items = tuple((str(k), str(v)) for k, v in fields.items())
    key = (text, items, hint, origin)
    found = _ids.get(key)
    if found is not None:
        return found
    with _ids_lock:
        found = _C._intern_label(text, list(items), hint, list(origin))
        _ids[key] = found
    return found


class label:
    """Attach a label to every guarded collective issued inside, on this thread.

    Use as a context manager (``with torch_ext.label("metric 'loss'"): ...``) or
    a decorator (``@torch_ext.label("eval sync")``). ``fields`` are kept as
    strings in the ledger, the dumps and the exports; ``origin`` is a call site
    captured earlier (:func:`here`, a frame, or a ``(code, line)`` pair) that the
    reports name; ``hint`` is said once in a report about a collective with this
    label (what likely went wrong, in plain words). The innermost label wins;
    leaving it restores the one outside. A ``label`` object entered with ``with``
    keeps the ids it replaced on a small stack, so enter one object on one thread
    at a time; a decorated function may run on several threads at once.
    """

    __slots__ = ("text", "fields", "hint", "_origin", "_id", "_saved")

    def __init__(self, text: str, *, origin: Any = None, hint: str = "", **fields: Any) -> None:
        if not isinstance(text, str) or not text:
            raise ValueError(f"torch_ext.label: the text must be a non-empty string, got {text!r}")
        self.text = text
        self.fields = fields
        self.hint = str(hint or "")
        self._origin = _origin_of(origin)
        self._id = 0
        self._saved: list[int] = []

    def _label_id(self) -> int:
        if not self._id:
            self._id = _intern(self.text, self.fields, self.hint, self._origin)
        return self._id

    def __enter__(self) -> "label":
        self._saved.append(_C._set_label(self._label_id()))
        return self

    def __exit__(self, *exc: Any) -> None:
        _C._set_label(self._saved.pop())

    def __call__(self, fn: F) -> F:
        label_id = self._label_id

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # Each call keeps its own saved id: safe across threads and recursion.
            saved = _C._set_label(label_id())
            try:
                return fn(*args, **kwargs)
            finally:
                _C._set_label(saved)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"torch_ext.label({self.text!r})"
