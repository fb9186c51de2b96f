"""Load the guard's watchdog puts on the one TCPStore of a job, at 1k to 16k ranks.

One real TCPStore server (its own process, torch's libuv server as in
init_process_group) and W simulated ranks: a few client processes, each
issuing, for its share of the ranks, exactly the guard's per-tick store
operations with the real key layout of a group "default_pg":

  set       guard/default_pg/st/<r>              this rank's status record (v2 run ...)
  multi_get guard/default_pg/st/<r+1>, st/<r-1>  its ring neighbours (the async check)
  add       guard/default_pg/alerts, 0           is an incident open?

every tick of each rank. The tick is torch_ext's: `interval` (0.2 s) at small
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
    # The size of a real status record (StatusRecord::encode): phase, time, seqs, hash.
    return f"v2 run {time.time_ns()} {seq} {seq} {rank * 2654435761 % 2**64:016x} 0".encode()


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
        while time.monotonic() - start < seconds:
            seq += 1
            for r in mine:
                store.set(f"{prefix}st/{r}", _record(r, seq))
                store.multi_get([f"{prefix}st/{(r + 1) % world}", f"{prefix}st/{(r - 1) % world}"])
                store.add(prefix + "alerts", 0)
                ops += OPS_PER_TICK
            next_tick += tick
            delay = next_tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # pacing to the tick, not synchronisation
            else:
                next_tick = time.monotonic()  # behind: the store (or this client) cannot keep up
        rates.append(ops / (time.monotonic() - start))

    workers = [threading.Thread(target=loop, args=(ranks[i::threads],)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    out.put(sum(rates))


def _bystander(port: int, seconds: float, out: mp.Queue) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 1, is_master=False, timeout=timedelta(seconds=60))
    store.set("user/key", b"x")
    lat = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        store.get("user/key")
        lat.append(time.perf_counter() - t0)
        time.sleep(0.01)
    out.put(lat)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(world: int, budget: float, clients: int, threads: int, seconds: float) -> dict:
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
    cpu0, t0 = _cpu_seconds(server_pid), time.monotonic()
    for p in procs + [bystander]:
        p.start()
    rates = [out.get(timeout=seconds + 120) for _ in procs]
    lat = sorted(by_out.get(timeout=seconds + 120))
    cpu = (_cpu_seconds(server_pid) - cpu0) / (time.monotonic() - t0)
    for p in procs + [bystander]:
        p.join(timeout=30)
    stop.set()
    server.join(timeout=30)
    return {
        "world": world, "budget": budget, "tick": tick,
        "offered": OPS_PER_TICK * world / tick, "achieved": sum(rates), "server_cpu": cpu,
        "p50_ms": statistics.median(lat) * 1e3, "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1e3,
        "mismatch_s": 2 * tick, "hang_exchange_s": 3 * tick,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET, help="ops/s for the whole job (the 'after' runs)")
    ap.add_argument("--clients", type=int, default=2, help="client processes simulating the ranks")
    ap.add_argument("--threads", type=int, default=8, help="connections per client process")
    ap.add_argument("--seconds", type=float, default=8.0, help="duration of each run")
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPUs; {args.clients} client processes x {args.threads} connections; {args.seconds:.0f} s per run; "
          f"{OPS_PER_TICK} store ops per rank per tick")
    print(f"{'W':>6} {'budget':>8} {'tick':>7} {'offered':>10} {'achieved':>10} {'server CPU':>10} "
          f"{'get p50':>8} {'get p99':>8} {'mismatch <=':>11} {'hang exch.':>10}")
    for world in args.worlds:
        for budget in (0, args.budget):
            r = run(world, budget, args.clients, args.threads, args.seconds)
            label = "none" if budget == 0 else f"{budget:.0f}"
            print(f"{world:>6} {label:>8} {r['tick']:>6.2f}s {r['offered']:>9.0f}/s {r['achieved']:>9.0f}/s "
                  f"{r['server_cpu'] * 100:>9.0f}% {r['p50_ms']:>6.2f}ms {r['p99_ms']:>6.2f}ms "
                  f"{r['mismatch_s']:>10.1f}s {r['hang_exchange_s']:>9.1f}s", flush=True)


if __name__ == "__main__":
    main()
