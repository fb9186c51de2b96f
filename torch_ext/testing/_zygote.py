"""A warm interpreter: imports torch once, then forks ``python ARGS`` programs on request.

Run as a script (``python _zygote.py SOCKET LIFELINE MODULE...``), never imported as part of
torch_ext: a preloaded torch_ext would have run its import-time set-up with this process's
settings. The clients are :mod:`torch_ext.testing._warm` (in the process that started this one, in
programs it forked: a replay's ranks, and in the other processes of a shared set: pytest-xdist's
workers) and the ``python`` shims ``_warm.shim`` writes (torchrun's workers, through
``PYTHON_EXEC``). It serves them on the AF_UNIX SOCK_SEQPACKET socket ``SOCKET``, one pickled
request per message, and ends when its ``LIFELINE`` ends: a descriptor number (a socket, its
creator's end, closes) or ``pid:N`` (process N, the owner of a shared set, exits):

  {"op": "start", "args": [...], "env": {...}, "cwd": ..., "fds": [N, ...]} + SCM_RIGHTS
      -> the program's pid; the descriptors become the program's descriptors N, ...; with
      "python": SHIM, the program's sys.executable is that shim
  {"op": "status", "pid": PID}   -> its exit code (a signal: -N), or None while it runs
  {"op": "wait", "pid": PID}     -> its exit code, once it has ended

A program started with ``"kill_on_close": True`` (a shim's) is killed when the connection that
started it closes: the shim, its stand-in for its launcher, was killed. A program joins the cgroups
of the process that asked for it, where they differ from this one's and can be written: it runs
where a fresh interpreter started by that process would (a shared zygote serves several test
workers, each of which a CPU profile counts in a cgroup of its own).

The zygote is single-threaded and installs no signal handler, so a child inherits nothing of it but
what a fresh interpreter that imported torch would have. The child sets itself up as ``python ARGS``
would (standard streams, working directory, environment, ``sys.argv``, ``sys.path``, a new
``__main__``, warning filters) and runs the program at the top of its stack: when the program ends,
this file's frames unwind with ``SystemExit`` and the interpreter exits as for any program: the
atexit hooks (torch_ext's among them), non-daemon threads joined, finalisation, the exit status.
An exception the program does not catch is printed and kept in ``sys.last_value`` as the
interpreter does, then the status is 1.
"""
import fcntl
import gc
import io
import os
import pickle
import select
import signal
import socket
import struct
import sys
import types
import warnings


def _pythonpath(env, cwd):
    """PYTHONPATH's entries as the interpreter puts them on sys.path (absolute; an empty one: the cwd)."""
    value = env.get("PYTHONPATH", "")
    return [os.path.abspath(p) if p else cwd for p in value.split(os.pathsep)] if value else []


# What the interpreter had before the preloads: the paths every child starts from (after its own
# first entry and PYTHONPATH's, which the client keeps equal to this process's), and the warning
# filters of a fresh interpreter (the environment's -W options go in front of them, as at start-up).
_BASE_PATH = [p for p in sys.path[1:] if p not in _pythonpath(os.environ, os.getcwd())]
_STARTUP_FILTERS = list(warnings.filters)


def _preload(modules):
    """Imports ``modules``; returns the warning filters they added and the warnings they issued."""
    with warnings.catch_warnings(record=True) as issued:
        warnings.simplefilter("always")
        added_before = list(warnings.filters)
        for name in modules:
            __import__(name)
        # Filters the preloaded modules added (at the front of the list) are a fresh interpreter's
        # too, once it has imported them; each child's -W options go between them and the start-up
        # ones.
        added = list(warnings.filters[:len(warnings.filters) - len(added_before)])
    return added, [(w.message, w.category, w.filename, w.lineno) for w in issued]


def settle_preloads():
    """Reads again from this process's environment what a preloaded module read from its own at import:
    for a process forked after its preloads (a warm program, a ``run_ranks`` rank) once its environment
    is set. Lightning's ``rank_zero_only.rank`` (from RANK, LOCAL_RANK, SLURM_PROCID, ...), which its
    strategies set again once the process group is up; until then it decides which rank prints."""
    rank_zero = sys.modules.get("lightning.fabric.utilities.rank_zero")
    if rank_zero is not None:
        rank_zero.rank_zero_only.rank = rank_zero._get_rank() or 0


def _stream(fd, mode, encoding, errors, line_buffering, unbuffered):
    if mode == "r":
        return io.TextIOWrapper(io.open(fd, "rb", closefd=False), encoding=encoding, errors=errors)
    raw = io.open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)
    return io.TextIOWrapper(raw, encoding=encoding, errors=errors, newline="\n", line_buffering=line_buffering,
                            write_through=unbuffered)


def plain(args, env=None):
    """Whether ``python ARGS`` runs a program with only options this file interprets (-u, -W, -m, -c;
    -B where the environment ``env`` sets PYTHONDONTWRITEBYTECODE, which the zygote then had at its
    start: multiprocessing's spawned children get it from ``sys.flags``)."""
    env = os.environ if env is None else env
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] in ("-m", "-c"):
            return i + 1 < len(args)
        if args[i] == "-W":
            i += 2
        elif args[i] == "-u" or args[i].startswith("-W") or (args[i] == "-B" and env.get("PYTHONDONTWRITEBYTECODE")):
            i += 1
        else:
            return False
    return i < len(args)


def _parse(args):
    """``python ARGS`` -> (kind, target, rest, unbuffered, warnoptions); kind: "script", "module", "command"."""
    unbuffered, warnoptions = False, []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-u":
            unbuffered = True
        elif a == "-W":
            warnoptions.append(args[i + 1])
            i += 1
        elif a.startswith("-W"):
            warnoptions.append(a[2:])
        elif a == "-B":
            pass  # as the zygote's own flags (plain: only where PYTHONDONTWRITEBYTECODE set them)
        elif a in ("-m", "-c"):
            return ("module" if a == "-m" else "command"), args[i + 1], args[i + 2:], unbuffered, warnoptions
        else:
            return "script", a, args[i + 1:], unbuffered, warnoptions
        i += 1
    raise ValueError(f"nothing to run in {args!r}")


def _become(req, torch_filters, import_warnings):
    """In the child: this process becomes ``python ARGS`` (everything but running it)."""
    env = req["env"]
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(env)
    kind, target, rest, unbuffered, warnoptions = _parse(req["args"])
    unbuffered = unbuffered or bool(env.get("PYTHONUNBUFFERED"))
    encoding = env.get("PYTHONIOENCODING", "").split(":")[0] or "utf-8"
    sys.stdin = sys.__stdin__ = _stream(0, "r", encoding, "strict", False, False)
    # As CPython's create_stdio: unbuffered streams write through; buffered ones flush each line on a
    # terminal, and stderr always.
    sys.stdout = sys.__stdout__ = _stream(1, "w", encoding, "strict", not unbuffered and os.isatty(1), unbuffered)
    sys.stderr = sys.__stderr__ = _stream(2, "w", encoding, "backslashreplace", not unbuffered, unbuffered)
    cwd = os.getcwd()
    pythonpath = _pythonpath(env, cwd)
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    if kind == "script":
        path = os.path.abspath(target)
        sys.path[:] = [os.path.dirname(os.path.realpath(path))] + pythonpath + _BASE_PATH
        sys.argv = [target, *rest]
        from importlib.machinery import SourceFileLoader

        main.__file__, main.__cached__, main.__spec__ = path, None, None
        main.__loader__, main.__package__ = SourceFileLoader("__main__", path), None
    elif kind == "module":
        sys.path[:] = [cwd] + pythonpath + _BASE_PATH
        sys.argv = ["-m", *rest]
    else:
        sys.path[:] = [""] + pythonpath + _BASE_PATH
        sys.argv = ["-c", *rest]
        main.__spec__ = main.__loader__ = main.__package__ = None
    sys.orig_argv = [sys.executable, *req["args"]]
    if req.get("python"):  # the program's own `sys.executable ARGS` starts go through a warm shim (_warm.popen)
        sys.executable = req["python"]
        spawn = sys.modules.get("multiprocessing.spawn")
        if spawn is not None:  # imported (by torch) before: it keeps the interpreter it saw then
            spawn.set_executable(req["python"])
    # Warning filters as at a fresh start: the start-up ones, the environment's and -W options in
    # front, then what importing the preloaded modules added.
    options = [o for o in env.get("PYTHONWARNINGS", "").split(",") if o] + warnoptions
    sys.warnoptions[:] = options
    warnings.filters[:] = _STARTUP_FILTERS
    warnings._processoptions(options)
    warnings.filters[:0] = torch_filters
    warnings._filters_mutated()
    # What importing torch warned about, the program sees as a fresh interpreter's would (its
    # filters decide), where it imports torch: before its own lines run.
    for message, category, filename, lineno in import_warnings:
        warnings.warn_explicit(message, category, filename, lineno)
    settle_preloads()
    if env.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable()
    return kind, target, main


def _run(kind, target, main):
    """Runs the program as the interpreter would; returns (exit code, uncaught exception or None)."""
    try:
        if kind == "script":
            with open(target, "rb") as f:
                code = compile(f.read(), main.__file__, "exec", dont_inherit=True)
            exec(code, vars(main))
        elif kind == "module":
            import runpy

            runpy._run_module_as_main(target, alter_argv=True)
        else:
            exec(compile(target, "<string>", "exec", dont_inherit=True), vars(main))
    except (SystemExit, KeyboardInterrupt):
        raise  # the interpreter's own handling: the exit status, or SIGINT's
    except BaseException as e:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        e.__traceback__ = e.__traceback__.tb_next  # from the program's first frame, as the interpreter shows it
        return 1, e
    return 0, None


def _join_cgroups(pid):
    """Moves this process into the cgroups of process ``pid`` where they differ from its own (cgroup v1
    hierarchies under /sys/fs/cgroup/CONTROLLER, or v2's unified one); what cannot be read or written is
    left as it is."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            theirs = f.read().splitlines()
        with open("/proc/self/cgroup") as f:
            mine = set(f.read().splitlines())
    except OSError:
        return
    for line in theirs:
        if line in mine:
            continue
        number, controllers, path = line.split(":", 2)
        names = [""] if number == "0" else [controllers, *controllers.split(",")]
        for name in names:
            procs = os.path.join("/sys/fs/cgroup", name) + path + "/cgroup.procs"
            try:
                with open(procs, "w") as f:
                    f.write(str(os.getpid()))
                break
            except OSError:
                continue


def _place(fds, targets):
    """Each descriptor of ``fds`` to the number at its index in ``targets`` (dup2 clears close-on-exec, as
    for an inherited one), ``fds`` closed: first all moved above those numbers, so that no dup2 overwrites
    one still to be placed (moved to the lowest free numbers instead, a spawned multiprocessing child's
    pipe got its resource tracker's descriptor)."""
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, max(targets, default=0) + 1) for fd in fds]
    for fd in fds:
        os.close(fd)
    for number, fd in zip(targets, moved):
        os.dup2(fd, number)
    for fd in moved:
        os.close(fd)


def _child(req, fds, sockets, torch_filters, import_warnings, asker):
    for s in sockets:
        s.close()
    if asker is not None:
        _join_cgroups(asker)
    _place(fds, req.get("fds", list(range(len(fds)))))
    if req.get("new_session"):
        os.setsid()
    # Where this program's own warm launches go (a replay from a warm repro.py): this zygote, for
    # programs whose import-time settings are the same. Not in the environment: the program's is
    # exactly what it was given.
    sys._torch_ext_warm = {"socket": _SOCKET, "key": req.get("key")}
    kind, target, main = _become(req, torch_filters, import_warnings)
    del req, fds
    code, exc = _run(kind, target, main)
    if exc is not None:
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
        if sys.version_info >= (3, 12):
            sys.last_exc = exc
        sys.excepthook(type(exc), exc, exc.__traceback__)
    del exc
    raise SystemExit(code)  # unwinds to the top: the interpreter's exit, as at the end of any program


_SOCKET = None


class _PidLifeline:
    """A process's pidfd as a lifeline: readable once the process has exited."""

    def __init__(self, pid):
        self.fd = os.pidfd_open(pid)

    def fileno(self):
        return self.fd

    def close(self):
        os.close(self.fd)


def _peer(conn):
    """The pid of the process at the other end of a unix socket connection (None if unknown)."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[0] or None
    except OSError:
        return None


def serve(path, lifeline_spec, modules):
    global _SOCKET
    _SOCKET = path
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".binding")
    listener.listen(64)
    if lifeline_spec.startswith("pid:"):
        try:
            lifeline = _PidLifeline(int(lifeline_spec[4:]))
        except ProcessLookupError:  # the owner is gone already
            os.unlink(path + ".binding")
            os._exit(0)
    else:
        lifeline = socket.socket(fileno=int(lifeline_spec))
    os.rename(path + ".binding", path)  # there once it accepts: clients wait for the name
    torch_filters, import_warnings = _preload(modules)
    # What the preloads made stays out of the children's collections: their exit (a full
    # collection, then module teardown) then takes 0.26 CPU-s instead of 0.47, and fewer pages
    # are copied on write. Those objects live as long as the program in a fresh interpreter too.
    gc.freeze()
    sys.stdout.flush()
    sys.stderr.flush()
    clients = {}  # socket -> pids it started with kill_on_close, not ended yet
    waiters = {}  # pidfd -> (pid, socket waiting for its end)
    done = {}  # pid -> exit code, once reaped

    def reply(sock, value):
        try:
            sock.send(pickle.dumps(value))
        except OSError:
            pass  # the client is gone

    def reap():
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            done[pid] = os.waitstatus_to_exitcode(status)
            for pids in clients.values():
                pids.discard(pid)

    while True:
        readable, _, _ = select.select([listener, lifeline, *clients, *waiters], [], [], 1.0)
        reap()
        for r in readable:
            if r is lifeline:
                for pids in clients.values():
                    for pid in pids:
                        _kill(pid)
                os._exit(0)  # the creator is gone: so is this server
            if r is listener:
                conn, _ = listener.accept()
                clients[conn] = set()
                continue
            if r in waiters:
                pid, sock = waiters.pop(r)
                os.close(r)
                reap()
                reply(sock, done.get(pid, "unknown"))
                continue
            try:
                msg, fds, _, _ = socket.recv_fds(r, 1 << 20, 64)
            except OSError:
                msg, fds = b"", []
            if not msg:  # the client left: a shim's program goes with it (the shim was killed)
                for pid in clients.pop(r):
                    _kill(pid)
                for fd, (_, sock) in list(waiters.items()):
                    if sock is r:
                        del waiters[fd]
                        os.close(fd)
                r.close()
                continue
            req = pickle.loads(msg)
            if req["op"] == "start":
                pid = os.fork()
                if pid == 0:  # raises SystemExit in the end: never returns here
                    _child(req, fds, [listener, lifeline, *clients], torch_filters, import_warnings, _peer(r))
                for f in fds:
                    os.close(f)
                if req.get("kill_on_close"):
                    clients[r].add(pid)
                reply(r, pid)
            elif req["op"] == "status":
                reap()
                reply(r, done.get(req["pid"]) if req["pid"] in done or _ours(req["pid"]) else "unknown")
            elif req["op"] == "wait":
                reap()
                if req["pid"] in done:
                    reply(r, done[req["pid"]])
                elif _ours(req["pid"]):
                    waiters[os.pidfd_open(req["pid"])] = (req["pid"], r)
                else:
                    reply(r, "unknown")
            elif req["op"] == "ping":
                reply(r, os.getpid())


def _ours(pid):
    """Whether ``pid`` is a running child of this process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid()
    except (OSError, ValueError, IndexError):
        return False


def shim_main(path, key, python, import_time):
    """A warm ``python`` (the file ``_warm.shim`` writes runs this): started as ``python ARGS`` by a
    launcher (torchrun's worker, through PYTHON_EXEC), it has the zygote at ``path`` fork ARGS with
    its own environment, working directory and descriptors, passes the signals a launcher sends on
    to that program, and ends as it ended: its exit status, or the same signal. Where ARGS is not a
    plain program or the import-time settings differ from the zygote's, it becomes a fresh
    interpreter (exec)."""
    args = sys.argv[1:]
    env = dict(os.environ)
    if env.get("PYTHON_EXEC") == sys.argv[0]:
        del env["PYTHON_EXEC"]  # the launcher's setting for its own use: a fresh worker does not see it

    def fresh():
        os.execve(python, [python, *args], env)

    settings = tuple(sorted((k, v) for k, v in env.items() if k.startswith(import_time)))
    if settings != tuple(key[0]) or not plain(args, env):
        fresh()
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.connect(path)
    except OSError:
        fresh()  # the zygote has ended (its creator did): start as any interpreter
    fds = [int(n) for n in os.listdir("/proc/self/fd")]
    fds = sorted(fd for fd in fds if fd != sock.fileno() and _open(fd) and (fd <= 2 or os.get_inheritable(fd)))
    request = {"op": "start", "args": args, "env": env, "cwd": os.getcwd(), "fds": fds, "kill_on_close": True,
               "key": key}
    socket.send_fds(sock, [pickle.dumps(request)], fds)
    pid = pickle.loads(sock.recv(1 << 16))
    for fd in fds:
        if fd > 2:
            os.close(fd)

    def pass_on(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, pass_on)
    sock.send(pickle.dumps({"op": "wait", "pid": pid}))
    code = pickle.loads(sock.recv(1 << 16))
    code = code if isinstance(code, int) else 1
    if code < 0:  # die of the same signal, as the launcher expects of its worker
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


def _open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], sys.argv[3:])
