"""BucketBatchSampler and epoch_length: equal per-rank batch counts by construction.

Single-process tests check the plan (against the Python reference in
benchmarks/sampler.py), the policies, resumption and the errors; the
multi-process tests run the multi-scale scenario of issue 5 on 3 gloo ranks.
"""
from __future__ import annotations

import collections
import importlib.util
import pathlib
import random

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, get_worker_info

import torch_ext
from harness import assert_all_ok, report, run_ranks
from torch_ext import BucketBatchSampler, epoch_length

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load_reference():
    spec = importlib.util.spec_from_file_location("bench_sampler", ROOT / "benchmarks" / "sampler.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REF = _load_reference()

# Aspect-ratio buckets with skewed sizes, bigger batches for smaller images.
RATIOS = [0.5, 0.75, 1.0, 1.33, 2.0]
WEIGHTS = [1, 3, 10, 4, 2]
BATCH = {0.5: 8, 0.75: 6, 1.0: 4, 1.33: 6, 2.0: 8}


def skewed_keys(n: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return rng.choices(RATIOS, weights=WEIGHTS, k=n)


def all_ranks(keys, batch_size, world, **kw) -> list[list[list[int]]]:
    out = []
    for r in range(world):
        s = BucketBatchSampler(keys, batch_size, num_replicas=world, rank=r, **kw)
        out.append(list(s))
        assert len(out[-1]) == len(s)
    return out


# ------------------------------------------------------------------ the plan itself


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("policy", ["pad", "drop"])
@pytest.mark.parametrize("seed,epoch", [(0, 0), (12345, 3), (-7, 1), (2**64 - 1, 9)])
def test_plan_equals_python_reference(shuffle, policy, seed, epoch):
    rng = random.Random(seed & 0xFFFF)
    n, buckets = 400 + (seed & 0xFF), 6
    ids = [min(int(rng.expovariate(0.6)), buckets - 1) for _ in range(n)]
    sizes = [rng.randint(1, 9) for _ in range(buckets)]
    order, offsets = torch.ops.torch_ext.bucket_plan(
        torch.tensor(ids, dtype=torch.int32), torch.tensor(sizes), torch_ext.samplers._as_int64(seed), epoch,
        shuffle, policy)
    ref_order, ref_offsets = REF.reference_plan(ids, sizes, seed, epoch, shuffle, policy)
    assert order.tolist() == ref_order
    assert offsets.tolist() == ref_offsets
    t = len(ref_offsets) - 1
    for world in (1, 3, 7):
        for consumed in (0, min(t, world), t):
            for rank in range(world):
                got = torch.ops.torch_ext.bucket_deal(t, consumed, world, rank, policy).tolist()
                assert got == REF.reference_deal(t, consumed, world, rank, policy)


def test_sampler_iterates_the_global_plan_round_robin():
    keys = skewed_keys(300)
    world = 4
    ranks = all_ranks(keys, BATCH, world, seed=5)
    plan = BucketBatchSampler(keys, BATCH, num_replicas=world, rank=0, seed=5).plan()
    for r in range(world):
        expected = [plan[k % len(plan)] for k in range(r, world * len(ranks[r]), world)]
        assert ranks[r] == expected


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("policy", ["pad", "drop"])
def test_equal_counts_one_bucket_per_batch_and_policy_guarantees(world, policy):
    keys = skewed_keys(523, seed=world)
    ranks = all_ranks(keys, BATCH, world, seed=1, policy=policy)
    counts = {len(b) for b in ranks}
    assert len(counts) == 1, f"unequal per-rank batch counts {[len(b) for b in ranks]}"
    uses = collections.Counter()
    batches_total = 0
    for batches in ranks:
        for batch in batches:
            bucket = {keys[i] for i in batch}
            assert len(bucket) == 1, f"batch mixes buckets {bucket}"
            assert 1 <= len(batch) <= BATCH[keys[batch[0]]]
            if policy == "drop":
                assert len(batch) == BATCH[keys[batch[0]]]
            uses.update(batch)
            batches_total += 1
    n_batches = BucketBatchSampler(keys, BATCH, num_replicas=world, rank=0, policy=policy).num_batches
    if policy == "pad":
        assert set(uses) == set(range(len(keys))), "pad must use every sample"
        assert batches_total - n_batches <= world - 1, "pad repeats at most world - 1 batches"
    else:
        assert max(uses.values()) == 1, "drop must use each sample at most once"
        assert n_batches - batches_total <= world - 1, "drop leaves out at most world - 1 batches"


def test_deterministic_in_seed_and_epoch():
    keys = skewed_keys(200)
    a = BucketBatchSampler(keys, BATCH, num_replicas=2, rank=1, seed=3)
    b = BucketBatchSampler(keys, BATCH, num_replicas=2, rank=1, seed=3)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    second = list(a)
    assert second != first
    b.set_epoch(1)
    assert list(b) == second
    assert list(a) == second, "iterating again the same epoch repeats it"
    c = BucketBatchSampler(keys, BATCH, num_replicas=2, rank=1, seed=4)
    assert list(c) != first


def test_no_shuffle_is_bucket_major_and_ascending():
    keys = ["b", "a", "b", "a", "a", "b", "b"]
    s = BucketBatchSampler(keys, {"a": 2, "b": 3}, num_replicas=1, rank=0, shuffle=False)
    assert list(s) == [[1, 3], [4], [0, 2, 5], [6]]


def test_bucket_keys_any_hashable_tensor_array_and_callable():
    import numpy as np

    sizes = [(512, 1024), (1024, 512), (768, 768)]
    keys = [sizes[i % 3] if i % 5 else sizes[2] for i in range(60)]
    bs = {(512, 1024): 4, (1024, 512): 2, (768, 768): 3}
    from_list = BucketBatchSampler(keys, bs, num_replicas=1, rank=0, seed=2)
    from_tensor = BucketBatchSampler(torch.tensor(keys), bs, num_replicas=1, rank=0, seed=2)
    from_array = BucketBatchSampler(np.array(keys), bs, num_replicas=1, rank=0, seed=2)
    from_callable = BucketBatchSampler(lambda i: keys[i], bs, num_replicas=1, rank=0, seed=2, num_samples=60)
    assert from_list.bucket_keys == sorted(bs)
    assert list(from_list) == list(from_tensor) == list(from_array) == list(from_callable)
    for batch in from_list:
        assert len(batch) <= bs[keys[batch[0]]]
    # Keys of mixed types (not sortable) keep first-appearance order, the same on every rank.
    mixed = BucketBatchSampler([1, "x", 1, None], 2, num_replicas=1, rank=0)
    assert mixed.bucket_keys == [1, "x", None]
    # Strings and ints stay themselves (numpy would have turned 1 into "1").
    assert BucketBatchSampler([1, "1"], {1: 1, "1": 1}, num_replicas=1, rank=0).num_batches == 2


def test_batch_size_is_the_size_of_every_batch_or_none_when_lengths_vary():
    # torch and Accelerate read batch_size as "every batch has this many samples"
    # (Accelerate's BatchSamplerShard deals any lengths only when it is None).
    keys = [i % 2 for i in range(20)]  # two buckets of 10

    def lengths(s):
        return {len(b) for b in s}

    s = BucketBatchSampler(keys, 5, num_replicas=1, rank=0)  # 10 = 2 x 5: all full
    assert s.batch_size == 5 and lengths(s) == {5}
    s = BucketBatchSampler(keys, 4, num_replicas=1, rank=0)  # pad: each bucket ends with a batch of 2
    assert s.batch_size is None and lengths(s) == {2, 4}
    s = BucketBatchSampler(keys, 4, num_replicas=1, rank=0, policy="drop")
    assert s.batch_size == 4 and lengths(s) == {4}
    s = BucketBatchSampler(keys, {0: 5, 1: 2}, num_replicas=1, rank=0)  # one size per bucket
    assert s.batch_size is None and s.batch_sizes == [5, 2] and lengths(s) == {2, 5}


def test_len_is_exact_for_the_drop_remainders():
    keys = [0] * 10 + [1] * 7
    s = BucketBatchSampler(keys, {0: 4, 1: 3}, num_replicas=2, rank=0, policy="drop")
    assert s.num_batches == 2 + 2  # 10 // 4 + 7 // 3
    assert len(s) == len(list(s)) == 2
    s = BucketBatchSampler(keys, {0: 4, 1: 3}, num_replicas=3, rank=2, policy="pad")
    assert s.num_batches == 3 + 3
    assert len(s) == len(list(s)) == 2


# ------------------------------------------------------------------ resuming


def _take(sampler, k):
    it = iter(sampler)
    return [next(it) for _ in range(k)]


@pytest.mark.parametrize("policy", ["pad", "drop"])
@pytest.mark.parametrize("world_before,world_after", [(3, 3), (4, 2), (2, 3), (3, 1)])
def test_resume_mid_epoch_on_same_or_other_world_size(policy, world_before, world_after):
    keys = skewed_keys(401, seed=11)
    kw = dict(seed=9, policy=policy)
    before = [BucketBatchSampler(keys, BATCH, num_replicas=world_before, rank=r, **kw) for r in range(world_before)]
    for s in before:
        s.set_epoch(2)
    steps = 5
    consumed = [b for s in before for b in _take(s, steps)]
    state = before[0].state_dict()
    assert state["consumed_batches"] == steps * world_before
    assert all(s.state_dict() == state for s in before[1:]), "every rank saves the same position"

    after, resumed = [], []
    for r in range(world_after):
        s = BucketBatchSampler(keys, BATCH, num_replicas=world_after, rank=r, seed=0, policy=policy)
        s.load_state_dict(state)
        assert s.epoch == 2 and s.seed == 9
        s.set_epoch(2)  # as Lightning does on resume: keeps the position
        expected_len = len(s)
        resumed.append(s)
        after.append(list(s))
        assert len(after[-1]) == expected_len, "len() after load_state_dict is the rest of the epoch"
    assert len({len(b) for b in after}) == 1, "resumed ranks get equal counts"

    plan = before[0].plan(2)
    seen = collections.Counter(i for b in consumed for i in b)
    seen.update(i for batches in after for b in batches for i in b)
    if policy == "drop":
        assert max(seen.values()) == 1, "drop: no sample twice across the interruption"
        # Only the last partial round after resuming is left out.
        assert len(plan) - len(consumed) - sum(map(len, after)) < world_after
    else:
        assert set(seen) == set(range(len(keys))), "pad: no sample skipped across the interruption"
        extra = len(consumed) + sum(map(len, after)) - len(plan)
        assert 0 <= extra < world_after
    if world_before == world_after:
        uninterrupted = BucketBatchSampler(keys, BATCH, num_replicas=world_after, rank=1 % world_after, **kw)
        uninterrupted.set_epoch(2)
        assert list(uninterrupted)[steps:] == after[1 % world_after]

    # After the resumed epoch, the next epoch is a full one again, equal to a fresh sampler's.
    fresh = BucketBatchSampler(keys, BATCH, num_replicas=world_after, rank=0, **kw)
    fresh.set_epoch(3)
    resumed[0].set_epoch(3)
    assert len(resumed[0]) == len(fresh) > 0
    assert list(resumed[0]) == list(fresh)


def test_state_at_epoch_end_and_explicit_consumed_batches():
    keys = skewed_keys(100)
    s = BucketBatchSampler(keys, BATCH, num_replicas=2, rank=0, seed=1)
    assert s.state_dict()["consumed_batches"] == 0
    list(s)
    done = s.state_dict()
    assert done["consumed_batches"] == s.num_batches
    t = BucketBatchSampler(keys, BATCH, num_replicas=2, rank=1, seed=1)
    t.load_state_dict(done)
    assert len(t) == 0 and list(t) == []
    t.set_epoch(1)
    assert len(t) > 0
    # A consumer that prefetched: the sampler handed out 4 batches, training used 2.
    it = iter(s)
    for _ in range(4):
        next(it)
    assert s.state_dict()["consumed_batches"] == 8
    assert s.state_dict(consumed_batches=2)["consumed_batches"] == 4
    with pytest.raises(ValueError, match=r"consumed_batches=99 exceeds"):
        s.state_dict(consumed_batches=99)


def test_set_epoch_during_an_iteration_detaches_it():
    keys = skewed_keys(100)
    s = BucketBatchSampler(keys, BATCH, num_replicas=2, rank=0, seed=1)
    it = iter(s)
    next(it)
    s.set_epoch(1)
    rest = list(it)  # the old iterator finishes epoch 0's plan...
    assert len(rest) == len(s) - 1
    assert s.state_dict()["consumed_batches"] == 0  # ...without moving epoch 1's position
    assert s.state_dict()["epoch"] == 1


def test_load_state_dict_from_another_dataset_or_setting_is_refused():
    keys = skewed_keys(120)
    state = BucketBatchSampler(keys, BATCH, num_replicas=2, rank=0).state_dict()

    def sampler(k=keys, bs=BATCH, **kw):
        return BucketBatchSampler(k, bs, num_replicas=2, rank=0, **kw)

    with pytest.raises(ValueError, match=r"saved for 120 samples, this sampler has 121.*another dataset"):
        sampler(keys + [1.0]).load_state_dict(state)
    swapped = list(keys)
    i = next(i for i in range(1, len(keys)) if keys[i] != keys[0])
    swapped[0], swapped[i] = swapped[i], swapped[0]
    with pytest.raises(ValueError, match=r"different assignment of samples to buckets"):
        sampler(swapped).load_state_dict(state)
    with pytest.raises(ValueError, match=r"batch sizes \[8, 6, 4, 6, 8\].*this sampler has \[8, 6, 4, 6, 9\]"):
        sampler(bs={**BATCH, 2.0: 9}).load_state_dict(state)
    with pytest.raises(ValueError, match=r"policy='pad'.*policy='drop'"):
        sampler(policy="drop").load_state_dict(state)
    with pytest.raises(ValueError, match=r"has no \['fingerprint'\]"):
        sampler().load_state_dict({k: v for k, v in state.items() if k != "fingerprint"})
    with pytest.raises(ValueError, match=r"consumed_batches=10000 exceeds"):
        sampler().load_state_dict({**state, "consumed_batches": 10000})


# ------------------------------------------------------------------ errors


def test_errors_name_the_bad_value_and_the_fix():
    keys = [0.5, 1.0, 2.0, 1.0]
    with pytest.raises(ValueError, match=r"no entry for bucket\(s\) 2.0 \(1 samples\).*add them"):
        BucketBatchSampler(keys, {0.5: 2, 1.0: 2}, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match=r"batch_size\[1.0\]=0: a batch size must be at least 1"):
        BucketBatchSampler(keys, {0.5: 2, 1.0: 0, 2.0: 1}, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match=r"policy='even' is not a policy"):
        BucketBatchSampler(keys, 2, num_replicas=1, rank=0, policy="even")
    with pytest.raises(ValueError, match=r"rank=3 is outside \[0, num_replicas=3\)"):
        BucketBatchSampler(keys, 2, num_replicas=3, rank=3)
    with pytest.raises(ValueError, match=r"pass num_samples=len\(dataset\)"):
        BucketBatchSampler(lambda i: 0, 2, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match=r"num_samples=5 but buckets has 4 keys"):
        BucketBatchSampler(keys, 2, num_replicas=1, rank=0, num_samples=5)
    with pytest.raises(ValueError, match=r"not initialized: call init_process_group\(\)"):
        BucketBatchSampler(keys, 2)
    with pytest.raises(ValueError, match=r"sample 1 is NaN"):
        BucketBatchSampler(torch.tensor([1.0, float("nan")]), 2, num_replicas=1, rank=0)
    with pytest.raises(TypeError, match=r"not hashable"):
        BucketBatchSampler([[1, 2], [3, 4]], 2, num_replicas=1, rank=0)
    with pytest.raises(TypeError, match=r"DistributedSampler where the bucket keys belong.*BucketDataLoader"):
        BucketBatchSampler(DistributedSampler(range(4), num_replicas=1, rank=0), 2)
    with pytest.warns(UserWarning, match=r"policy='drop' leaves no batch per rank"):
        BucketBatchSampler([0, 0, 0], 2, num_replicas=2, rank=0, policy="drop")
    with pytest.raises(ValueError, match=r"bucket_ids\[1\] = 4 is outside \[0, 2\)"):
        torch.ops.torch_ext.bucket_plan(torch.tensor([0, 4], dtype=torch.int32), torch.tensor([1, 1]), 0, 0,
                                        True, "pad")


def test_ops_pass_opcheck():
    ids = torch.tensor([0, 1, 1, 0, 2], dtype=torch.int32)
    sizes = torch.tensor([2, 1, 3])
    for op, args in [(torch.ops.torch_ext.bucket_plan.default, (ids, sizes, 1, 2, True, "pad")),
                     (torch.ops.torch_ext.bucket_fingerprint.default, (ids, sizes))]:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration"))


def test_rank_sampler_view_is_a_distributed_sampler_that_follows_the_epoch():
    keys = skewed_keys(90)
    s = BucketBatchSampler(keys, BATCH, num_replicas=3, rank=2, seed=4)
    view = s.sampler
    assert isinstance(view, DistributedSampler)
    assert (view.num_replicas, view.rank) == (3, 2)
    view.set_epoch(5)
    assert s.epoch == 5
    flat = [i for b in s for i in b]
    assert list(view) == flat and len(view) == len(flat)


# ------------------------------------------------------------------ epoch_length


class _SplitStream(IterableDataset):
    """Sample i of rank r, worker w: the documented split of epoch_length."""

    def __init__(self, n, rank, world):
        self.n, self.rank, self.world = n, rank, world

    def __iter__(self):
        mine = list(range(self.n))[self.rank :: self.world]
        info = get_worker_info()
        if info is not None:
            mine = mine[info.id :: info.num_workers]
        return iter(mine)


@pytest.mark.parametrize("n,bs,world,workers", [(103, 4, 3, 0), (103, 4, 3, 2), (10, 3, 2, 2), (7, 8, 2, 0)])
@pytest.mark.parametrize("drop_last", [True, False])
def test_epoch_length_matches_real_dataloaders(n, bs, world, workers, drop_last):
    counts = []
    for r in range(world):
        loader = DataLoader(_SplitStream(n, r, world), batch_size=bs, num_workers=workers, drop_last=drop_last)
        counts.append(sum(1 for _ in loader))
    expected = min(counts) if drop_last else max(counts)
    assert epoch_length(n, bs, world, num_workers=workers, drop_last=drop_last) == expected


def test_epoch_length_errors():
    with pytest.raises(ValueError, match=r"batch_size=0 must be at least 1"):
        epoch_length(10, 0, 2)
    with pytest.raises(TypeError, match=r"world_size must be an int"):
        epoch_length(10, 2, 2.0)


# ------------------------------------------------------------------ multi-process scenarios


def sana_style_batches(keys, batch_size, num_replicas, rank, seed, epoch):
    """What Sana / PixArt style aspect-ratio samplers do: split samples per rank, then bucket per rank.

    A batch is emitted when a bucket of *this rank* fills up; each rank ends
    up with a different number of batches when its buckets fill differently.
    """
    sampler = DistributedSampler(range(len(keys)), num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    pending = collections.defaultdict(list)
    for i in sampler:
        bucket = pending[keys[i]]
        bucket.append(i)
        if len(bucket) == batch_size[keys[i]]:
            yield list(bucket)
            bucket.clear()


def _multiscale_ddp(rank, world, keys, epochs):
    features = torch.arange(len(keys), dtype=torch.float32).unsqueeze(1) / len(keys)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sampler = BucketBatchSampler(keys, BATCH, seed=7)  # num_replicas and rank from the process group
    sampler.check_consistent()
    loader = DataLoader(range(len(keys)), batch_sampler=sampler)
    out = {"ours": [], "sana_counts": []}
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        batches = []
        for idx in loader:
            batches.append(idx.tolist())
            loss = model(features[idx]).pow(2).mean()
            opt.zero_grad()
            loss.backward()  # an all_reduce per step: unequal counts would hang here
            opt.step()
        dist.barrier()
        out["ours"].append(batches)
        out["sana_counts"].append(sum(1 for _ in sana_style_batches(keys, BATCH, world, rank, 7, epoch)))
    return out


def test_multiscale_ddp_three_ranks_equal_counts_where_per_rank_bucketing_is_unequal():
    keys = skewed_keys(1000, seed=1)  # 1000 samples do not divide over 3 ranks
    world, epochs = 3, 2
    results = run_ranks(_multiscale_ddp, world, keys, epochs, backend="gloo", timeout=60)
    values = assert_all_ok(results)
    for epoch in range(epochs):
        sana = [v["sana_counts"][epoch] for v in values]
        assert len(set(sana)) > 1, f"per-rank bucketing should give unequal counts here, got {sana}"
        ours = [v["ours"][epoch] for v in values]
        assert len({len(b) for b in ours}) == 1, f"unequal counts {[len(b) for b in ours]}"
        for r in range(world):
            local = BucketBatchSampler(keys, BATCH, num_replicas=world, rank=r, seed=7)
            local.set_epoch(epoch)
            assert ours[r] == list(local), f"rank {r} epoch {epoch}: the process planned another epoch"
        covered = {i for batches in ours for b in batches for i in b}
        assert covered == set(range(len(keys)))
    assert values[0]["ours"][0] != values[0]["ours"][1], "epochs must differ"


def _inconsistent(rank, world):
    keys = skewed_keys(50, seed=rank)  # rank 1 built its bucket list from different data
    sampler = BucketBatchSampler(keys, BATCH)
    try:
        sampler.check_consistent()
    except ValueError as e:
        return str(e)
    return None


def test_check_consistent_names_the_rank_that_differs():
    results = run_ranks(_inconsistent, 2, backend="gloo", timeout=30)
    messages = assert_all_ok(results)
    assert all(m is not None for m in messages), report(results)
    assert "ranks [1] disagree with rank 0" in messages[0] and messages[0] == messages[1]
