"""Load the guard's watchdog puts on the one TCPStore of a job, at 1k to 16k ranks.

One real TCPStore server (its own process, torch's libuv server as in
init_process_group) and W simulated ranks: a few client processes, each
issuing, for its share of the ranks, exactly the guard's per-tick store
operations with the real key layout of a group "default_pg":

  set       guard/default_pg/st/<r>              this rank's status record (v2 run ...)
  multi_get guard/default_pg/st/<r+1>, st/<r-1>  its ring neighbours (the async check)
  add       guard/default_pg/alerts, 0           is an incident open?

every tick of each rank, and for rank 0, the straggler analyst, every
`straggler_look_every(W)` ticks (8 above 64 ranks):

  multi_get guard/default_pg/st/0 .. st/<W-1>     every rank's status, wait windows included

Each status record carries the rank's wait windows (12 of them once the job has
run 2,048 collectives: about 400 bytes). The tick is torch_ext's: `interval` (0.2 s) at small
worlds, stretched at large ones so that the job stays within the store budget
(TORCH_EXT_STORE_BUDGET, ops/s for the whole job; 0: no budget, the load
before the budget existed). Each W runs twice, without and with the budget.

Printed per W: the tick, the offered and achieved store ops/s, the server's
CPU, the p50/p99 latency of a plain `get` issued every 10 ms by a bystander
client (what NCCL set-up and the user's own barriers see), and the detection
bounds that follow from the tick (see docs/architecture.md, "Store budget"):
an async mismatch is seen by a ring neighbour within 2 ticks of the later of
the two ranks publishing; a hang report starts at warn_after, whatever W,
and its exchange needs about 3 ticks.

    python benchmarks/store_load.py                     # W = 1024, 4096, 16384
    python benchmarks/store_load.py --worlds 1024 --seconds 5 --clients 2 --threads 8
    python benchmarks/store_load.py --live 64 1024      # + one live report of 64, then 1024 ranks

A live report (`torch-ext-diagnose live`) adds no operation to the tick: its
request rides on the `alerts` counter every rank already reads. With --live N,
halfway through each run (with the budget) the real asker of torch_ext
(torch_ext.diagnose.live, the CLI's code) asks N ranks; each simulated rank
asked answers at its next tick as the watchdog does (read the request: check +
get, then set its snapshot of 55 KB + 18 bytes per rank of the job, a real
snapshot's size with a full 64-entry ledger window). Printed per N: how long
until every answer was collected, the extra store ops and bytes, and the
bystander's get latency while it ran.

On a 2-core machine the simulated clients share the cores with the server, so
the achieved rate is a floor of what the server can take; the bystander's
latency is the figure that matters.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from datetime import timedelta

OPS_PER_TICK = 3  # set + multi_get + add, per rank (torch_ext's Watchdog::exchange, kStoreOpsPerExchange)
INTERVAL_S = 0.2  # torch_ext's default interval (TORCH_EXT_INTERVAL)
DEFAULT_BUDGET = 20000  # ops/s, torch_ext's default (TORCH_EXT_STORE_BUDGET)


def tick_for(world: int, budget: float, interval: float = INTERVAL_S) -> float:
    """The watchdog's exchange period at `world` ranks under `budget` ops/s (0: none): torch_ext's own rule."""
    from torch_ext import _C

    return _C.exchange_interval(interval, budget, world)


def _server(port_q: mp.Queue, stop: mp.Event) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    port_q.put((store.port, os.getpid()))
    stop.wait()


def _record(rank: int, seq: int) -> bytes:
    # The size of a real status record (StatusRecord::encode): phase, time, seqs, hash, then the
    # rank's wait windows (WaitWindows: 3 closed windows at each of 4 levels, RankWaits::encode).
    windows = " ".join(f"{level}:{seq // 4 ** (level + 1) + 1000 + i}:{31234 + i}:{208765 + i}:"
                       f"{0x9e3779b97f4a7c15 + level:x}:"
                       f"{21000 + i}:{4 ** (level + 1)}" for level in range(4) for i in range(3))
    return (f"v2 run {time.time_ns()} {seq} {seq} {rank * 2654435761 % 2**64:016x} 0 w node{rank // 8:05d} "
            f"{windows}").encode()


def snapshot_bytes(world: int) -> int:
    """A live snapshot's size: ~55 KB (a 64-entry ledger window, call sites, the stack) + 3 rank lists of the group."""
    return 55_000 + 18 * world


def _look_every(world: int) -> int:
    from torch_ext import _C

    return _C.straggler_look_every(world)


def _asks(spec: str, rank: int) -> bool:
    if not spec:
        return True
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        if int(lo) <= rank <= int(hi or lo):
            return True
    return False


def _client(port: int, ranks: list[int], world: int, tick: float, seconds: float, threads: int, out: mp.Queue) -> None:
    # Each thread has its own connection (TCPStore calls release the GIL), so a
    # process keeps several requests in flight, as many ranks would.
    import threading

    import torch.distributed as dist

    prefix = "guard/default_pg/"
    rates: list[float] = []

    def loop(mine: list[int]) -> None:
        store = dist.TCPStore("127.0.0.1", port, 1, is_master=False, timeout=timedelta(seconds=60))
        for r in mine:
            store.set(f"{prefix}st/{r}", _record(r, 0))
        store.add(prefix + "alerts", 0)
        ops = 0
        start = time.monotonic()
        next_tick = start
        seq = 0
        seen = {r: 0 for r in mine}  # alerts read so far, per simulated rank (IncidentProtocol::alertsSeen_)
        payload = b"x" * snapshot_bytes(world)
        look_every = _look_every(world)
        while time.monotonic() - start < seconds:
            seq += 1
            for r in mine:
                store.set(f"{prefix}st/{r}", _record(r, seq))
                store.multi_get([f"{prefix}st/{(r + 1) % world}", f"{prefix}st/{(r - 1) % world}"])
                n = store.add(prefix + "alerts", 0)
                ops += OPS_PER_TICK
                if r == 0 and seq % look_every == 0:  # the straggler analyst reads every status
                    t0 = time.monotonic()
                    values = store.multi_get([f"{prefix}st/{q}" for q in range(world)])
                    looks.append((time.monotonic() - t0, sum(len(v) for v in values)))
                    ops += world / look_every  # counted per key, as the budget counts it
                while seen[r] < n:  # a new alert: a live request here (the watchdog answers it at once)
                    key = f"{prefix}alert/{seen[r] + 1}"
                    if not store.check([key]):
                        break  # raised but not written yet: next tick
                    seen[r] += 1
                    token, _, spec = store.get(key).decode().split("\n", 2)
                    ops += 2
                    if _asks(spec, r):
                        store.set(f"{prefix}snap/{token}/{r}", payload)
                        ops += 1
            next_tick += tick
            delay = next_tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # pacing to the tick, not synchronisation
            else:
                next_tick = time.monotonic()  # behind: the store (or this client) cannot keep up
        rates.append(ops / (time.monotonic() - start))

    looks: list[tuple[float, int]] = []  # the analyst's reads: (seconds, bytes)
    workers = [threading.Thread(target=loop, args=(ranks[i::threads],)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if looks:
        took = sorted(t for t, _ in looks)
        print(f"  W={world}: straggler analyst read {len(looks)} times, {looks[-1][1] / 1e6:.2f} MB each, "
              f"p50 {took[len(took) // 2] * 1e3:.1f} ms, max {took[-1] * 1e3:.1f} ms", flush=True)
    out.put(sum(rates))


def _bystander(port: int, seconds: float, out: mp.Queue) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 1, is_master=False, timeout=timedelta(seconds=60))
    store.set("user/key", b"x")
    lat = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        at, t0 = time.monotonic(), time.perf_counter()
        store.get("user/key")
        lat.append((at, time.perf_counter() - t0))
        time.sleep(0.01)
    out.put(lat)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _asker(port: int, world: int, live: list[int], delay: float, out: mp.Queue) -> None:
    """Halfway through: torch_ext's own asker (the CLI's code), once per N in `live`, N ranks each."""
    import json

    import torch.distributed as dist

    from torch_ext.diagnose import live as L

    store = dist.TCPStore("127.0.0.1", port, 1, is_master=False, timeout=timedelta(seconds=60))
    store.set(L.DIRECTORY_KEY, json.dumps({"version": 1, "prefix": "guard/default_pg/", "size": world,
                                           "group": "0", "exchange_s": tick_for(world, DEFAULT_BUDGET)}))
    time.sleep(delay)  # pacing: the first request halfway through the run, not synchronisation
    results = []
    for n in live:
        c = L._Collect("127.0.0.1", port, None, list(range(min(n, world))), all_ranks=True)
        t0 = time.monotonic()
        c.run()
        results.append({"n": min(n, world), "collect_s": time.monotonic() - t0, "answered": len(c.snaps),
                        "deadline_s": c.timeout_s, "error": repr(c.error) if c.error else "",
                        "t0": t0, "t1": time.monotonic()})
    out.put(results)


def run(world: int, budget: float, clients: int, threads: int, seconds: float, live: list[int] | None = None) -> dict:
    ctx = mp.get_context("spawn")
    port_q, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_server, args=(port_q, stop))
    server.start()
    port, server_pid = port_q.get(timeout=60)
    tick = tick_for(world, budget)
    out, by_out = ctx.Queue(), ctx.Queue()
    shares = [list(range(world))[i::clients] for i in range(clients)]
    procs = [ctx.Process(target=_client, args=(port, s, world, tick, seconds, threads, out)) for s in shares]
    bystander = ctx.Process(target=_bystander, args=(port, seconds, by_out))
    asker_out = ctx.Queue()
    askers = [ctx.Process(target=_asker, args=(port, world, live, seconds / 3, asker_out))] if live else []
    cpu0, t0 = _cpu_seconds(server_pid), time.monotonic()
    for p in procs + [bystander] + askers:
        p.start()
    live_results = asker_out.get(timeout=seconds + 300) if askers else []
    rates = [out.get(timeout=seconds + 120) for _ in procs]
    samples = by_out.get(timeout=seconds + 120)
    lat = sorted(x for _, x in samples)
    for r in live_results:
        during = sorted(x for at, x in samples if r["t0"] <= at <= r["t1"])
        r["p99_ms"] = during[int(0.99 * (len(during) - 1))] * 1e3 if during else float("nan")
        r["p50_ms"] = statistics.median(during) * 1e3 if during else float("nan")
        r["mb"] = r["answered"] * snapshot_bytes(world) / 1e6
    cpu = (_cpu_seconds(server_pid) - cpu0) / (time.monotonic() - t0)
    for p in procs + [bystander] + askers:
        p.join(timeout=30)
    stop.set()
    server.join(timeout=30)
    return {
        "world": world, "budget": budget, "tick": tick,
        "offered": (OPS_PER_TICK + 1 / _look_every(world)) * world / tick, "achieved": sum(rates), "server_cpu": cpu,
        "p50_ms": statistics.median(lat) * 1e3, "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1e3,
        "mismatch_s": 2 * tick, "hang_exchange_s": 3 * tick, "live": live_results,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET, help="ops/s for the whole job (the 'after' runs)")
    ap.add_argument("--clients", type=int, default=2, help="client processes simulating the ranks")
    ap.add_argument("--threads", type=int, default=8, help="connections per client process")
    ap.add_argument("--seconds", type=float, default=8.0, help="duration of each run")
    ap.add_argument("--live", type=int, nargs="*", default=None, metavar="N",
                    help="in the runs with the budget, one live report of N ranks for each N given (after the first "
                         "third of the run)")
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPUs; {args.clients} client processes x {args.threads} connections; "
          f"{args.seconds:.0f} s per run; "
          f"{OPS_PER_TICK} store ops per rank per tick, plus rank 0's read of every status every "
          f"straggler_look_every(W) ticks (1 up to 64 ranks, else 8), counted per key")
    print(f"{'W':>6} {'budget':>8} {'tick':>7} {'offered':>10} {'achieved':>10} {'server CPU':>10} "
          f"{'get p50':>8} {'get p99':>8} {'mismatch <=':>11} {'hang exch.':>10}")
    for world in args.worlds:
        for budget in ((args.budget,) if args.live else (0, args.budget)):
            r = run(world, budget, args.clients, args.threads, args.seconds, args.live if budget else None)
            label = "none" if budget == 0 else f"{budget:.0f}"
            print(f"{world:>6} {label:>8} {r['tick']:>6.2f}s {r['offered']:>9.0f}/s {r['achieved']:>9.0f}/s "
                  f"{r['server_cpu'] * 100:>9.0f}% {r['p50_ms']:>6.2f}ms {r['p99_ms']:>6.2f}ms "
                  f"{r['mismatch_s']:>10.1f}s {r['hang_exchange_s']:>9.1f}s", flush=True)
            for lv in r["live"]:
                print(f"{'':>6} live report of {lv['n']} ranks: {lv['answered']} answered, collected in "
                      f"{lv['collect_s']:.2f} s (deadline {lv['deadline_s']:.1f} s), {lv['mb']:.0f} MB of snapshots, "
                      f"+{2 * world + lv['n'] + 3 * lv['answered']} ops; bystander get p50 / p99 during it "
                      f"{lv['p50_ms']:.2f} / {lv['p99_ms']:.2f} ms{'  ' + lv['error'] if lv['error'] else ''}",
                      flush=True)


if __name__ == "__main__":
    main()
