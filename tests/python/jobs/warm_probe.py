"""What a program can see of how it was started; test_warm.py runs it fresh and warm and compares.

Prints one JSON line, then ends as its first argument says: ``ok`` (falls off the end), ``exit N``
(sys.exit(N)), ``raise`` (an uncaught ValueError), ``kill`` (SIGKILL itself). A non-daemon thread
and an atexit hook write their own lines at the end, after the main thread is done.
"""
import atexit
import json
import os
import signal
import sys
import threading
import warnings

import __main__


def _at_exit() -> None:
    last = getattr(sys, "last_value", None)
    print(f"atexit: last_value={type(last).__name__ if last is not None else None}", flush=True)


atexit.register(_at_exit)

with warnings.catch_warnings(record=True) as seen:
    warnings.warn("a user warning")  # shown unless PYTHONWARNINGS=ignore
    warnings.warn("deprecated", DeprecationWarning)  # shown in __main__ by default
facts = {
    "argv": sys.argv,
    "path0": sys.path[0],
    "pythonpath": [p for p in sys.path if p.startswith("/probe")],
    "main_file": __main__.__file__,
    "main_name": __name__,
    "main_spec": repr(__main__.__spec__),
    "code_file": sys._getframe().f_code.co_filename,
    "cwd": os.getcwd(),
    "env": os.environ.get("PROBE"),
    "warnoptions": sys.warnoptions,
    "warnings_shown": [str(w.message) for w in seen],
    "stdout_line_buffered": sys.stdout.line_buffering,
    "stderr_line_buffered": sys.stderr.line_buffering,
    "stdout_write_through": sys.stdout.write_through,
    "torch_in_modules": "torch" in sys.modules,
    "torch_ext_in_modules": "torch_ext" in sys.modules,
}
print(json.dumps(facts), flush=True)
sys.stderr.write("to stderr\n")
threading.Thread(target=lambda: (threading.Event().wait(0.3), print("thread: done", flush=True))).start()
how = sys.argv[1] if len(sys.argv) > 1 else "ok"
if how == "exit":
    sys.exit(int(sys.argv[2]))
if how == "raise":
    raise ValueError("uncaught in the probe")
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
