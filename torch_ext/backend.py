"""The ``guard`` c10d backend: registration, options and inspection.

Importing :mod:`torch_ext` registers the backend, after which::

    dist.init_process_group(backend="guard")          # CPU tensors on gloo, CUDA on NCCL
    dist.init_process_group(backend="cpu:guard,cuda:guard")  # the same; torch logs a warning at destroy (README)
    dist.new_group(ranks, backend="guard")
    dist.init_process_group(backend="guard", pg_options=GuardOptions(check="strict"))

The work happens in C++ (``torch_ext._C``): this module only creates the inner
backends torch already knows how to create, and hands them to the C++ wrapper.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
from datetime import timedelta
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist
from torch.distributed import Backend, PrefixStore

from torch_ext import _compat, _launcher, _libraries, _runtime, epochs
from torch_ext._core import _C
from torch_ext._ddp import explain
from torch_ext._groups import group_state
from torch_ext._groups import guard_backend as _guard_backend
from torch_ext.errors import GroupJoinError

__all__ = ["GuardOptions", "BACKEND_NAME", "ledger", "group_state", "dump", "describe", "inner_backend", "failure",
           "explain", "store_health", "monitored_barrier"]

BACKEND_NAME = "guard"
# Options of the default group, inherited by subgroups created without options.
_default_overrides: dict[str, str] = {}

_logger = logging.getLogger("torch_ext")


def _version() -> str:
    """torch_ext's version (written once, in torch_ext/__init__.py, which imported this module)."""
    return str(sys.modules["torch_ext"].__version__)


@dataclasses.dataclass
class GuardOptions:
    """Options of a ``guard`` process group (pass as ``pg_options=``).

    Every field left at ``None`` takes its value from the matching ``TORCH_EXT_*``
    environment variable, else the default (see the README's table). Values are
    validated by the C++ core when the group is created.

    Args:
        inner: backend per device type, e.g. ``{"cpu": "gloo", "cuda": "nccl"}``
            or the string ``"cpu:gloo,cuda:nccl"`` (TORCH_EXT_INNER).
        check: ``"verify"`` (default: a result reaches the program only once every
            rank is known to have issued the same collectives; checked in batches
            next to the collectives), ``"strict"`` (before each collective),
            ``"async"`` (off the hot path) or ``"off"`` (TORCH_EXT_CHECK).
        warn_after: seconds before a hang report (TORCH_EXT_WARN_AFTER).
        abort_after: seconds before a stuck collective fails (TORCH_EXT_ABORT_AFTER).
        busy_cap: seconds a collective may wait while every rank it waits for
            is busy (its main thread runs, its process moves storage bytes):
            past ``abort_after`` the wait goes on until such a rank stops
            progressing or this cap passes; ``"auto"`` (default: 4 x
            abort_after), ``0`` for none (TORCH_EXT_BUSY_CAP).
        end_deadlocks: end a certain deadlock (a wait-for cycle whose ranks all
            block in their waits) when ``warn_after`` finds it, with
            ``DeadlockError``; ``False`` waits for ``abort_after`` (TORCH_EXT_END_DEADLOCKS).
        stream_gate: with ``check="verify"`` on a stream backend, the stream that
            waits for a collective also waits, on the device, for the verdict, and a
            difference fills the result with NaN. ``"auto"`` (default): on nccl_sim's
            CPU streams, not yet on CUDA; ``"on"`` / ``True``: on CUDA (NCCL) too;
            ``"off"`` / ``False``: results are not held there, as ``async``
            (TORCH_EXT_STREAM_GATE).
        epoch_check: compare the ranks' batch counts at the end of each epoch of a
            DataLoader that issued collectives, and warn when they differ
            (uneven data); ``False`` turns the warning off (TORCH_EXT_EPOCH_CHECK).
        dump_dir: folder for per-rank JSON dumps (TORCH_EXT_DUMP_DIR).
        ledger_size: collectives remembered per group (TORCH_EXT_LEDGER_SIZE).
        interval: watchdog tick in seconds (TORCH_EXT_INTERVAL).
        call_sites: record Python call sites (TORCH_EXT_CALL_SITES).
        call_paths: compare each collective's call path (its line and the lines
            that called it) across ranks, so look-alike collectives from
            different lines fail before their data is released: ``"auto"``
            (default: in strict only), ``"on"`` / ``True`` (verify and async
            too), ``"off"`` / ``False`` (TORCH_EXT_CALL_PATHS).
        store_timeout: seconds a store call of the guard may go unanswered
            before the store is declared lost; default 12 (TORCH_EXT_STORE_TIMEOUT).
        store_budget: store operations per second the watchdogs of the whole
            job may spend; 0 for none (TORCH_EXT_STORE_BUDGET).
        join_timeout: seconds the group's creation waits for every rank to
            join it before it fails with GroupJoinError naming the ranks that
            did not (TORCH_EXT_JOIN_TIMEOUT, 300).
        library_packages: Python packages whose frames count as library code
            in call sites and stacks, e.g. ``["mylab"]`` or ``"mylab,other"``
            (TORCH_EXT_LIBRARY_PACKAGES). Process-wide: the last guard group
            created decides.
        live_signal: signal that makes a rank log the whole job's live report,
            ``"SIGUSR2"`` (default), ``"SIGUSR1"``, ``"SIGRTMIN+N"`` or ``"off"``
            (TORCH_EXT_LIVE_SIGNAL). Process-wide: the first guard group decides.
        straggler: share of their time the other ranks must lose waiting for
            one rank before it is named a straggler, e.g. ``0.05`` or ``"5%"``;
            ``"off"`` for no analysis (TORCH_EXT_STRAGGLER).
    """

    inner: Mapping[str, str] | str | None = None
    check: str | None = None
    warn_after: float | None = None
    abort_after: float | None = None
    busy_cap: float | str | None = None
    end_deadlocks: bool | None = None
    stream_gate: bool | str | None = None
    epoch_check: bool | None = None
    dump_dir: str | os.PathLike[str] | None = None
    ledger_size: int | None = None
    interval: float | None = None
    call_sites: bool | None = None
    call_paths: bool | str | None = None
    store_timeout: float | None = None
    store_budget: int | None = None
    join_timeout: float | None = None
    library_packages: Sequence[str] | str | None = None
    live_signal: str | None = None
    straggler: float | str | None = None

    def overrides(self) -> dict[str, str]:
        """The options that were set, as strings for the C++ parser."""
        out: dict[str, str] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name == "inner" and isinstance(value, Mapping):
                value = ",".join(f"{dev}:{name}" for dev, name in value.items())
            elif f.name == "library_packages" and not isinstance(value, str):
                value = ",".join(value)
            elif isinstance(value, bool):
                value = "1" if value else "0"
            elif isinstance(value, os.PathLike):
                value = os.fspath(value)
            out[f.name] = str(value)
        return out

    def resolved(self) -> dict[str, Any]:
        """The effective settings (environment + these options), validated."""
        return _C.resolve_config(self.overrides())


def _overrides_from(pg_options: Any) -> dict[str, str]:
    if pg_options is None:
        return dict(_default_overrides)
    if isinstance(pg_options, GuardOptions):
        return pg_options.overrides()
    raise TypeError(
        f"backend 'guard' takes pg_options=torch_ext.GuardOptions(...), got {type(pg_options).__name__}; "
        "options of the inner backend are not supported yet"
    )


def _inner_value(cfg: Mapping[str, Any]) -> tuple[str, str]:
    """Where the inner-backend setting came from and its value, for error messages."""
    if "inner" not in cfg["source"]:
        return "the default inner backends", ",".join(f"{d}:{n}" for d, n in sorted(cfg["inner"].items()))
    source = cfg["source"]["inner"]
    if source.startswith("GuardOptions"):
        source = "GuardOptions(inner=...)"
    return source, cfg["raw"]["inner"]


# Inner backends that register themselves with torch on import, imported when a
# guard group first names one: entry points of this group, by backend name, in
# any installed package (torch_ext's own pyproject.toml lists nccl_sim, the CPU
# stand-in for NCCL in torch_ext.testing), so the guard imports none by name.
ON_DEMAND_GROUP = "torch_ext.inner_backends"


def _on_demand_backends() -> dict[str, Any]:
    """Backend name -> its entry point, for every inner backend registered on demand."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ON_DEMAND_GROUP)}


def _accepted_backends() -> list[str]:
    names = {"gloo"} if dist.is_gloo_available() else set()
    names |= set(_on_demand_backends())
    if dist.is_nccl_available():
        names.add("nccl")
    if dist.is_mpi_available():
        names.add("mpi")
    if dist.is_ucc_available():
        names.add("ucc")
    names |= {n.lower() for n in _compat.backend_plugins() if n.lower() != BACKEND_NAME}
    return sorted(names)


def _make_inner(
    name: str,
    device: str,
    store: dist.Store,
    rank: int,
    size: int,
    timeout: timedelta,
    group_name: str,
    global_ranks: list[int],
    where: tuple[str, str],
) -> dist.ProcessGroup:
    if name == "gloo" and dist.is_gloo_available():
        pg = dist.ProcessGroupGloo(store, rank, size, timeout)
        _compat.set_sequence_number(pg)
        return pg
    # From torch 2.15 on, torch registers its built-in backends in the registry,
    # and "nccl" there is nccl2 (c10d::nccl2, unless TORCH_DIST_USE_NCCL2=0) while
    # dist.ProcessGroupNCCL stays the legacy class: the registry's creator (the
    # plugin path below) gives the guard the NCCL that plain "nccl" gives.
    if name == "nccl" and dist.is_nccl_available() and _compat.backend_plugins().get("NCCL") is None:
        opts = dist.ProcessGroupNCCL.Options()
        opts.is_high_priority_stream = False
        _compat.set_nccl_timeout(opts, timeout)
        opts.global_ranks_in_group = global_ranks
        opts.group_name = group_name
        pg = dist.ProcessGroupNCCL(store, rank, size, opts)
        _compat.set_sequence_number(pg)
        return pg
    if name == "ucc" and dist.is_ucc_available():
        return _compat.ucc_process_group(store, rank, size, timeout)
    plugin = _compat.backend_plugins().get(name.upper())
    if plugin is None and (entry := _on_demand_backends().get(name)) is not None:
        entry.load()  # its module registers it with torch
        plugin = _compat.backend_plugins().get(name.upper())
    if plugin is not None and name != BACKEND_NAME:
        if not plugin.extended_api:
            return plugin.creator_fn(store, rank, size, timeout)
        opts = _compat.distributed_backend_options()
        opts.store = store
        opts.group_rank = rank
        opts.group_size = size
        opts.timeout = timeout
        opts.group_id = group_name
        opts.global_ranks_in_group = global_ranks
        return plugin.creator_fn(opts, None)
    raise _not_offered(name, device, where)


def _offered(name: str) -> bool:
    """Whether ``_make_inner`` can create an inner backend named ``name`` here."""
    built_in = {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available, "ucc": dist.is_ucc_available}
    if name in built_in and built_in[name]():
        return True
    return name != BACKEND_NAME and (
        _compat.backend_plugins().get(name.upper()) is not None or name in _on_demand_backends())


def _not_offered(name: str, device: str, where: tuple[str, str]) -> ValueError:
    source, value = where
    return ValueError(
        f"{source}='{value}' names inner backend '{name}' for device '{device}', which is not available "
        f"here: accepted values are {', '.join(_accepted_backends())} (any backend registered with "
        "torch.distributed.Backend.register_backend)"
    )


def _device_available(device: str) -> bool:
    if device == "cpu":
        return True
    if device == "cuda":
        return torch.cuda.is_available()
    mod = getattr(torch, device, None)
    return bool(mod is not None and getattr(mod, "is_available", lambda: False)())


def _store_host(store: dist.Store, global_ranks: list[int]) -> tuple[str, int]:
    """Who serves ``store``, in words, and the global rank whose process it is (-1: none or unknown).

    Under torchrun (and launchers that share its agent store) the agent hosts it;
    with a plain env:// rendezvous (srun, mpirun, one ``python train.py`` per rank)
    rank 0's process does, so rank 0 failing takes the store with it.
    """
    kind, host, port = _C._store_address(store)
    if kind != "TCPStore":
        return ("", -1)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        return ("the launcher's agent (torchrun's TCPStore)", -1)
    master = (os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT"))
    if master[1] is not None and str(port) == master[1]:
        return (f"rank 0's process (plain env:// rendezvous at MASTER_ADDR={master[0]}, MASTER_PORT={master[1]})", 0)
    return ("the process that created the TCPStore server (is_master=True)", -1)


# How long the guard ranks that refuse a group wait for each other in the rendezvous that
# releases a plain gloo rank (_release_plain_gloo_ranks).
_RELEASE_TIMEOUT = timedelta(seconds=10)
_RELEASED_KEY = "torch_ext/plain_gloo_released"


def _release_plain_gloo_ranks(store: Any, rank: int, size: int) -> None:
    """Ends the wait of a rank that created plain gloo where the others created the guard (issue 68).

    Such a rank waits in gloo's own rendezvous for the others' addresses, to gloo's timeout (30
    minutes by default) wherever the store outlives the guard ranks (torchrun's agent, or that
    rank's own process hosting it). The guard ranks that refuse the group complete that
    rendezvous at the group's prefix and close it at once: the rank's init returns and its first
    collective fails in gloo's words, seconds after the guard ranks named it.
    """
    plain = _C._plain_gloo_ranks(store, size) if dist.is_gloo_available() else []
    if not plain:
        return
    try:
        released = dist.ProcessGroupGloo(store, rank, size, _RELEASE_TIMEOUT)
        # Close only once every guard rank has connected its pairs: a guard rank that closed
        # first could end a plain rank before a slower guard rank reached it, and that guard
        # rank would then retry the connection to the gone rank to gloo's connect timeout.
        store.set(f"{_RELEASED_KEY}/{rank}", "1")
        store.wait([f"{_RELEASED_KEY}/{r}" for r in range(size) if r not in plain], _RELEASE_TIMEOUT)
    except Exception as e:  # noqa: BLE001 - a guard rank that did not come (gone): the rank waits, as before
        _logger.debug("guard: the plain gloo rank's rendezvous was not completed: %s", e)
        return
    del released  # its connections close: the plain rank's first collective fails


def _create_guard(dist_opts: Any, pg_options: Any) -> Any:
    """Creator registered with ``Backend.register_backend(extended_api=True)``."""
    global _default_overrides
    _runtime.made_group()
    # Labels for torchmetrics' and Accelerate's collectives, if they are imported.
    _libraries.install()
    overrides = _overrides_from(pg_options)
    config = _C._resolve(overrides)  # ValueError naming the bad setting; resolved once, here
    cfg = config.as_dict()
    if list(cfg["library_packages"]) != _runtime.library_packages():
        # Process-wide: call sites are decided per code object, not per group.
        _runtime.set_library_packages(list(cfg["library_packages"]))
    store = dist_opts.store
    rank, size = dist_opts.group_rank, dist_opts.group_size
    timeout = dist_opts.timeout
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    group_name = str(dist_opts.group_id)
    global_ranks = [int(r) for r in dist_opts.global_ranks_in_group] or list(range(size))

    # The join handshake (csrc/guard/store/JoinHandshake.h), before anything
    # waits for every rank (the inner backends' rendezvous): the ranks agree on
    # the job-wide settings (rank 0's), and a rank that will not join fails the
    # group here, named, instead of hanging the inner rendezvous.
    # (torch names the default group "0" and describes it "default_pg", the name reports use; a
    # subgroup's description reaches the backend only after it is created.)
    shown = "default_pg" if not dist_opts.global_ranks_in_group else group_name
    # This process's rank in the job, and the members it asked for: two processes that asked for
    # different lists get one group name from torch (a counter) and meet here (issue 67).
    global_rank = dist.get_rank() if dist_opts.global_ranks_in_group else rank
    try:
        config, adopt, notes = _C._join(store, rank, size, shown, config, _version(), torch.__version__,
                                        socket.gethostname(), os.getpid(), global_rank, global_ranks)
    except GroupJoinError:
        _release_plain_gloo_ranks(store, rank, size)
        raise
    if adopt:
        for note in notes:
            _logger.warning("%s", note)
        overrides = {**overrides, **adopt}  # what this group's subgroups inherit, if it is the default group
        cfg = config.as_dict()
    if not dist_opts.global_ranks_in_group:
        _default_overrides = dict(overrides)

    # An inner backend nobody offers is refused on every rank before any more store traffic: the
    # settings are the job's since the join, so each rank refuses alike, and none is left reading
    # a store whose host (rank 0 under plain env://) has already raised and ended.
    where = _inner_value(cfg)
    for device, name in sorted(cfg["inner"].items()):
        if _device_available(device) and not _offered(name):
            raise _not_offered(name, device, where)
    # Announce before the inner backends rendezvous, so the watchdog's first
    # reads of its neighbours find their keys.
    _C._announce(store, rank)
    # The inner backends' own timeout lies beyond the guard's deadlines (abort_after, busy_cap),
    # so the guard's report always comes first (Config::innerTimeout).
    inner_timeout = timedelta(seconds=config.inner_timeout(timeout.total_seconds()))
    created: dict[str, Any] = {}
    inner: dict[str, tuple[str, Any]] = {}
    for device, name in sorted(cfg["inner"].items()):
        if not _device_available(device):
            continue
        if name not in created:
            created[name] = _make_inner(
                name, device, PrefixStore(f"inner/{name}/", store), rank, size, inner_timeout, group_name,
                global_ranks, where,
            )
        inner[device] = (name, created[name])
    if not inner:
        raise ValueError(f"{where[0]}='{where[1]}' leaves no inner backend for any available device")
    helper = None
    if cfg["check"] != "off" and dist.is_gloo_available():
        # The guard's own small check collectives (verify mode's rounds, strict mode's
        # per-collective check, the all-to-all split audit) run on a CPU group of their own.
        helper = dist.ProcessGroupGloo(PrefixStore("guard_ctl/", store), rank, size, inner_timeout)
    hosted_by, host_rank = _store_host(store, global_ranks)
    _launcher.install()  # under torchrun: torchrun's SIGTERM leaves the report first (LauncherStop.h)
    backend = _C._create_backend(
        store, rank, size, timeout.total_seconds(), group_name, global_ranks, config, inner, helper,
        hosted_by, host_rank,
    )
    if not dist_opts.global_ranks_in_group:
        # The default group: `torch-ext-diagnose live HOST:PORT` finds its keys from here (rank 0 writes it).
        _C._publish_live_directory(backend)
        if cfg["epoch_check"]:
            epochs.install(store, rank, size)
        else:
            epochs.stop()
    return backend


def refuse_torchcomms_route() -> None:
    """Refuses (at ``import torch_ext``) a process where torch would create ``guard`` groups through torchcomms.

    torch would never call the guard's creator there: ``init_process_group("guard")``
    would fail inside torchcomms ("Backend guard specified, but
    TORCHCOMMS_BACKEND_LIB_PATH_GUARD not set"), or whatever torchcomms registered as
    "guard" would run instead (docs/architecture.md, "torchcomms").
    """
    switch = _compat.torchcomms_takes(BACKEND_NAME)
    if switch is not None:
        raise ImportError(
            f"torch_ext: {switch} with torchcomms installed makes torch {torch.__version__} create every process "
            "group backend, 'guard' included, through torchcomms.new_comm, which has no guard: unset it (the guard "
            "wraps gloo and NCCL itself; torch 2.15 lets the guard through), or do not import torch_ext in this job"
        )


def register() -> None:
    """Registers ``guard`` with torch.distributed (done at ``import torch_ext``)."""
    if BACKEND_NAME.upper() in _compat.backend_plugins():
        return
    Backend.register_backend(BACKEND_NAME, _create_guard, extended_api=True, devices=["cpu", "cuda"])
    # torch 2.15: each guard collective once in Flight Recorder, as its default
    # inner backends record it (gloo; NCCL only as nccl-legacy, TORCH_DIST_USE_NCCL2=0).
    _compat.mark_flight_recorder_native(BACKEND_NAME, {"gloo", "nccl"} if torch.cuda.is_available() else {"gloo"})


def _backends_by_device(pg: dist.ProcessGroup) -> dict[str, str]:
    """Device type -> name of the backend that runs that device's collectives in ``pg``.

    For ``guard`` that is the inner backend, and only devices it has one for (it
    creates none for a device that is not available, e.g. CUDA on a CPU machine).
    """
    out: dict[str, str] = {}
    for device in _compat.group_device_types(pg):
        backend = _compat.group_backend(pg, device)
        if _C._is_guard(backend):
            inner = _C._inner_names(backend)
            if device.type in inner:
                out[device.type] = inner[device.type]
        else:
            out[device.type] = backend.name()
    return out


def ledger(group: dist.ProcessGroup | None = None, max_entries: int = 0) -> list[dict[str, Any]]:
    """The recent operations of ``group``, oldest first.

    Each entry follows PyTorch's Flight Recorder fields where they overlap
    (``record_id``, ``collective_seq_id``, ``profiling_name``, ``input_sizes``,
    ``input_dtypes``, ``state``, ``frames``, ...) plus torch_ext's own (``op``,
    ``fingerprint``, ``hash``, ``peer``, ``reduce_op``, ...).
    """
    return group_state(group, max_entries)["entries"]


def describe(group: dist.ProcessGroup | None = None) -> str:
    """``GuardBackend(group="default_pg", rank=0, size=4, inner=cpu:gloo, check=async)``."""
    return _C._repr(_guard_backend(group))


def inner_backend(group: dist.ProcessGroup | None = None, device: str = "cpu") -> Any:
    """The backend that ``guard`` wraps for ``device`` in ``group`` (None if none)."""
    return _C._inner(_guard_backend(group), device)


def failure(group: dist.ProcessGroup | None = None) -> tuple[str, str] | None:
    """``(kind, report)`` if ``group`` has failed, else None."""
    return _C._failure(_guard_backend(group))


def store_health(group: dist.ProcessGroup | None = None) -> tuple[str, str]:
    """``(health, description)`` of the store channel of ``group``.

    ``health`` is ``"healthy"``, ``"not answering"`` or ``"lost"``; the description
    names the store, who hosts it and why it was declared lost ("" while healthy).
    """
    return _C._store_health(_guard_backend(group))


def dump(dir: str | os.PathLike[str] | None = None, reason: str = "manual") -> str:
    """Writes this rank's dump (all guarded groups) now; returns the file path.

    Without ``dir``, uses the groups' dump_dir (TORCH_EXT_DUMP_DIR); returns ""
    when neither is set.
    """
    return _C._dump(reason, os.fspath(dir) if dir is not None else "")


def live_report(timeout: float | None = None, ranks: list[int] | None = None):
    """The live report of the job this process belongs to, as ``torch-ext-diagnose live`` prints it.

    Every rank's host, pid, the collective it is in (or since when it computes)
    and its main thread's stack, and who waits for whom, asked through a store
    connection of its own and answered by each rank's watchdog thread (so ranks
    holding the GIL or blocked in a collective answer too). Returns a
    :class:`torch_ext.diagnose.live.LiveReport` (``.text()``, ``.to_json()``)
    within ``timeout`` seconds (default 5), naming ranks that did not answer.
    Any rank may call it, any time; the others need not.
    """
    from torch_ext.diagnose.live import live_report as _live_report

    return _live_report(timeout=timeout, ranks=ranks)


def monitored_barrier(group: dist.ProcessGroup | None = None, timeout: timedelta | None = None,
                      wait_all_ranks: bool = False) -> None:
    """``torch.distributed.monitored_barrier`` for guarded groups.

    torch's function refuses every backend not named "gloo" before reaching it;
    the guard forwards the call to the gloo group it wraps, which names the
    ranks that did not arrive, exactly as on plain gloo.
    """
    pg = group if group is not None else _compat.default_group()
    if not _C._is_guard(_compat.group_backend(pg, torch.device("cpu"))):
        dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)
        return
    if timeout is None:
        timeout = _compat.default_timeout(BACKEND_NAME)
    pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
