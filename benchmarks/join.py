"""What the join handshake adds to creating a guard group, at 1k simulated ranks (issue 57).

One real TCPStore server (torch's libuv server, as init_process_group makes)
and W simulated ranks: a few client processes, each running, for its share of
the ranks, one thread per rank with a store client of its own (a rank's
backend store). When every rank is connected, all are released at once and
each runs, in alternating rounds:

  join      torch_ext's JoinHandshake::join (_C._join) on the group's store: its
            record set, a wait on the verdict (rank 0: a wait on every record,
            one multi_get, the verdict set)
  barrier   the least any "every rank is here" step costs: add 1 to a counter,
            and wait on a key that the last rank to arrive sets (torch's
            store-based barrier does this, and more)

Printed per mode: the time from release until the last rank is through, the
median over rounds with quartiles, and the join's ratio to the barrier in the
same run. Neither includes the inner backend's rendezvous, which every rank
must pass anyway: gloo's full mesh reads every other rank's address from the
store (W gets per rank, W^2 in all: a million at 1k ranks), next to which both
are small.

    python benchmarks/join.py                        # W = 1000, 5 rounds
    python benchmarks/join.py --world 256 --rounds 9 --clients 2
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import threading
import time
from datetime import timedelta


def _client(port: int, ranks: list[int], world: int, rounds: int, out: "mp.Queue") -> None:
    import torch.distributed as dist

    import torch_ext  # noqa: F401  (loads _C)
    from torch_ext._core import _C

    stores = {r: dist.TCPStore("127.0.0.1", port, world, False, timeout=timedelta(seconds=300)) for r in ranks}
    control = dist.TCPStore("127.0.0.1", port, world, False, timeout=timedelta(seconds=300))
    control.add("connected", len(ranks))
    config = _C._resolve({})
    times: dict[tuple[str, int], list[float]] = {}

    def rank_main(r: int) -> None:
        store = stores[r]
        for k in range(rounds):
            for mode in ("join", "barrier"):
                group = dist.PrefixStore(f"{mode}{k}/", store)
                store.wait([f"go/{mode}{k}"])
                start = float(store.get(f"go/{mode}{k}").decode())
                if mode == "join":
                    _C._join(group, r, world, f"bench{k}", config, "bench", "bench", "host", os.getpid())
                else:
                    if group.add("count", 1) == world:
                        group.set("done", b"1")
                    group.wait(["done"])
                times.setdefault((mode, k), []).append(time.time() - start)
                store.add(f"fin/{mode}{k}", 1)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put({key: max(v) for key, v in times.items()})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=4, help="client processes the ranks are spread over")
    args = ap.parse_args()
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False, timeout=timedelta(seconds=300))
    out: mp.Queue = mp.get_context("spawn").Queue()
    ctx = mp.get_context("spawn")
    shares = [list(range(c, args.world, args.clients)) for c in range(args.clients)]
    procs = [ctx.Process(target=_client, args=(server.port, share, args.world, args.rounds, out)) for share in shares]
    for p in procs:
        p.start()
    while server.add("connected", 0) < args.world and any(p.is_alive() for p in procs):
        time.sleep(0.05)  # every rank's store client is connected
    for k in range(args.rounds):
        for mode in ("join", "barrier"):
            server.set(f"go/{mode}{k}", str(time.time()).encode())
            while server.add(f"fin/{mode}{k}", 0) < args.world and any(p.is_alive() for p in procs):
                time.sleep(0.01)  # the round is over on every rank before the next starts
    worst: dict[tuple[str, int], float] = {}
    for _ in procs:
        for key, t in out.get(timeout=600).items():
            worst[key] = max(worst.get(key, 0.0), t)
    for p in procs:
        p.join()
    print(f"W={args.world} simulated ranks, {args.clients} client processes, {args.rounds} rounds "
          "(until the last rank is through, ms: median [q1, q3])")
    med = {}
    for mode in ("join", "barrier"):
        ms = sorted(1000 * worst[(mode, k)] for k in range(args.rounds))
        q = statistics.quantiles(ms, n=4) if len(ms) > 1 else [ms[0]] * 3
        med[mode] = statistics.median(ms)
        print(f"  {mode:8s} {med[mode]:8.1f} [{q[0]:.1f}, {q[2]:.1f}]")
    ratios = sorted(worst[("join", k)] / worst[("barrier", k)] for k in range(args.rounds))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(f"  join / barrier: {statistics.median(ratios):.2f}x [{q[0]:.2f}, {q[2]:.2f}]")


if __name__ == "__main__":
    main()
