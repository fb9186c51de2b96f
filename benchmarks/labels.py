"""What labels cost off the collective path: capturing an origin, entering a label, and
``self.log(..., sync_dist=True)`` under ``ddp_guard`` (which records the user's line).

    python benchmarks/labels.py                 # all three, one process, CPU
    python benchmarks/labels.py --rounds 15 --json out.json

1. ``torch_ext.here()``: a code object and a line (what the strategy keeps per
   ``self.log``).
2. Entering a label: ``with torch_ext.label(text, origin=o, metric=...)`` for a label
   seen before (what each epoch-end metric sync costs), and the first entry of a
   label whose origin is a code object never seen (interning it; ``--cold`` counts).
3. ``self.log("m", x, sync_dist=True)`` in a real ``Trainer`` (``ddp_guard``, one CPU
   process): the wrapped ``LightningModule.log`` against Lightning's own, alternating
   round by round (the difference per round: what recording the origin costs per
   call, within the noise of Lightning's own 200+ us), and the recording alone
   (``GuardDDPStrategy._remember_log_origin``: the caller's frame, a dict store).

Each figure is the median over rounds of the per-call mean, with quartiles.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from typing import Any, Callable

import torch

import torch_ext


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def _per_call(fn: Callable[[], None], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def bench_labels(rounds: int, n: int, cold: int) -> dict[str, Any]:
    origin = torch_ext.here()

    def enter_seen() -> None:
        with torch_ext.label("metric 'val_loss' logged with sync_dist=True", origin=origin, hint="h",
                             metric="val_loss", hook="validation_step"):
            pass

    def nothing() -> None:
        pass

    enter_seen()
    res: dict[str, list[float]] = {"here": [], "enter_seen": [], "call": []}
    for _ in range(rounds):
        res["call"].append(_per_call(nothing, n))
        res["here"].append(_per_call(torch_ext.here, n))
        res["enter_seen"].append(_per_call(enter_seen, n))
    # First entry of labels whose origin is a code object not seen before.
    codes = []
    for i in range(cold):
        ns: dict[str, Any] = {}
        exec(compile(f"def validation_step_{i}(self):\n    pass\n", f"/job/model_{i}.py", "exec"), ns)
        codes.append(ns[f"validation_step_{i}"].__code__)
    cold_times = []
    for i, code in enumerate(codes):
        lab = torch_ext.label(f"metric 'm{i}'", origin=(code, 2), metric=f"m{i}")
        t0 = time.perf_counter()
        with lab:
            pass
        cold_times.append(time.perf_counter() - t0)
    out = {k: _quartiles(v) for k, v in res.items()}
    out["enter_first"] = _quartiles(cold_times)
    return out


def bench_self_log(rounds: int, calls: int) -> dict[str, Any]:
    import lightning.pytorch as pl
    from lightning.pytorch import LightningModule

    import torch_ext.lightning  # noqa: F401  (registers "ddp_guard")
    from torch_ext.lightning import strategy as guard_strategy

    times: dict[str, list[float]] = {"wrapped": [], "lightning": [], "record": []}

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.net(batch[0]).sum()

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            value = torch.tensor(1.0)
            wrapped = LightningModule.log
            own = getattr(wrapped, "__wrapped__", wrapped)
            order = [("wrapped", wrapped), ("lightning", own)]
            if batch_idx % 2:
                order.reverse()
            for name, log in order:
                start = time.perf_counter()
                for _ in range(calls):
                    log(self, "val_loss", value, sync_dist=True)  # LightningModule.log as called by self.log
                times[name].append((time.perf_counter() - start) / calls)
            # What the wrapper adds, alone: the strategy records the caller's code and line.
            record = self.trainer.strategy._remember_log_origin
            start = time.perf_counter()
            for _ in range(calls * 50):
                record("val_loss", "validation_step")
            times["record"].append((time.perf_counter() - start) / (calls * 50))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(rounds + 1, 2))
    loader = torch.utils.data.DataLoader(data, batch_size=1)
    trainer = pl.Trainer(accelerator="cpu", devices=1, strategy="ddp_guard", max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_train_batches=1, limit_val_batches=rounds + 1, num_sanity_val_steps=0)
    trainer.fit(Model(), train_dataloaders=loader, val_dataloaders=loader)
    assert getattr(LightningModule.log, "_torch_ext_wrapped", False), "ddp_guard did not wrap LightningModule.log"
    assert isinstance(trainer.strategy, guard_strategy.GuardDDPStrategy)
    # The first batch warms both paths; it is left out.
    diffs = [w - o for w, o in zip(times["wrapped"][1:], times["lightning"][1:])]
    return {"wrapped": _quartiles(times["wrapped"][1:]), "lightning": _quartiles(times["lightning"][1:]),
            "added": _quartiles(diffs), "record": _quartiles(times["record"][1:])}


def _fmt(q: tuple[float, float, float]) -> str:
    return f"{q[1] * 1e6:8.2f} us  [{q[0] * 1e6:.2f}, {q[2] * 1e6:.2f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--n", type=int, default=20000, help="calls per round (here, entering a seen label)")
    p.add_argument("--cold", type=int, default=2000, help="labels with a new origin, each entered once")
    p.add_argument("--log-calls", type=int, default=200, help="self.log calls per round")
    p.add_argument("--no-lightning", action="store_true")
    p.add_argument("--json")
    args = p.parse_args(argv)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:  # a free port for the one-process group ddp_guard creates
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    res: dict[str, Any] = {"labels": bench_labels(args.rounds, args.n, args.cold)}
    lab = res["labels"]
    print(f"empty call             {_fmt(lab['call'])}")
    print(f"torch_ext.here()       {_fmt(lab['here'])}")
    print(f"enter a seen label     {_fmt(lab['enter_seen'])}")
    print(f"enter a new label      {_fmt(lab['enter_first'])}  (first entry, origin a new code object)")
    if not args.no_lightning:
        res["self_log"] = bench_self_log(args.rounds, args.log_calls)
        sl = res["self_log"]
        print(f"self.log, Lightning's  {_fmt(sl['lightning'])}")
        print(f"self.log, ddp_guard's  {_fmt(sl['wrapped'])}")
        print(f"added per self.log     {_fmt(sl['added'])}  (difference per round: noisy)")
        print(f"recording the origin   {_fmt(sl['record'])}  (the strategy's part of it, alone)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
