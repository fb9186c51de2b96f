"""A warm interpreter: imports torch once, then forks ``python ARGS`` programs on request.

Run as a script (``python _zygote.py FD MODULE...``), never imported as part of torch_ext: a
preloaded torch_ext would have run its import-time set-up with this process's settings. The client
is :mod:`torch_ext.testing._warm`; the protocol is one pickled request per SOCK_SEQPACKET message on
the socket ``FD``, with the new program's standard streams as SCM_RIGHTS:

  {"op": "start", "args": [...], "env": {...}, "cwd": ...} + fds 0, 1, 2 -> the program's pid
  {"op": "status", "pid": PID}   -> its exit code (a signal: -N), or None while it runs

The zygote is single-threaded and installs no signal handler, so a child inherits nothing of it but
what a fresh interpreter that imported torch would have. The child sets itself up as ``python ARGS``
would (standard streams, working directory, environment, ``sys.argv``, ``sys.path``, a new
``__main__``, warning filters) and runs the program at the top of its stack: when the program ends,
this file's frames unwind with ``SystemExit`` and the interpreter exits as for any program: the
atexit hooks (torch_ext's among them), non-daemon threads joined, finalisation, the exit status.
An exception the program does not catch is printed and kept in ``sys.last_value`` as the
interpreter does, then the status is 1.
"""
import gc
import io
import os
import pickle
import socket
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


def _stream(fd, mode, encoding, errors, line_buffering, unbuffered):
    if mode == "r":
        return io.TextIOWrapper(io.open(fd, "rb", closefd=False), encoding=encoding, errors=errors)
    raw = io.open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)
    return io.TextIOWrapper(raw, encoding=encoding, errors=errors, newline="\n", line_buffering=line_buffering,
                            write_through=unbuffered)


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


def _child(req, fds, sock, torch_filters, import_warnings):
    sock.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    if req.get("new_session"):
        os.setsid()
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


def serve(fd, modules):
    torch_filters, import_warnings = _preload(modules)
    # What the preloads made stays out of the children's collections: their exit (a full
    # collection, then module teardown) then takes 0.26 CPU-s instead of 0.47, and fewer pages
    # are copied on write. Those objects live as long as the program in a fresh interpreter too.
    gc.freeze()
    sock = socket.socket(fileno=fd)
    sys.stdout.flush()
    sys.stderr.flush()
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        except ConnectionResetError:
            msg, fds = b"", []
        if not msg:
            os._exit(0)  # the client is gone; its programs run on, as orphans do
        req = pickle.loads(msg)
        if req["op"] == "start":
            pid = os.fork()
            if pid == 0:
                _child(req, fds, sock, torch_filters, import_warnings)  # raises SystemExit: never returns
            for f in fds:
                os.close(f)
            sock.send(pickle.dumps(pid))
        elif req["op"] == "status":
            try:
                got, status = os.waitpid(req["pid"], os.WNOHANG)
                reply = os.waitstatus_to_exitcode(status) if got else None
            except ChildProcessError:
                reply = "unknown"
            sock.send(pickle.dumps(reply))


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2:])
