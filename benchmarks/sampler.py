"""Bucket batch planning: torch_ext's C++ planner against the same plan in plain Python.

Target (issue 5): 10M samples, 64 ranks, 20 buckets planned in under 1 s with at
most 16 bytes per sample. The baseline is :func:`reference_plan` below, a
straightforward Python implementation of *the same plan* (same steps, same
generator); the run checks that both produce identical batches before timing
them, then prints times and the ratio measured in the same run.

    python benchmarks/sampler.py                      # the target configuration
    python benchmarks/sampler.py --baseline-samples 1000000   # quicker baseline

Memory is measured in a fresh child process: its peak resident set during
planning (Linux VmHWM, reset just before) minus its resident set before,
plus the bucket ids the sampler keeps, divided by the number of samples.

The reference implementation is also imported by tests/python/test_samplers.py,
which checks it against the C++ op on small inputs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


# ----------------------------------------------------------------- the reference plan


def mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def stream_key(seed: int, epoch: int, stream: int) -> int:
    key = mix64((seed + GOLDEN) & M64)
    key = mix64(key ^ mix64((epoch + 2 * GOLDEN) & M64))
    return mix64(key ^ mix64((stream + 3 * GOLDEN) & M64))


class SplitMix64:
    def __init__(self, key: int) -> None:
        self.state = key & M64

    def next(self) -> int:
        self.state = (self.state + GOLDEN) & M64
        return mix64(self.state)

    def bounded(self, n: int) -> int:
        m = self.next() * n
        if (m & M64) < n:
            threshold = ((1 << 64) - n) % n
            while (m & M64) < threshold:
                m = self.next() * n
        return m >> 64


def shuffle(items: list, rng: SplitMix64) -> None:
    for i in range(len(items) - 1, 0, -1):
        j = rng.bounded(i + 1)
        items[i], items[j] = items[j], items[i]


def reference_plan(
    bucket_ids: list[int], batch_sizes: list[int], seed: int, epoch: int, shuffle_: bool, policy: str
) -> tuple[list[int], list[int]]:
    """The epoch's global plan: (order, batch_offsets), as csrc/sampling/BucketPlan.h describes."""
    buckets: list[list[int]] = [[] for _ in batch_sizes]
    for i, b in enumerate(bucket_ids):  # grouped by bucket, ascending within each
        buckets[b].append(i)
    batches: list[list[int]] = []
    for b, members in enumerate(buckets):
        if shuffle_:
            shuffle(members, SplitMix64(stream_key(seed, epoch, 1 + b)))
        size = batch_sizes[b]
        full = len(members) // size
        for j in range(full):
            batches.append(members[j * size : (j + 1) * size])
        if policy == "pad" and len(members) % size:
            batches.append(members[full * size :])
    if shuffle_:
        shuffle(batches, SplitMix64(stream_key(seed, epoch, 0)))
    order, offsets = [], [0]
    for batch in batches:
        order.extend(batch)
        offsets.append(len(order))
    return order, offsets


def reference_deal(num_batches: int, consumed: int, num_replicas: int, rank: int, policy: str) -> list[int]:
    """Global batch indices of one rank (round-robin; pad wraps to the start)."""
    remaining = num_batches - consumed
    count = remaining // num_replicas if policy == "drop" else -(-remaining // num_replicas)
    return [(consumed + j * num_replicas + rank) % num_batches for j in range(count)]


# ----------------------------------------------------------------- the benchmark


def make_inputs(num_samples: int, num_buckets: int, seed: int = 0):
    """Skewed bucket sizes (weights 1/(b+1), like aspect-ratio histograms) and batch sizes 8..64."""
    import torch

    g = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, num_buckets + 1, dtype=torch.float64)
    ids = torch.empty(num_samples, dtype=torch.int32)
    chunk = 1 << 20  # draw in chunks: no int64 temporary as large as the dataset
    for s in range(0, num_samples, chunk):
        n = min(chunk, num_samples - s)
        ids[s : s + n] = torch.multinomial(weights, n, replacement=True, generator=g).to(torch.int32)
    batch_sizes = torch.tensor([8 * (1 + (b * 7) % 8) for b in range(num_buckets)], dtype=torch.long)
    return ids, batch_sizes


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_child(num_samples: int, num_buckets: int, num_ranks: int) -> None:
    """Runs in a fresh process: peak bytes per sample of one epoch's planning on rank 0."""

    import torch_ext

    ids, batch_sizes = make_inputs(num_samples, num_buckets)
    before = _rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM (peak RSS) to the current RSS
    sampler = torch_ext.BucketBatchSampler(ids, dict(enumerate(batch_sizes.tolist())), num_replicas=num_ranks,
                                           rank=0, seed=0)
    batches = iter(sampler)  # plans the epoch and deals it
    next(batches)
    peak = _rss_kib("VmHWM")
    order, offsets = sampler._plan_of_epoch()
    resident = sampler._bucket_ids.nbytes + order.nbytes + offsets.nbytes
    print(json.dumps({
        "peak_extra_bytes": (peak - before) * 1024,
        "ids_bytes": ids.nbytes,
        "resident_plan_bytes": resident,
        "batches": offsets.numel() - 1,
        "per_rank": len(sampler),
    }))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=10_000_000)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--buckets", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5, help="timed repetitions of the C++ plan (best is reported)")
    ap.add_argument("--baseline-samples", type=int, default=None,
                    help="time the Python baseline (and the C++ plan, for the ratio) on the first N samples; "
                         "default: all of them")
    ap.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        memory_child(args.samples, args.buckets, args.ranks)
        return

    import torch

    import torch_ext

    n, W = args.samples, args.ranks
    ids, batch_sizes = make_inputs(n, args.buckets)
    print(f"torch {torch.__version__}, torch_ext {torch_ext.__version__}, threads {torch.get_num_threads()}, "
          f"{os.cpu_count()} CPUs")
    print(f"config: {n:,} samples, {args.buckets} buckets (skewed, {min(ids.bincount().tolist()):,} to "
          f"{max(ids.bincount().tolist()):,} samples), batch sizes {batch_sizes.tolist()}, {W} ranks, policy pad")

    # torch_ext, end to end on one rank: keys -> dense ids, fingerprint, the plan, this rank's deal.
    sizes = dict(enumerate(batch_sizes.tolist()))
    best_build = best_plan = float("inf")
    for rep in range(args.repeat):
        t0 = time.perf_counter()
        sampler = torch_ext.BucketBatchSampler(ids, sizes, num_replicas=W, rank=0, seed=0)
        t1 = time.perf_counter()
        sampler.set_epoch(rep)
        batches = iter(sampler)  # plans the epoch, deals it, looks up this rank's batch bounds
        first = next(batches)
        t2 = time.perf_counter()
        best_build, best_plan = min(best_build, t1 - t0), min(best_plan, t2 - t1)
    print(f"torch_ext: construct (dense ids, counts, fingerprint) {best_build:.3f} s, "
          f"plan + deal per epoch {best_plan:.3f} s, total {best_build + best_plan:.3f} s "
          f"(best of {args.repeat}); {sampler.num_batches:,} batches, {len(sampler):,} per rank")
    print(f"  first batch of rank 0: {len(first)} samples of bucket {sampler.bucket_keys[int(ids[first[0]])]}")

    out = subprocess.run([sys.executable, __file__, "--memory-child", "--samples", str(n), "--buckets",
                          str(args.buckets), "--ranks", str(W)], capture_output=True, text=True, check=True)
    mem = json.loads(out.stdout.strip().splitlines()[-1])
    peak_per_sample = (mem["peak_extra_bytes"] + mem["ids_bytes"]) / n
    print(f"memory: peak {peak_per_sample:.1f} bytes/sample (bucket ids + planning peak, fresh process); "
          f"resident plan {mem['resident_plan_bytes'] / n:.1f} bytes/sample (ids + order + offsets)")

    # Baseline: the same plan in plain Python, on the same input (or its first --baseline-samples).
    nb = min(args.baseline_samples or n, n)
    sub = ids[:nb].contiguous()
    ids_list, sizes_list = sub.tolist(), batch_sizes.tolist()
    t0 = time.perf_counter()
    ref_order, ref_offsets = reference_plan(ids_list, sizes_list, 0, 0, True, "pad")
    ref_deal = reference_deal(len(ref_offsets) - 1, 0, W, 0, "pad")
    t_py = time.perf_counter() - t0
    del ids_list
    best_cpp = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        c_order, c_offsets = torch.ops.torch_ext.bucket_plan(sub, batch_sizes, 0, 0, True, "pad")
        c_deal = torch.ops.torch_ext.bucket_deal(c_offsets.numel() - 1, 0, W, 0, "pad")
        best_cpp = min(best_cpp, time.perf_counter() - t0)
    same = c_order.tolist() == ref_order and c_offsets.tolist() == ref_offsets and c_deal.tolist() == ref_deal
    print(f"baseline on {nb:,} samples: Python reference {t_py:.2f} s, torch_ext op {best_cpp:.3f} s, "
          f"ratio {t_py / best_cpp:.0f}x; identical plans: {same}")
    if not same:
        raise SystemExit("the C++ plan and the Python reference differ")
    target_ok = best_plan + best_build < 1.0 and peak_per_sample <= 16
    print(f"target (<1 s, <=16 bytes/sample): {'met' if target_ok else 'NOT met'}")


if __name__ == "__main__":
    main()
