"""A job that looks stuck, looked at while it runs: `torch-ext-diagnose live`.

    python examples/bugs/looks_stuck.py

Four ranks; no deadline has passed, nothing has failed, the job just does not
move. Rank 1 validates alone in Python; rank 2 sits in a C call that holds the
GIL (it cannot run any Python: a py-spy-free debugger would need it); ranks 0
and 3 wait in an all_reduce for them. Meanwhile, from outside the job (here the
launcher, as another terminal would), with nothing set up beforehand:

    torch-ext-diagnose live 127.0.0.1:PORT      (the job's MASTER_ADDR:MASTER_PORT)

prints each rank's state and main-thread stack and who everyone waits for,
answered by the ranks' watchdog threads, not by their Python. Then the two
ranks are let go and the job finishes normally: looking changed nothing.
"""
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from _launch import launch


def _store() -> dist.TCPStore:
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=timedelta(seconds=60))


def validate(store: dist.TCPStore) -> None:
    # A long rank-local validation; here it lasts until the look is done. One
    # line, so the stack a look samples is the same at every instant.
    store.wait(["example/release"], timedelta(minutes=10))


def native_call() -> None:
    # A C call that keeps the GIL (ctypes.PyDLL) until a signal comes: like a
    # long native op from an extension that never releases the GIL.
    signal.signal(signal.SIGUSR1, lambda *_: None)
    ctypes.PyDLL(ctypes.util.find_library("c")).pause()


def train(rank: int, world: int) -> None:
    store = _store()
    dist.all_reduce(torch.ones(4))
    store.set(f"example/ready/{rank}", str(os.getpid()))
    if rank == 1:
        validate(store)
    elif rank == 2:
        native_call()
    t = torch.full((4,), float(rank))
    dist.all_reduce(t)  # ranks 0 and 3 wait here for ranks 1 and 2
    if rank == 0:
        print(f"[rank0] all_reduce gave {t.tolist()}: the job went on as if nobody had looked", flush=True)
    dist.destroy_process_group()


def look(port: int) -> None:
    """What a user runs in another terminal once the job seems stuck."""
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    store.wait([f"example/ready/{r}" for r in range(4)])
    cmd = ["torch-ext-diagnose", "live", f"127.0.0.1:{port}"]
    out = subprocess.run([sys.executable, "-m", "torch_ext.diagnose", *cmd[1:]], capture_output=True, text=True,
                         timeout=120)
    sys.stdout.write(f"$ {' '.join(cmd)}\n{out.stdout}{out.stderr}\n")
    sys.stdout.flush()
    store.set("example/release", "1")
    os.kill(int(store.get("example/ready/2")), signal.SIGUSR1)


if __name__ == "__main__":
    launch(train, 4, while_running=look)
