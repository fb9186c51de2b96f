"""``python ARGS`` without importing torch again: programs forked from a warm interpreter.

A new interpreter spends 1.2-2.3 CPU-s importing torch before a program's first line runs; a test
suite that starts hundreds of real programs (one per rank, the examples, the CLIs) spends most of its
CPU there (docs/testing.md, "CI time"). :func:`popen` asks a *zygote*, an interpreter that imported
torch once (``_zygote.py``), to fork; the child sets itself up as ``python ARGS`` would and runs the
program at the top of its stack, so its exit is a real interpreter's: atexit hooks (torch_ext's
exit path), non-daemon threads joined, finalisation, the exit status and the moment it ends.

What differs from a fresh interpreter, and when :func:`popen` starts one instead:

- torch (``PRELOAD``) is imported before the program's environment is set. Variables read at
  import or at interpreter start (``IMPORT_TIME``: PYTHONPATH, whose packages torch may look for,
  OpenMP's and MKL's thread counts, the hash seed, torch's C++ log level and distributed switches,
  ...) take the zygote's values, so a program whose environment sets them otherwise gets a zygote
  of its own, started with those values. What importing torch warned about is warned again in the
  program, under its own filters.
- The objects the preloads made are frozen out of the garbage collector's work (``gc.freeze``):
  they live as long as the program, as they would in a fresh interpreter, but its collections and
  its exit no longer walk them.
- The program's parent is the zygote, not this process: :class:`WarmProcess` has ``Popen``'s
  ``pid``, ``poll``, ``wait``, ``send_signal``, ``kill`` and ``returncode``, the exit status coming
  from the zygote.
- Programs of one zygote share Python's hash seed (forked ranks of ``run_ranks`` do too).
- The program's main thread has the zygote's frames below its own ``<module>`` (four, in
  ``torch_ext/testing/_zygote.py``): a full stack of it, such as the guard's reports print, counts
  them among torch_ext's outer frames. Output that shows such stacks and must match a fresh run
  (the docs' samples) comes from fresh programs.
- Options other than ``-u``, ``-W``, ``-m`` and ``-c`` before the program are not interpreted:
  such a command line gets a fresh interpreter.

A program whose own file imports one of ``EXTRA`` (Lightning: 2 CPU-s more; Accelerate) gets a zygote that
imported it too, and ``torch._dynamo``, which its first backward() would import: what such a module reads
from the environment at its import, the program reads again from its own (``_zygote.settle_preloads``).

One zygote per environment key, extra preloads and process, started on first use (about 1.5 CPU-s, 3 with
Lightning; outside any deadline of the caller's), ended when this process ends. Processes that see
``SHARED`` in their environment (``OWNER_PID:DIR``; tests/python/conftest.py sets it in pytest's main
process, so pytest-xdist's workers share) share one zygote per key instead: the first to want it starts it
under a lock in DIR, the others connect to it, and it ends when process OWNER_PID does. A pass of the suite
on five workers started 45 zygotes (84 CPU-s of imports) without it.
"""
from __future__ import annotations

import atexit
import fcntl
import hashlib
import os
import pickle
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel"]
# Preloaded too for a program whose own file imports them (a line ``import X`` or ``from X ...``).
EXTRA = ("lightning", "accelerate")
# And with them what such a program's training imports: the first backward() imports torch._dynamo
# (1.2 CPU-s on torch 2.13, in every rank forked after it). Not for every zygote: most programs start
# one of their own (an environment key of theirs), and there it cost more than their ranks saved.
TRAINS = ("torch._dynamo",)
_IMPORTS = re.compile(r"^[ \t]*(?:import|from)[ \t]+(" + "|".join(EXTRA) + r")\b", re.M)
# Read when the interpreter starts or when torch is imported: a program whose values differ from
# the zygote's cannot be forked from it.
IMPORT_TIME = (
    "PYTHONPATH", "PYTHONHASHSEED", "PYTHONOPTIMIZE", "PYTHONDEVMODE", "PYTHONMALLOC", "PYTHONTRACEMALLOC",
    "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONPLATLIBDIR", "PYTHONSTARTUP",
    "PYTHONUTF8", "PYTHONINTMAXSTRDIGITS", "PYTHONDONTWRITEBYTECODE", "PYTHONVERBOSE", "PYTHONINSPECT",
    "PYTHONBREAKPOINT", "LD_", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "KMP_", "GOMP_",
    "CUDA_", "NCCL_", "PYTORCH_", "TORCH_CUDA", "TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES", "TORCHDYNAMO_",
    "TORCHINDUCTOR_", "TORCH_COMPILE", "TORCH_LOGS", "TORCH_FORCE_", "TORCH_DISTRIBUTED_", "POSSIBLE_USER_WARNINGS")
_ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_zygote.py")
# "OWNER_PID:DIR": zygotes shared by every process that sees it, ended with process OWNER_PID (the module's
# docstring). Private to the test machinery (not a torch_ext setting): no TORCH_EXT_ prefix.
SHARED = "_TORCH_EXT_WARM_SHARED"


def _key(env: dict[str, str], extra: tuple[str, ...] = ()) -> tuple:
    """A zygote's identity: the import-time settings it was started with, and its extra preloads."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME))), tuple(extra)


def preloads(args: list[str] | None, cwd: Any = None) -> tuple[str, ...]:
    """The modules of ``EXTRA`` that the program of ``python ARGS`` imports in its own file (a script)."""
    if not args or not forkable(args):
        return ()
    kind, target = _zygote_module()._parse(list(args))[:2]
    if kind != "script":
        return ()
    try:
        with open(os.path.join(os.fspath(cwd) if cwd is not None else os.getcwd(), target), encoding="utf-8") as f:
            return tuple(sorted(set(_IMPORTS.findall(f.read()))))
    except (OSError, UnicodeDecodeError):
        return ()


def forkable(args: list[str], env: dict[str, str] | None = None) -> bool:
    """Whether ``python ARGS`` (in environment ``env``) is a command line the zygote runs as the interpreter would."""
    return _zygote_module().plain(args, env)


def _zygote_module():
    """_zygote.py's functions (it imports nothing but the standard library at its top)."""
    from torch_ext.testing import _zygote as module

    return module


class _Zygote:
    """A connection to a zygote: one this process started (and ends with it), or the one that forked
    this process, for programs with the same import-time settings (``sys._torch_ext_warm``)."""

    def __init__(self, env: dict[str, str] | None = None, socket_path: str | None = None,
                 extra: tuple[str, ...] = (), owner: int | None = None) -> None:
        """Connects to the zygote at ``socket_path``; without one, starts a zygote: this process's own
        (ended with it), or with ``owner`` a shared one at ``socket_path``, ended with process ``owner``."""
        self.proc = None
        self.lifeline = None
        self.dir = None
        if socket_path is None or owner is not None:
            if socket_path is None:
                self.dir = tempfile.mkdtemp(prefix="torch_ext_warm_")
                socket_path = os.path.join(self.dir, "socket")
            # This process's environment with the program's import-time values: nothing else of
            # the program's is there while torch is imported (each child sets its own environment).
            zenv = {k: v for k, v in os.environ.items() if not k.startswith(IMPORT_TIME)}
            zenv.update((k, v) for k, v in (env or {}).items() if k.startswith(IMPORT_TIME))
            zenv.pop("PYTHONWARNINGS", None)  # each child's own, applied when it starts
            passed = []
            if owner is None:
                self.lifeline, theirs = socket.socketpair()
                passed, lifeline = [theirs.fileno()], str(theirs.fileno())
            else:
                lifeline = f"pid:{owner}"
            with open(os.devnull, "rb") as null:
                self.proc = subprocess.Popen([sys.executable, _ZYGOTE, socket_path, lifeline, *PRELOAD,
                                              *extra, *(TRAINS if extra else ())],
                                             pass_fds=passed, env=zenv, stdin=null,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                             start_new_session=owner is not None)
            if owner is None:
                theirs.close()
            while not os.path.exists(socket_path):  # listening before it imports torch: milliseconds
                if self.proc.poll() is not None:
                    raise OSError(f"the warm interpreter ended at its start (exit {self.proc.returncode})")
                time.sleep(0.005)
        self.socket_path = socket_path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.connect(socket_path)
        self.lock = threading.Lock()
        self._shim = None

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    def ask(self, request: dict[str, Any], fds: list[int] = ()) -> Any:
        with self.lock:
            socket.send_fds(self.sock, [pickle.dumps(request)], list(fds))
            reply = self.sock.recv(1 << 16)
        if not reply:
            raise OSError(f"the warm interpreter at {self.socket_path} ended")
        return pickle.loads(reply)

    def shim(self, key: tuple) -> str:
        """A ``python`` for launchers that take an interpreter's path (torchrun's ``PYTHON_EXEC``): it
        forks its program from this zygote, stands in for it (signals passed on, its exit status,
        a signal's death re-raised) and starts a fresh interpreter where the import-time settings
        differ (_zygote.shim_main)."""
        if self._shim is None:
            path = os.path.join(tempfile.mkdtemp(prefix="torch_ext_warm_shim_"), "python")
            with open(path, "w") as f:
                # -IS: an interpreter that starts in milliseconds (no site, nothing from the
                # environment), running _zygote.shim_main.
                f.write(f"#!{sys.executable} -IS\nimport sys\nsys.path.insert(0, {os.path.dirname(_ZYGOTE)!r})\n"
                        f"import _zygote\n_zygote.shim_main({self.socket_path!r}, {key!r}, {sys.executable!r}, "
                        f"{IMPORT_TIME!r})\n")
            os.chmod(path, 0o755)
            self._shim = path
        return self._shim

    def close(self) -> None:
        self.sock.close()
        if self.lifeline is not None:
            self.lifeline.close()  # the zygote sees the end of its lifeline and exits
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            shutil.rmtree(self.dir, ignore_errors=True)
        elif self.proc is not None:
            self.proc.returncode = 0  # a shared zygote: it serves on after this process (Popen would warn)


_zygotes: dict[tuple, _Zygote] = {}
_zygotes_lock = threading.Lock()


def _zygote(env: dict[str, str], extra: tuple[str, ...] = ()) -> _Zygote:
    key = _key(env, extra)
    with _zygotes_lock:
        z = _zygotes.get(key)
        if z is None or not z.alive():
            if not _zygotes:
                atexit.register(_close_all)
            parent = getattr(sys, "_torch_ext_warm", None)  # this process is a warm program itself
            if parent is not None and parent.get("key") == key and os.path.exists(parent["socket"]):
                z = _Zygote(socket_path=parent["socket"])
            else:
                z = _shared(env, extra, key) or _Zygote(env, extra=extra)
            _zygotes[key] = z
        return z


def _shared(env: dict[str, str], extra: tuple[str, ...], key: tuple) -> _Zygote | None:
    """The shared zygote for ``key`` (started here if no process of the set has), or None without a set."""
    owner, _, directory = os.environ.get(SHARED, "").partition(":")
    if not owner.isdigit() or not os.path.isdir(directory):
        return None
    base = os.path.join(directory, hashlib.sha256(repr((sys.executable, key)).encode()).hexdigest()[:24])
    with open(base + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starter per key; the others wait, then connect
        if os.path.exists(base):
            try:
                return _Zygote(socket_path=base)
            except OSError:  # it ended (its owner did, or it failed): start another
                os.unlink(base)
        return _Zygote(env, socket_path=base, extra=extra, owner=int(owner))


def _close_all() -> None:
    for z in list(_zygotes.values()):
        z.close()
    _zygotes.clear()


def start(env: dict[str, str] | None = None, args: list[str] | None = None, cwd: Any = None) -> None:
    """Starts the zygote for programs with environment ``env`` (default: this process's) now, if it
    is not running: it imports torch (about 2 s), which a caller's first :func:`popen` then does not
    pay inside a deadline; ``args`` (``python ARGS``, in ``cwd``): the zygote for that program (its
    extra preloads). A zygote that cannot start (torch does not import in that environment)
    is no error here: :func:`popen` then starts fresh interpreters, which show why."""
    try:
        _zygote(dict(os.environ if env is None else env), preloads(args, cwd)).ask({"op": "ping"})  # once imported
    except OSError:
        pass


def shim(env: dict[str, str] | None = None, args: list[str] | None = None, cwd: Any = None) -> str:
    """The path of a ``python`` that forks its programs warm, for launchers that start ``python ARGS``
    themselves (``PYTHON_EXEC`` for torchrun's workers); programs whose import-time settings are not
    ``env``'s get a fresh interpreter from it. ``args``: the program the launcher will start (its extra
    preloads), in ``cwd``."""
    env = dict(os.environ if env is None else env)
    extra = preloads(args, cwd)
    try:
        zygote = _zygote(env, extra)
        zygote.ask({"op": "ping"})
    except OSError:
        return sys.executable  # no zygote in that environment: the launcher's programs start fresh
    return zygote.shim(_key(env, extra))


class WarmProcess:
    """A program forked by the zygote: ``subprocess.Popen``'s interface for what the callers use."""

    def __init__(self, zygote: _Zygote, pid: int, args: list[str]) -> None:
        self._zygote, self.pid, self.args = zygote, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            got = self._zygote.ask({"op": "status", "pid": self.pid})
            if got == "unknown":
                raise OSError(f"the warm interpreter does not know pid {self.pid}")
            self.returncode = got
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        end = None if timeout is None else time.monotonic() + timeout
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            fd = None  # already reaped by the zygote: poll() has its status
        try:
            while self.poll() is None:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                if fd is not None:
                    select.select([fd], [], [], left)
                else:
                    time.sleep(0.01)
        finally:
            if fd is not None:
                os.close(fd)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a pid the zygote has reaped (it may be another process's now)
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def popen(args: list[str], *, env: dict[str, str] | None = None, cwd: Any = None, stdin: Any = None,
          stdout: Any = None, stderr: Any = None, new_session: bool = False, warm_executable: bool = False):
    """``subprocess.Popen([sys.executable, *args], ...)``, forked warm where that runs it as a fresh interpreter
    would (see the module's docstring), else a fresh interpreter. ``stdin``/``stdout``/``stderr``: ``None``
    (this process's), a file object or descriptor, or ``subprocess.STDOUT`` for stderr. ``warm_executable``:
    the program's ``sys.executable`` is the zygote's :func:`shim`, so the interpreters it starts itself as
    ``sys.executable ARGS`` (Lightning's launcher's ranks) are forked warm too (or fresh, as the shim decides)."""
    env = dict(os.environ if env is None else env)
    cwd = os.fspath(cwd) if cwd is not None else os.getcwd()
    if not forkable(args, env):
        return subprocess.Popen([sys.executable, *args], env=env, cwd=cwd, stdin=stdin, stdout=stdout,
                                stderr=stderr, start_new_session=new_session)
    fds = []
    null = None
    for i, f in enumerate((stdin, stdout, stderr)):
        if f is None:
            fds.append(i)
        elif f == subprocess.STDOUT and i == 2:
            fds.append(fds[1])
        elif f == subprocess.DEVNULL:
            null = null if null is not None else os.open(os.devnull, os.O_RDWR)
            fds.append(null)
        else:
            fds.append(f if isinstance(f, int) else f.fileno())
    extra = preloads(args, cwd)
    try:
        zygote = _zygote(env, extra)
        request = {"op": "start", "args": list(args), "env": env, "cwd": cwd, "new_session": new_session,
                   "key": _key(env, extra)}
        if warm_executable:
            request["python"] = zygote.shim(_key(env, extra))
        pid = zygote.ask(request, fds)
    except OSError:  # no zygote in that environment (torch did not import there): a fresh interpreter
        pid = None
    finally:
        if null is not None:
            os.close(null)
    if pid is None:
        return subprocess.Popen([sys.executable, *args], env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr,
                                start_new_session=new_session)
    return WarmProcess(zygote, pid, args)


class ProgramTimeout(subprocess.TimeoutExpired):
    """:func:`run`'s timeout: its message carries the end of what the program printed and where each of its
    processes stood when the time ran out (a test's failure then says which process hung, and in what). Run
    with PYTHONFAULTHANDLER set, its processes were sent SIGABRT first: their Python stacks are in the output."""

    def __init__(self, cmd: list[str], timeout: float, output: bytes | None = None, stderr: bytes | None = None, *,
                 processes: str = "") -> None:
        super().__init__(cmd, timeout, output, stderr)
        self.processes = processes

    def __str__(self) -> str:
        text = super().__str__()
        for name, data in (("stdout", self.output), ("stderr", self.stderr)):
            if data:
                text += f"\n--- its {name}, last 8000 characters:\n" + data.decode(errors="replace")[-8000:]
        return text + "\n--- its processes when the time ran out:\n" + (self.processes or "(none found)")


def _proc(pid: int | str, name: str) -> str:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _stood(path: str) -> str:
    """``STATE in WCHAN`` of a process or thread, from its /proc directory."""
    stat = _proc(path, "stat")
    state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
    return f"{state} in {_proc(path, 'wchan') or '?'}"


def _read(open_fds: list[int], chunks: dict[int, list[bytes]], end: float | None) -> None:
    """Reads the pipes in ``open_fds`` into ``chunks`` until each is at its end (removed) or ``end`` passes."""
    while open_fds:
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            return
        ready, _, _ = select.select(open_fds, [], [], left)
        for fd in ready:
            data = os.read(fd, 1 << 16)
            if data:
                chunks[fd].append(data)
            else:
                open_fds.remove(fd)


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass  # ended meanwhile


def _program_pids(root: int, cwd: Any = None) -> list[int]:
    """``root`` and, where ``cwd`` is a folder of the program's own (not this process's), every process working
    there: forked ranks are the zygote's children, not the program's; a DataLoader's workers are theirs."""
    own = os.path.realpath(os.fspath(cwd)) if cwd is not None else None
    if own == os.path.realpath(os.getcwd()):
        own = None
    pids = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        try:
            if name.isdigit() and (int(name) == root or (own is not None and os.readlink(f"/proc/{name}/cwd") == own)):
                pids.append(int(name))
        except OSError:
            continue
    return sorted(pids)


def processes(root: int, cwd: Any = None) -> str:
    """One line per process of a program (:func:`_program_pids`): pid, parent, state and kernel wait, command
    line, its threads' names and states (Linux /proc; empty elsewhere)."""
    lines = []
    for pid in _program_pids(root, cwd):
        name = str(pid)
        stat = _proc(name, "stat")
        ppid = stat.rsplit(")", 1)[-1].split()[1] if ")" in stat else "?"
        command = _proc(name, "cmdline").replace("\0", " ").strip()[:300]
        threads: dict[str, int] = {}
        for tid in sorted(os.listdir(f"/proc/{name}/task")) if os.path.isdir(f"/proc/{name}/task") else []:
            label = f"{_proc(f'{name}/task/{tid}', 'comm').strip()}: {_stood(f'{name}/task/{tid}')}"
            threads[label] = threads.get(label, 0) + 1
        listed = ", ".join(f"{label}" + (f" (x{n})" if n > 1 else "") for label, n in threads.items())
        lines.append(f"pid {name} (parent {ppid}) {_stood(name)}: {command}\n    threads: {listed}")
    return "\n".join(lines)


def run(args: list[str], *, env: dict[str, str] | None = None, cwd: Any = None, timeout: float | None = None,
        merge: bool = False, warm_executable: bool = False) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *args], capture_output=True, text=True, ...)``, warm where it can be;
    ``merge``: stderr into stdout, as ``stderr=subprocess.STDOUT`` (one stream, as in a terminal);
    ``warm_executable``: as for :func:`popen`."""
    pipes = [os.pipe() for _ in range(1 if merge else 2)]
    try:
        proc = popen(args, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=pipes[0][1],
                     stderr=subprocess.STDOUT if merge else pipes[1][1], warm_executable=warm_executable)
    finally:
        for _, w in pipes:
            os.close(w)
    readers = [r for r, _ in pipes]
    chunks: dict[int, list[bytes]] = {r: [] for r in readers}
    open_fds = list(readers)
    end = None if timeout is None else time.monotonic() + timeout
    try:
        _read(open_fds, chunks, end)
        if open_fds:  # the time ran out
            pids = _program_pids(proc.pid, cwd)
            stood = processes(proc.pid, cwd)  # before the kill: which process hung, and where
            if (env or os.environ).get("PYTHONFAULTHANDLER"):
                # Its processes dump their Python threads' stacks on SIGABRT (faulthandler) into the output.
                _signal_all(pids, signal.SIGABRT)
                _read(open_fds, chunks, time.monotonic() + 5.0)
            proc.kill()
            proc.wait()
            outputs = [b"".join(chunks[r]) for r in readers]
            raise ProgramTimeout([sys.executable, *args], timeout, *outputs, processes=stood)
        left = None if end is None else max(0.0, end - time.monotonic())
        try:
            code = proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    finally:
        for r in readers:
            os.close(r)
    # Text as subprocess.run(text=True) gives it: decoded, universal newlines.
    out, err = (b"".join(chunks[r]).decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")
                for r in (readers if not merge else readers * 2))
    return subprocess.CompletedProcess([sys.executable, *args], code, out, None if merge else err)
