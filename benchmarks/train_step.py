"""Step time of a DDP and an FSDP2 training step on ``guard`` against plain gloo (issue 23).

Issue 23 makes ``check="verify"`` the default: safe by default at about zero step
cost. This measures that cost where users pay it, in a whole training step
(forward, backward with its gradient collectives, optimizer step) on CPU over
gloo on loopback, rather than per collective as overhead.py does.

Every rank creates one group per variant over the same ranks, up front: plain
``gloo``, and ``guard`` (wrapping gloo) with check ``verify`` (the default),
``strict`` and ``async`` (for reference); and one model per (model, group), all
from the same initial weights. Each round runs ``--steps`` steps of every
(model, group) pair, in an order shuffled anew each round (the same on every
rank), so machine noise hits all variants alike. A round's step time is the
slowest rank's mean over its steps (after a barrier); the ratio to gloo is taken
per round, against gloo's step time in the same round, then its median and
quartiles over rounds. The spread of gloo's own rounds around their median is the
run's noise: a ratio closer to 1 than that is not resolved by the run.

Models: ``--layers`` Linear(width, width) layers, each 1 MB of float32 parameters
at the default width 512.
  DDP:   ``bucket_cap_mb`` = one layer's weight, so each layer is its own gradient
         bucket (24 buckets by default; DDP puts every parameter in one bucket for
         its first two steps and rebuilds the buckets then, hence at least 3
         warm-up steps; the count printed is DDP's own ``num_buckets_reduced``
         after the warm-up steps).
  FSDP2: ``torch.distributed.fsdp.fully_shard`` on every layer and the root, on a
         DeviceMesh over the group; works on CPU with gloo (and guard) in torch
         2.13. Where it does not (another torch), the run says so and skips it.

    python benchmarks/train_step.py --world 2 --rounds 11 --steps 6               # DDP and FSDP2 (~3 min, 2 cores)
    python benchmarks/train_step.py --world 4 --rounds 11 --steps 4               # DDP and FSDP2 (~3 min, 2 cores)
    python benchmarks/train_step.py --world 2 --model ddp --rounds 40 --steps 20  # the DDP goal, more rounds (~3 min)
    python benchmarks/train_step.py --world 4 --model ddp --rounds 30 --steps 7   # the DDP goal, more rounds (~3 min)
    python benchmarks/train_step.py --world 2 --model ddp --loss-sync             # each step also syncs its loss
    python benchmarks/train_step.py --quick --world 2                             # tiny sizes: the smoke test
    python benchmarks/train_step.py --device cuda --model ddp --rounds 21 --steps 20  # one GPU, world 1, nccl

``--device cuda`` (a GPU machine; ``scripts/gpu.sh`` runs it): model and data on GPU
``rank``, DDP with ``device_ids=[rank]``, the baseline is plain ``nccl`` and the guard
wraps it (inner ``cuda:nccl``); world 1 by default (NCCL needs one GPU per rank), and
a round's clock stops after ``torch.cuda.synchronize()``. There the guard's host cost
per bucket is what it can add to a step: NCCL's collectives return at once.

Goal: verify <= 1.01x gloo (DDP step time), issue 23; strict and async are printed
for reference.
"""
from __future__ import annotations

import argparse
import importlib
import os
import random
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import _ranks  # noqa: E402

VARIANTS = {  # name -> check mode of the guard group, ",option=value" added (None: plain gloo)
    "gloo": None,
    "guard verify": "verify",
    "verify -strag": "verify,straggler=off",  # the default without straggler tracking (issue 28)
    "guard strict": "strict",
    "guard async": "async",
}
GOAL = 1.01  # verify / gloo, DDP step time
BASE = {"cpu": "gloo", "cuda": "nccl"}  # the baseline's label per --device (CPU with --inner fake: still "gloo")


def _variants(device: str) -> dict[str, str | None]:
    """VARIANTS with the baseline named after the device's backend."""
    return {BASE[device] if check is None else name: check for name, check in VARIANTS.items()}


def _model(layers: int, width: int) -> nn.Module:
    torch.manual_seed(0)  # the same initial weights for every variant and rank
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


def _ddp_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, loss_group=None) -> None:
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if loss_group is not None:  # --loss-sync: the mean loss across ranks, read at once (a logging line)
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=loss_group)
        mean.item()


def _fake_hook(group, bucket):
    buf = bucket.buffer()
    return dist.all_reduce(buf, group=group, async_op=True).get_future().then(lambda _: buf)


def _bucket_count(ddp: nn.Module) -> int:
    data = ddp._get_ddp_logging_data()
    if "num_buckets_reduced" in data:
        return int(data["num_buckets_reduced"])
    return len(str(data.get("rebuilt_bucket_sizes") or data["bucket_sizes"]).split(","))


def _rank(rank: int, world: int, store, models: list[str], layers: int, width: int, batch: int,
          rounds: int, steps: int, warmup: int, inner: str, device: str = "cpu", loss_sync: bool = False) -> dict:
    import torch_ext

    cuda = device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    variants = _variants(device)

    if inner == "fake":
        importlib.import_module("torch.testing._internal.distributed.fake_pg")  # registers "fake"

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    torch.set_flush_denormal(True)  # shrinking activations must not slow later rounds
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    ranks = list(range(world))
    groups = {}
    for name, check in variants.items():
        if check is None:
            groups[name] = dist.new_group(ranks, backend=inner)
        else:
            mode, *options = check.split(",")
            extra = dict(o.split("=", 1) for o in options)
            groups[name] = dist.new_group(ranks, backend="guard", pg_options=torch_ext.GuardOptions(
                check=mode, inner=f"{device}:{inner}", **extra))
    torch.manual_seed(1 + rank)
    x = torch.randn(batch, width)
    if cuda:
        x = x.cuda()

    def model() -> nn.Module:
        m = _model(layers, width)
        return m.cuda() if cuda else m

    def sync() -> None:  # a step's GPU work is done (CPU: nothing to wait for)
        if cuda:
            torch.cuda.synchronize()
    cap_mb = width * width * 4 / 2**20  # one layer's weight: each layer is a bucket

    runs = {}  # (model, variant) -> (module, optimizer)
    buckets: dict[str, int] = {}
    fsdp_error = ""
    if "ddp" in models:
        for name, g in groups.items():
            ddp = nn.parallel.DistributedDataParallel(model(), process_group=g, bucket_cap_mb=cap_mb,
                                                      device_ids=[rank] if cuda else None)
            if inner == "fake":
                # fake's futures carry no value, which DDP's built-in hook needs: the
                # same all_reduce from a Python hook that hands back the bucket.
                ddp.register_comm_hook(g, _fake_hook)
            opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
            for _ in range(warmup):  # the first steps rebuild the buckets
                _ddp_step(ddp, opt, x)
            buckets[name] = _bucket_count(ddp)
            runs[("DDP", name)] = (ddp, opt)
    if "fsdp2" in models:
        built = {}
        try:
            from torch.distributed.device_mesh import DeviceMesh
            from torch.distributed.fsdp import fully_shard

            for name, g in groups.items():
                m = model()
                mesh = DeviceMesh.from_group(g, device)
                for layer in m:
                    fully_shard(layer, mesh=mesh)
                fully_shard(m, mesh=mesh)
                opt = torch.optim.SGD(m.parameters(), lr=1e-3)
                for _ in range(warmup):
                    _ddp_step(m, opt, x)
                built[("FSDP2", name)] = (m, opt)
        except Exception as e:  # noqa: BLE001
            fsdp_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        # Every rank skips FSDP2 if any rank could not run it.
        ok = torch.tensor([0.0 if fsdp_error else 1.0])
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if ok.item() == 1.0:
            runs.update(built)
        elif not fsdp_error:
            fsdp_error = "failed on another rank"

    def check_rounds(name: str) -> tuple[int, int]:  # the verifier's gathers on that group so far, and their us
        v = torch_ext.group_state(groups[name]).get("verifier", {}) if variants[name] else {}
        return v.get("rounds", 0), v.get("gather_us", 0)

    times: dict[tuple[str, str], list[float]] = {k: [] for k in runs}
    checks: dict[tuple[str, str], list[int]] = {k: [0, 0] for k in runs}
    rng = random.Random(0)  # the same order on every rank
    for _ in range(rounds):
        order = list(runs.items())
        rng.shuffle(order)
        for key, (module, opt) in order:
            sync()
            dist.barrier()
            before = check_rounds(key[1])
            start = time.perf_counter()
            loss_group = groups[key[1]] if loss_sync else None
            for _ in range(steps):
                _ddp_step(module, opt, x, loss_group)
            sync()
            times[key].append((time.perf_counter() - start) / steps)
            after = check_rounds(key[1])
            checks[key][0] += after[0] - before[0]
            checks[key][1] += after[1] - before[1]
    dist.barrier()
    dist.destroy_process_group()
    return {"times": times, "buckets": buckets, "fsdp_error": fsdp_error, "threads": torch.get_num_threads(),
            "checks": {k: (n / (rounds * steps), us / max(n, 1)) for k, (n, us) in checks.items()}}


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def _verdict(q1: float, q3: float, goal: float) -> str:
    return "met" if q3 <= goal else ("not met" if q1 > goal else "not resolved by this run's noise")


def _report(world: int, res: list[dict], args: argparse.Namespace) -> None:
    first = res[0]
    base = BASE[args.device]
    variants = _variants(args.device)
    print(f"world {world}, {first['threads']} torch thread(s) per rank")
    if first["buckets"]:
        counts = {r["buckets"][v] for r in res for v in variants}
        count = min(counts)
        note = "" if count >= 20 else "  (fewer than the 20 wanted)"
        print(f"DDP buckets: {count} per step (DDP's own count after {args.warmup} warm-up steps, "
              f"{'every variant and rank' if len(counts) == 1 else 'differs: ' + str(sorted(counts))}){note}")
    if "fsdp2" in args.models:
        errors = {r["fsdp_error"] for r in res if r["fsdp_error"]}
        if errors:
            print(f"FSDP2: skipped, fully_shard on {args.device.upper()} with {base} does not work here: "
                  f"{'; '.join(sorted(errors))}")
        else:
            print(f"FSDP2: fully_shard on {args.device.upper()} with {base} and guard: works")
    # A round's step time is the slowest rank's.
    keys = list(first["times"])
    times = {k: [max(r["times"][k][i] for r in res) for i in range(args.rounds)] for k in keys}
    for model in ("DDP", "FSDP2"):
        if (model, base) not in times:
            continue
        base_times = times[(model, base)]
        for name in variants:
            q1, m, q3 = _quartiles(times[(model, name)])
            line = f"  {model:<5} {name:<13} {m * 1e3:8.2f} ms [{q1 * 1e3:.2f}, {q3 * 1e3:.2f}]"
            if name != base:
                r1, rm, r3 = _quartiles([t / b for t, b in zip(times[(model, name)], base_times)])
                line += f"   {rm:.3f}x {base} [{r1:.3f}, {r3:.3f}]"
            if variants[name] == "verify":
                per_step = max(r["checks"][(model, name)][0] for r in res)
                took = max(r["checks"][(model, name)][1] for r in res)
                line += f"   {per_step:.1f} check gathers/step, {took:.0f} us each"
            print(line)
        s1, sm, s3 = _quartiles([t / b for t, b in zip(times[(model, "guard verify")],
                                                       times[(model, "verify -strag")])])
        print(f"  {model:<5} straggler report (issue 28): verify / verify with straggler=off: "
              f"{sm:.3f}x [{s1:.3f}, {s3:.3f}]")
        q1, m, q3 = _quartiles(base_times)
        print(f"  {model:<5} noise: {base}'s own rounds span [{q1 / m:.3f}, {q3 / m:.3f}] of their median "
              f"(IQR {(q3 - q1) / m * 100:.1f}%)")
    if ("DDP", base) in times:
        r1, rm, r3 = _quartiles([t / b for t, b in zip(times[("DDP", "guard verify")], times[("DDP", base)])])
        print(f"goal: verify <= {GOAL:.2f}x {base} (DDP) at world {world}: {rm:.3f}x [{r1:.3f}, {r3:.3f}]: "
              f"{_verdict(r1, r3, GOAL)}")

    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, nargs="+", default=None,
                    help="worlds to measure (default 2 4; --device cuda: 1)")
    ap.add_argument("--model", default="both", choices=["ddp", "fsdp2", "both"])
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 11; --quick 3)")
    ap.add_argument("--steps", type=int, default=None,
                    help="steps per (model, group) per round (default 6; --quick 2)")
    ap.add_argument("--warmup", type=int, default=3,
                    help="untimed steps per (model, group) before the rounds (at least 3: DDP rebuilds its buckets)")
    ap.add_argument("--layers", type=int, default=None, help="Linear layers (default 24; --quick 6)")
    ap.add_argument("--width", type=int, default=None,
                    help="features per layer (default 512: 1 MB a layer; --quick 32)")
    ap.add_argument("--batch", type=int, default=None, help="samples per rank per step (default 32; --quick 4)")
    ap.add_argument("--inner", default=None, choices=["gloo", "fake", "nccl"],
                    help="the baseline and the guard's inner backend: gloo (the default on CPU), or torch's no-op "
                         "'fake' (collectives move no data: the guard's own cost against the compute; the check "
                         "still runs on gloo); nccl with --device cuda (its default and only choice)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: model and data on GPU rank, DDP over nccl, one GPU per rank (needs a GPU and a CUDA "
                         "build of torch)")
    ap.add_argument("--loss-sync", action="store_true",
                    help="after each step, a waited all_reduce of the loss (one float) on the variant's group")
    ap.add_argument("--quick", action="store_true", help="tiny sizes and few rounds: checks the script runs")
    args = ap.parse_args()
    quick = args.quick
    args.rounds = args.rounds or (3 if quick else 11)
    args.steps = args.steps or (2 if quick else 6)
    args.layers = args.layers or (6 if quick else 24)
    args.width = args.width or (32 if quick else 512)
    args.batch = args.batch or (4 if quick else 32)
    args.models = ["ddp", "fsdp2"] if args.model == "both" else [args.model]
    if args.warmup < 3:
        ap.error("--warmup must be at least 3: DDP times its first steps on one bucket, then rebuilds them")
    cuda = args.device == "cuda"
    args.inner = args.inner or ("nccl" if cuda else "gloo")
    args.world = args.world or ([1] if cuda else [2, 4])
    if cuda and args.inner != "nccl":
        ap.error(f"--device cuda runs over nccl (--inner nccl), not {args.inner}")
    if not cuda and args.inner == "nccl":
        ap.error("--inner nccl needs --device cuda (NCCL runs on GPUs)")
    if cuda:
        import _cuda

        _cuda.require("--device cuda" + (f" --world {max(args.world)}" if max(args.world) > 1 else ""),
                      gpus=max(args.world))

    layer = (args.width * args.width + args.width) * 4
    size = f"{layer / 2**20:.2f} MB" if layer >= 2**20 else f"{layer / 2**10:.1f} KB"
    if cuda:
        print(f"{_cuda.banner()}, {os.cpu_count()} CPUs, nccl, one GPU per rank")
    else:
        print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, " +
              ("gloo over loopback" if args.inner == "gloo" else
               "inner backend torch's no-op 'fake' (the rows named gloo are plain 'fake'; the guard's check runs "
               "on gloo)"))
    print(f"model: {args.layers} x Linear({args.width}, {args.width}) ({size} of parameters each), "
          f"batch {args.batch} per rank, SGD; DDP bucket_cap_mb={args.width * args.width * 4 / 2**20:.4g}")
    if args.loss_sync:
        print("each step ends with a waited all_reduce of the loss (one float32) on the step's group")
    print(f"{args.rounds} rounds; each runs {args.steps} steps of every (model, group) in a shuffled order;")
    print("step time: median [quartiles] over rounds of the slowest rank's mean step; ratio: per round,")
    print(f"against {BASE[args.device]}'s step time in the same round, median [quartiles] over rounds")
    for world in args.world:
        res = _ranks.run(_rank, world, args.models, args.layers, args.width, args.batch, args.rounds,
                         args.steps, args.warmup, args.inner, args.device, args.loss_sync)
        _report(world, res, args)


if __name__ == "__main__":
    main()
