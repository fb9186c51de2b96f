"""Runs a replay written by ``torch-ext-diagnose DUMP_DIR --repro OUT.py`` (``torch_ext/diagnose/repro.py``).

A replay is a job's collectives without its code, data or model: for each rank
the operations it issued (op, group, shapes, dtypes, reduce op, root or peer)
in the order it issued them, each at the call site the job's dumps named, and
what the rank did after its last one (stopped issuing, or was gone). This
module launches one process per rank on this machine (CPU only: gloo, or
``nccl_sim`` for a job that ran on NCCL), lets every rank end by itself, reads
the dumps the replay wrote and compares their verdict with the job's::

    from torch_ext.testing import replay
    outcome = replay.run(JOB, RANKS)          # JOB, RANKS: what --repro wrote
    assert outcome.same, outcome.describe()

Each rank runs as ``python -m torch_ext.testing.replay RANK PLAN.json``, so no
frame of the generated file is on its stack: the call sites the guard records
are the job's own, rebuilt as code objects that carry the original file name,
function and line (and, for a collective issued through a framework such as
Lightning, the framework's frame outside it). The ranks are forked from a warm
interpreter that has imported torch once (``_warm.py``): a rank starts in about
0.1 s instead of 1-2 CPU-s of torch's import.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from datetime import timedelta
from typing import Any, Callable

__all__ = ["Outcome", "run", "main"]

_HELD = "torch_ext_replay/held/"
_RELEASE = "torch_ext_replay/release"
_THERE = "torch_ext_replay/there/"
_STORE_PORT = "torch_ext_replay/store_port"  # where rank 0's process serves the job's store (store "rank0")
# How a job's rank ended when it was not there at the end: killed or exited ("gone"), or stopped answering
# ("frozen", SIGSTOP). Such a rank leaves once the others reach their stuck collectives.
_ABSENT_ENDS = ("gone", "frozen")
# A rank replayed as gone waits at most this long for the others to reach their stuck collectives.
_GONE_WAIT_S = 30.0
# After the last rank that does not stop ends, the ranks that stand in for a
# rank that never arrived are released; they end within this many seconds.
_RELEASE_S = 10.0


@dataclasses.dataclass
class Outcome:
    """What a replay ended in, and whether it is the job's verdict."""

    same: bool
    differences: list[str]
    verdicts: list[dict[str, Any]]  # the replay's, as torch_ext.diagnose reports them
    exit_codes: dict[int, int | None]  # None: still running at the deadline (killed)
    output: str  # every rank's output, interleaved as it came
    seconds: float
    dump_dir: str

    def describe(self) -> str:
        head = ("the replay ended in the job's verdict" if self.same
                else "the replay did NOT end in the job's verdict:\n  " + "\n  ".join(self.differences))
        texts = "\n".join(v["text"] for v in self.verdicts if v.get("kind") != "none")
        return f"{head}\nreplay's verdict:\n{texts or '(none)'}\n--- output of the replayed ranks ---\n{self.output}"


def _store(world: int):
    """The replay's control store, in this process, on a free port; also the ranks' rendezvous store unless the
    job's rank 0 hosted that (as torchrun's agent hosts it)."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False)


def _default_backend(job: dict[str, Any]) -> str:
    return job.get("backend", "gloo")


def _deadline_s(job: dict[str, Any]) -> float:
    s = job.get("settings", {})
    abort = float(s.get("TORCH_EXT_ABORT_AFTER", 30) or 30)
    return abort + 90.0


def run(job: dict[str, Any], ranks: dict[int, dict[str, Any]], *, backend: str | None = None,
        timeout: float | None = None, keep: str | os.PathLike[str] | None = None,
        echo: Callable[[str], None] | None = None) -> Outcome:
    """Replays ``ranks`` as the job ``job`` describes; returns once every rank has ended (or the deadline).

    ``backend``: "gloo" or "nccl_sim" (default: the job's); ``keep``: a folder for
    the replay's plan and dumps (default: a temporary one, removed); ``echo``:
    called with each line the ranks print, as it comes.
    """
    from torch_ext.diagnose import analyze_dir
    from torch_ext.diagnose.repro import compare

    backend = backend or _default_backend(job)
    if backend not in ("gloo", "nccl_sim"):
        raise ValueError(f"replay backend {backend!r}: expected 'gloo' or 'nccl_sim'")
    world = int(job["world"])
    timeout = timeout if timeout is not None else _deadline_s(job)
    tmp = None
    if keep is None:
        tmp = tempfile.TemporaryDirectory(prefix="torch_ext_replay_")
        keep = tmp.name
    keep = os.path.abspath(os.fspath(keep))
    dumps = os.path.join(keep, "dumps")
    os.makedirs(dumps, exist_ok=True)
    plan_path = os.path.join(keep, "plan.json")
    server = _store(world)
    with open(plan_path, "w", encoding="utf-8") as f:
        json.dump({"job": job, "ranks": {str(r): v for r, v in ranks.items()}, "backend": backend,
                   "control_port": server.port}, f)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TORCH_EXT_") and k != "TORCHELASTIC_USE_AGENT_STORE"}
    env.update(job.get("settings", {}))
    env.update(TORCH_EXT_DUMP_DIR=dumps, TORCH_EXT_INNER=f"cpu:{backend}", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(server.port), WORLD_SIZE=str(world), PYTHONUNBUFFERED="1")
    if job.get("store", "launcher") == "launcher":
        env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    lines: list[str] = []
    lock = threading.Lock()

    def pump(stream) -> None:
        for line in iter(stream.readline, ""):
            with lock:
                lines.append(line)
            if echo is not None:
                echo(line.rstrip("\n"))

    from torch_ext.testing import _warm

    _warm.start(env)  # outside the deadline: the warm interpreter's first start imports torch
    start = time.monotonic()
    procs: dict[int, Any] = {}  # subprocess.Popen's interface (_warm.WarmProcess)
    pumps = []
    try:
        for r in range(world):
            read, write = os.pipe()
            try:
                procs[r] = _warm.popen(["-m", "torch_ext.testing.replay", str(r), plan_path],
                                       env={**env, "RANK": str(r)}, stdout=write, stderr=subprocess.STDOUT, cwd=keep)
            finally:
                os.close(write)
            pumps.append(threading.Thread(target=pump, args=(os.fdopen(read, errors="replace"),), daemon=True))
            pumps[-1].start()
        frozen = {r for r, v in ranks.items() if v.get("end") == "frozen"}
        _wait_for_ranks(server, procs, start + timeout, frozen)
        for r in frozen:  # the job's frozen rank stays so until killed: killed once every other rank has ended
            if all(p.poll() is not None for q, p in procs.items() if q not in frozen):
                procs[r].kill()
                procs[r].wait()
    finally:
        killed = [r for r, p in procs.items() if p.poll() is None]
        for r in killed:
            procs[r].kill()
        for p in procs.values():
            p.wait()
        for t in pumps:
            t.join(timeout=5)
    codes = {r: (None if r in killed else p.returncode) for r, p in procs.items()}
    analysis = analyze_dir(dumps)
    verdicts = analysis.verdicts
    differences = compare(job.get("expected", []), verdicts, job.get("skipped"))
    if killed:
        differences.append(f"rank(s) {', '.join(map(str, killed))} still ran at the replay's deadline ({timeout:g} s) "
                           "and were killed")
    outcome = Outcome(not differences, differences, verdicts, codes, "".join(lines), time.monotonic() - start,
                      dumps if tmp is None else "")
    if tmp is not None:
        tmp.cleanup()
    return outcome


def _wait_for_ranks(server, procs: dict[int, Any], deadline: float, frozen: set[int]) -> None:
    """Waits until every rank but the ``frozen`` ones has ended, or stopped where its job's rank stopped; then
    releases those."""
    released = False
    release_by = None
    while time.monotonic() < deadline:
        alive = [r for r, p in procs.items() if p.poll() is None and r not in frozen]
        if not alive:
            return
        if not released:
            held = [r for r in alive if server.check([f"{_HELD}{r}"])]
            if len(held) == len(alive):
                server.set(_RELEASE, "1")
                released = True
                release_by = time.monotonic() + _RELEASE_S
        elif time.monotonic() > release_by:
            return
        time.sleep(0.05)  # polling child processes; nothing to wait on jointly


# --- one rank ------------------------------------------------------------------

_SITE_FUNCTIONS: dict[tuple, Callable[[Callable[[], Any]], Any]] = {}


def _frame_function(filename: str, function: str, line: int) -> Callable[[Callable[[], Any]], Any]:
    """A function whose frame reads as ``function`` at ``filename:line``; it calls its argument there."""
    key = (filename, function, line)
    found = _SITE_FUNCTIONS.get(key)
    if found is not None:
        return found
    line = max(1, int(line))
    if line >= 2:
        source = "\n" * (line - 2) + "def _at(call):\n    return call()\n"
    else:
        source = "def _at(call): return call()\n"
    module = compile(source, filename, "exec")
    code = next(c for c in module.co_consts if isinstance(c, types.CodeType))
    name = function.rsplit(".", 1)[-1] or "<unknown>"
    code = code.replace(co_name=name, **({"co_qualname": function} if hasattr(code, "co_qualname") else {}))
    fn = types.FunctionType(code, {})
    _SITE_FUNCTIONS[key] = fn
    return fn


def _at_site(frames: list[dict[str, Any]], call: Callable[[], Any],
             callers: list[dict[str, Any]] | None = None) -> Any:
    """Calls ``call`` under the recorded frames (innermost first: the user's frame, then the framework's), and
    those under the user frames that called them (``callers``, innermost first: the call path)."""
    if not frames:
        return call()
    user = frames[0]
    inner = call
    if len(frames) > 1:
        via = frames[1]
        via_fn = _frame_function(via["filename"], via["name"], via["line"])
        inner = lambda: via_fn(call)  # noqa: E731 - torch_ext's own frame: never a call site
    user_fn = _frame_function(user["filename"], user["name"], user["line"])
    site = lambda: user_fn(inner)  # noqa: E731
    for c in callers or []:
        site = (lambda fn, below: lambda: fn(below))(_frame_function(c["filename"], c["name"], c["line"]), site)
    return site()


def _issue(op: dict[str, Any], group, granks: list[int], me: int):
    """Issues ``op`` with ``async_op=True``; returns its work (waited where the job waited)."""
    import torch
    import torch.distributed as dist

    kind = op["op"]
    dtypes = [getattr(torch, d) for d in op.get("dtypes", [])] or [torch.float32]
    sizes = op.get("sizes") or [[1]]
    ts = [torch.zeros(s, dtype=dtypes[min(i, len(dtypes) - 1)]) for i, s in enumerate(sizes)]
    t = ts[0]
    n = len(granks)
    red = getattr(dist.ReduceOp, op.get("reduce_op") or "SUM", dist.ReduceOp.SUM)
    peer = op.get("peer", -1)
    other = granks[peer] if isinstance(peer, int) and 0 <= peer < n else None
    tag = int(op.get("tag", 0))
    kw = {"group": group, "async_op": True}

    def gathered(x):  # the larger tensor of all_gather_into_tensor / reduce_scatter_tensor
        return torch.zeros([x.shape[0] * n if x.dim() else n, *x.shape[1:]], dtype=x.dtype)

    if kind == "all_reduce":
        return dist.all_reduce(t, op=red, **kw)
    if kind == "broadcast":
        return dist.broadcast(t, src=other, **kw)
    if kind == "reduce":
        return dist.reduce(t, dst=other, op=red, **kw)
    if kind == "all_gather":
        return dist.all_gather([torch.zeros_like(t) for _ in range(n)], t, **kw)
    if kind == "all_gather_into_tensor":
        # torch 2.13 renamed it (the old name warns); the same backend op either way.
        return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(gathered(t), t, **kw)
    if kind == "gather":
        return dist.gather(t, [torch.zeros_like(t) for _ in range(n)] if me == peer else None, dst=other, **kw)
    if kind == "scatter":
        return dist.scatter(t, [torch.zeros_like(t) for _ in range(n)] if me == peer else None, src=other, **kw)
    if kind == "reduce_scatter":
        return dist.reduce_scatter(t, [torch.zeros_like(t) for _ in range(n)], op=red, **kw)
    if kind == "reduce_scatter_tensor":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return scatter(t, gathered(t), op=red, **kw)
    if kind == "all_to_all":
        return dist.all_to_all([torch.zeros_like(x) for x in ts], ts, **kw)
    if kind == "all_to_all_single":
        send, recv = op.get("send_splits"), op.get("recv_splits")
        row = list(sizes[0][1:])
        inp = torch.zeros([sum(send) if send else n, *row], dtype=t.dtype)
        out = torch.zeros([sum(recv) if recv else n, *row], dtype=t.dtype)
        return dist.all_to_all_single(out, inp, recv, send, **kw)
    if kind == "barrier":
        return dist.barrier(**kw)
    if kind == "send":
        return dist.isend(t, dst=other, group=group, tag=tag)
    if kind in ("recv", "recv_any_source"):
        return dist.irecv(t, src=other if kind == "recv" else None, group=group, tag=tag)
    raise NotImplementedError(f"replay: {kind} is not replayed yet")


def _issue_at_site(op: dict[str, Any], group, granks: list[int], me: int):
    import torch_ext

    issue = lambda: _issue(op, group, granks, me)  # noqa: E731
    lab = op.get("label")
    if not lab:
        return _at_site(op.get("frames", []), issue, op.get("callers"))
    origin = None
    if lab.get("origin"):
        o = lab["origin"][0]
        origin = (_frame_function(o["filename"], o["name"], o["line"]).__code__, int(o["line"]))
    with torch_ext.label(lab["text"], origin=origin, hint=lab.get("hint", ""), **lab.get("fields", {})):
        return _at_site(op.get("frames", []), issue, op.get("callers"))


def _rank_main(rank: int, plan_path: str) -> int:
    with open(plan_path, encoding="utf-8") as f:
        plan = json.load(f)
    job, mine = plan["job"], plan["ranks"][str(rank)]
    import torch.distributed as dist

    if plan["backend"] == "nccl_sim":
        from torch_ext.testing import nccl_sim
    world = int(job["world"])
    host = os.environ["MASTER_ADDR"]
    store = dist.TCPStore(host, int(plan["control_port"]), is_master=False)  # the launcher's: this replay's keys
    rendezvous = store
    if job.get("store") == "rank0":
        # The job's store lived in rank 0's process (plain env://): so does this one, and goes down with it.
        if rank == 0:
            rendezvous = dist.TCPStore(host, 0, world, is_master=True, wait_for_workers=False)
            store.set(_STORE_PORT, str(rendezvous.port))
        else:
            rendezvous = dist.TCPStore(host, int(store.get(_STORE_PORT)), is_master=False)
        os.environ["MASTER_PORT"] = str(rendezvous.port)  # how the guard tells who hosts it
    dist.init_process_group("guard", store=rendezvous, rank=rank, world_size=world)
    groups: dict[str, tuple[Any, list[int]]] = {"0": (None, list(range(job["world"])))}  # the default group
    for g in job.get("groups", []):
        pg = dist.new_group(g["ranks"], backend="guard", group_desc=g.get("desc") or None)
        if rank in g["ranks"]:
            groups[g["name"]] = (pg, list(g["ranks"]))
    told = []

    def there() -> None:
        """This rank has issued what its job's rank issued before waiting where it never got past."""
        if not told:
            told.append(True)
            store.set(f"{_THERE}{rank}", "1")

    try:
        # Every operation is issued async; each is waited where the job's rank waited for it: before the first
        # operation it created after that one had completed (a blocking call: right away), the rest at the end.
        works: dict[int, Any] = {}
        for j, op in enumerate(mine["ops"]):
            for i in op.get("wait", []):
                if mine["ops"][i].get("stuck"):
                    there()
                works.pop(i).wait()
            pg, granks = groups[op["group"]]
            works[j] = _issue_at_site(op, pg, granks, granks.index(rank))
        there()
        for i in sorted(works):
            works.pop(i).wait()
        if plan["backend"] == "nccl_sim":
            for pg, _ in groups.values():
                nccl_sim.synchronize(pg)
    except Exception as e:  # noqa: BLE001 - the verdict, as the job's rank got it
        there()
        sys.stdout.write(f"[rank{rank}] raised {type(e).__name__}:\n{e}\n")
        sys.stdout.flush()
        return 1
    if mine.get("end") in _ABSENT_ENDS:
        # Gone (or frozen) once the others have issued what they had when the job's rank went: their stuck
        # collectives.
        others = [f"{_THERE}{r}" for r in range(int(job["world"])) if r != rank
                  and plan["ranks"][str(r)].get("end") not in _ABSENT_ENDS]
        try:
            store.wait(others, timedelta(seconds=_GONE_WAIT_S))
        except Exception:  # noqa: BLE001 - a rank that never gets there (raised early): go all the same
            pass
        frozen = mine["end"] == "frozen"
        sys.stdout.write(f"[rank{rank}] replay: this rank is {'frozen (SIGSTOP)' if frozen else 'gone (killed)'} "
                         "here, as in the job\n")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGSTOP if frozen else signal.SIGKILL)
    sys.stdout.write(f"[rank{rank}] replay: this rank issues nothing more, as in the job\n")
    sys.stdout.flush()
    store.set(f"{_HELD}{rank}", "1")
    try:
        store.wait([_RELEASE])
    except Exception:  # noqa: BLE001 - the launcher went away: end all the same
        os._exit(0)
    code = 0
    then = mine.get("then")
    if then:  # back from where the job's rank was: it issues what the others waited in
        try:
            pg, granks = groups[then["group"]]
            _issue_at_site(then, pg, granks, granks.index(rank)).wait()
        except Exception as e:  # noqa: BLE001 - the error the job's rank got there
            sys.stdout.write(f"[rank{rank}] raised {type(e).__name__}:\n{e}\n")
            code = 1
    sys.stdout.flush()
    os._exit(code)  # no clean end on record: the dumps stay as the verdict left them


# --- the generated file's entry point ------------------------------------------


def main(job: dict[str, Any], ranks: dict[int, dict[str, Any]], argv: list[str] | None = None) -> int:
    """``python OUT.py [--backend gloo|nccl_sim] [--keep DIR] [--timeout S]``: replays and says whether it matched."""
    where = job.get("source", {}).get("dump_dir", "?")
    ap = argparse.ArgumentParser(description=f"Replays the collectives of the job in {where} on this machine's CPU "
                                 "and checks that it ends in the job's verdict.")
    ap.add_argument("--backend", choices=["gloo", "nccl_sim"], default=None,
                    help=f"inner backend of the replay (default: {_default_backend(job)}, as the job ran)")
    ap.add_argument("--keep", metavar="DIR",
                    help="keep the replay's dumps in DIR (for python -m torch_ext.diagnose DIR)")
    ap.add_argument("--timeout", type=float, default=None, metavar="S", help="end the replay after S seconds")
    args = ap.parse_args(argv)
    backend = args.backend or _default_backend(job)
    settings = " ".join(f"{k.removeprefix('TORCH_EXT_').lower()}={v}" for k, v in job.get("settings", {}).items())
    print(f"torch_ext replay: {job['world']} ranks on this machine's CPU over {backend}; the job's guard settings: "
          f"{settings}", flush=True)
    outcome = run(job, ranks, backend=backend, timeout=args.timeout, keep=args.keep,
                  echo=lambda line: print(line, flush=True))
    print("")
    for r, code in sorted(outcome.exit_codes.items()):
        print(f"rank {r} exit code: {code if code is not None else 'killed at the deadline'}")
    if outcome.same:
        print(f"\ntorch_ext replay: the same verdict as the job ({outcome.seconds:.1f} s):")
    else:
        print("\ntorch_ext replay: NOT the job's verdict:\n  " + "\n  ".join(outcome.differences))
        print("the replay's verdict:")
    for v in outcome.verdicts:
        if v.get("kind") != "none":
            print(v["text"])
    if args.keep:
        print(f"\nthe replay's dumps: {outcome.dump_dir} (python -m torch_ext.diagnose {outcome.dump_dir})")
    return 0 if outcome.same else 1


if __name__ == "__main__":
    sys.exit(_rank_main(int(sys.argv[1]), sys.argv[2]))
