"""Even batch counts by construction: the bucket batch sampler and epoch lengths.

Multi-scale (aspect-ratio bucket) training hangs when ranks bucket their own
shard of the data: each rank ends the epoch with a different number of batches,
and the rank with more batches waits forever in its next all_reduce. The
:class:`BucketBatchSampler` plans the epoch's batches *globally*, identically on
every rank from ``(seed, epoch)``, and deals them round-robin, so every rank
yields exactly the same number of batches without any communication.

:func:`epoch_length` gives the exact per-rank batch count of a stream split
across ranks and DataLoader workers (IterableDatasets have no reliable length
under DDP); :mod:`torch_ext.webdataset` does the same for WebDataset shards.

The planning core is C++ (``csrc/sampling/``), exposed as the ops
``torch.ops.torch_ext.bucket_plan``, ``bucket_deal`` and ``bucket_fingerprint``.
"""
from __future__ import annotations

import array
import numbers
import warnings
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any, Union

import torch
import torch.distributed as dist
from torch.utils.data import Sampler
from torch.utils.data.distributed import DistributedSampler

from torch_ext._objects import all_gather_objects

__all__ = ["BucketBatchSampler", "RankSamplerView", "epoch_length"]

_POLICIES = ("pad", "drop")
_STATE_VERSION = 1
_U64 = (1 << 64) - 1

BucketsArg = Union[Sequence[Hashable], torch.Tensor, Callable[[int], Hashable]]
BatchSizeArg = Union[int, Mapping[Hashable, int]]


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of one bucket each, the same number on every rank, planned globally.

    Args:
        buckets: the bucket key of every sample (aspect ratio, ``(height, width)``,
            resolution name...). Either a sequence with one key per sample (a list,
            a tensor or a numpy array; keys may be any hashable values), or a
            callable ``buckets(i) -> key`` called once per sample index
            ``i in range(num_samples)`` at construction (then pass
            ``num_samples``). Keys are mapped once to dense bucket ids, in sorted
            order when the keys can be sorted, else in order of first appearance.
        batch_size: one batch size for every bucket, or a mapping from bucket key
            to batch size (bigger batches for smaller images). The mapping must
            cover every key that occurs; extra keys are ignored.
        num_replicas: number of ranks; default: the default process group's size.
        rank: this rank; default: the default process group's rank.
        shuffle: shuffle samples within each bucket and the order of batches,
            differently each epoch (see :meth:`set_epoch`).
        seed: the seed of the plan; must be the same on every rank.
        policy: ``"pad"``: every sample is used at least once per epoch; each
            bucket's last batch may be short, and the last round is filled by
            repeating at most ``num_replicas - 1`` batches from the start of the
            epoch's order. ``"drop"``: every sample is used at most once; each
            bucket's remainder and the last partial round (at most
            ``num_replicas - 1`` batches) are left out.
        num_samples: the number of samples, required when ``buckets`` is a
            callable (and checked against ``len(buckets)`` otherwise).

    Every rank yields exactly ``len(self)`` batches, by construction: the plan of
    the epoch is the same on every rank (it depends only on the bucket keys,
    batch sizes, seed, epoch, shuffle and policy), and global batch ``k`` goes to
    rank ``k % num_replicas``. Planning 10M samples takes a fraction of a second
    in C++ and holds about 8 bytes per sample (see ``docs/performance.md``).

    ``batch_sizes`` lists the batch size of each bucket; ``batch_size`` is the size
    when every batch has it (one size, no short batch), else None: the way torch
    and Hugging Face Accelerate mark a batch sampler whose batches vary in length.

    Resuming: :meth:`state_dict` records the epoch, the seed and how many batches
    of the epoch's global order were consumed (by all ranks together);
    :meth:`load_state_dict` continues with the rest of the same plan, dealt to
    the current world size, which may differ from the one that saved it.

    Use it as a DataLoader's ``batch_sampler`` and call :meth:`set_epoch` before
    each epoch. In Lightning, wrap it in
    :class:`torch_ext.lightning.BucketDataLoader` (or set
    ``Trainer(use_distributed_sampler=False)``): see ``docs/uneven-data.md``.
    """

    def __init__(
        self,
        buckets: BucketsArg,
        batch_size: BatchSizeArg,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        policy: str = "pad",
        *,
        num_samples: int | None = None,
    ) -> None:
        if isinstance(buckets, Sampler):
            raise TypeError(
                f"BucketBatchSampler got a {type(buckets).__name__} where the bucket keys belong: it takes the "
                "bucket key of every sample and splits the batches across ranks itself, so it must not be "
                "re-created around a per-rank sampler (Lightning does that to batch samplers when "
                "use_distributed_sampler=True). Pass the keys; in Lightning wrap the sampler in "
                "torch_ext.lightning.BucketDataLoader(dataset, batch_sampler=...) or pass "
                "Trainer(use_distributed_sampler=False)."
            )
        if policy not in _POLICIES:
            raise ValueError(
                f"policy={policy!r} is not a policy: use 'pad' (every sample at least once, up to "
                "num_replicas - 1 repeated batches) or 'drop' (every sample at most once)"
            )
        self.num_replicas, self.rank = _resolve_world(num_replicas, rank)
        self.shuffle = bool(shuffle)
        self.seed = _check_seed(seed)
        self.policy = policy
        self.epoch = 0

        ids, keys = _dense_bucket_ids(buckets, num_samples)
        self._bucket_ids = ids
        self.bucket_keys: list[Hashable] = keys
        self.num_samples = int(ids.numel())
        self.batch_sizes: list[int] = _batch_sizes_for(batch_size, keys, ids)
        self._batch_sizes_t = torch.tensor(self.batch_sizes, dtype=torch.long)
        counts = torch.bincount(ids, minlength=len(keys)) if keys else torch.zeros(0, dtype=torch.long)
        self.bucket_counts: list[int] = counts.tolist()
        self.fingerprint = int(torch.ops.torch_ext.bucket_fingerprint(ids, self._batch_sizes_t)) & _U64
        self.num_batches = _count_batches(self.bucket_counts, self.batch_sizes, policy)
        # torch and Hugging Face Accelerate read a batch sampler's ``batch_size`` as "every
        # batch has this many samples" and None as "lengths vary": Accelerate's
        # BatchSamplerShard then deals batches of any length (with an int it skips every
        # round whose last batch is short, and a mapping breaks it).
        uniform = len(set(self.batch_sizes)) == 1
        full = policy == "drop" or all(c % b == 0 for c, b in zip(self.bucket_counts, self.batch_sizes))
        self.batch_size: int | None = self.batch_sizes[0] if uniform and full else None

        self._plan: tuple[int, int, torch.Tensor, torch.Tensor] | None = None
        self._resume: int | None = None  # global position for the next pass, from load_state_dict
        self._pass = 0  # id of the latest iterator; older iterators do not touch the counters
        self._pass_start = 0
        self._yielded = 0
        self._active = False  # an iterator was created and is not exhausted
        self._exhausted = False  # the latest iterator ran to the end
        self._view = RankSamplerView(self)

        if self.num_samples and _per_rank(self.num_batches, 0, self.num_replicas, policy) == 0:
            warnings.warn(
                f"BucketBatchSampler: policy='drop' leaves no batch per rank: the epoch has "
                f"{self.num_batches} full batches for {self.num_replicas} ranks. Use policy='pad' or smaller "
                "batch sizes.",
                stacklevel=2,
            )

    @property
    def sampler(self) -> "RankSamplerView":
        """The sample indices this rank gets, as a ``DistributedSampler``.

        ``set_epoch`` on it sets this sampler's epoch. Lightning calls
        ``dataloader.batch_sampler.sampler.set_epoch(epoch)`` before every epoch,
        so the plan advances without user code; and a DataLoader whose ``sampler``
        is this view (:class:`torch_ext.lightning.BucketDataLoader`) is recognised
        by Lightning as already distributed.
        """
        return self._view

    @property
    def num_buckets(self) -> int:
        return len(self.bucket_keys)

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch whose plan the next iteration yields.

        Setting the epoch the sampler already has keeps a position loaded with
        :meth:`load_state_dict` (Lightning calls ``set_epoch`` again on resume).
        """
        epoch = _check_int("epoch", epoch, minimum=0)
        if epoch != self.epoch:
            self.epoch = epoch
            self._resume = None
            self._detach_iterators()

    def _detach_iterators(self) -> None:
        # Iterators created before a new epoch or a loaded state keep yielding their
        # old plan but no longer count towards this sampler's position.
        self._pass += 1
        self._active = False
        self._exhausted = False
        self._pass_start = 0
        self._yielded = 0

    def __len__(self) -> int:
        """Batches this rank yields in the current pass (or the next one, if none is running)."""
        if self._active:
            start = self._pass_start
        elif self._resume is not None:
            start = self._resume
        else:
            start = 0
        return _per_rank(self.num_batches, start, self.num_replicas, self.policy)

    def __iter__(self) -> Iterator[list[int]]:
        order, offsets = self._plan_of_epoch()
        start = self._resume if self._resume is not None else 0
        self._resume = None
        deal = torch.ops.torch_ext.bucket_deal(self.num_batches, start, self.num_replicas, self.rank, self.policy)
        self._pass += 1
        self._pass_start = start
        self._yielded = 0
        self._active = True
        self._exhausted = False
        return self._batches(self._pass, order, offsets[deal].tolist(), offsets[deal + 1].tolist())

    def _batches(self, pass_id: int, order: torch.Tensor, starts: list[int], ends: list[int]) -> Iterator[list[int]]:
        for s, e in zip(starts, ends):
            if pass_id == self._pass:
                self._yielded += 1
            yield order[s:e].tolist()
        if pass_id == self._pass:
            self._active = False
            self._exhausted = True

    def _next_pass(self) -> torch.Tensor:
        """Global batch indices of this rank's next pass, without starting it."""
        start = self._resume if self._resume is not None else 0
        return torch.ops.torch_ext.bucket_deal(self.num_batches, start, self.num_replicas, self.rank, self.policy)

    def _plan_of_epoch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(order, batch offsets) of the current epoch, cached until the epoch or seed changes."""
        if self._plan is None or self._plan[:2] != (self.epoch, self.seed):
            self._plan = None  # free the previous epoch's plan before building the next
            order, offsets = torch.ops.torch_ext.bucket_plan(
                self._bucket_ids, self._batch_sizes_t, _as_int64(self.seed), self.epoch, self.shuffle, self.policy
            )
            self._plan = (self.epoch, self.seed, order, offsets)
        return self._plan[2], self._plan[3]

    def plan(self, epoch: int | None = None) -> list[list[int]]:
        """The epoch's global batch order (all ranks), as lists of sample indices.

        Rank ``r`` of ``W`` gets batches ``r, r + W, ...`` of it (continuing
        cyclically from the start under ``"pad"``). Meant for inspection and tests:
        it materialises every batch as Python lists.
        """
        epoch = self.epoch if epoch is None else _check_int("epoch", epoch, minimum=0)
        order, offsets = torch.ops.torch_ext.bucket_plan(
            self._bucket_ids, self._batch_sizes_t, _as_int64(self.seed), epoch, self.shuffle, self.policy
        )
        off = offsets.tolist()
        return [order[off[k] : off[k + 1]].tolist() for k in range(len(off) - 1)]

    def state_dict(self, *, consumed_batches: int | None = None) -> dict[str, Any]:
        """The position in the epoch, valid on any world size.

        ``consumed_batches``: the batches this rank has consumed from the current
        iteration. Default: the batches the sampler has handed out, which is exact
        when the consumer takes batches one at a time (a DataLoader with
        ``num_workers=0`` and no prefetching). A DataLoader with workers, or a
        trainer that prefetches, takes batches ahead of training: pass your
        training step count within the epoch instead.
        """
        consumed = self._consumed_global(consumed_batches)
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "seed": self.seed,
            "consumed_batches": consumed,
            "num_batches": self.num_batches,
            "num_samples": self.num_samples,
            "num_buckets": self.num_buckets,
            "batch_sizes": list(self.batch_sizes),
            "fingerprint": self.fingerprint,
            "shuffle": self.shuffle,
            "policy": self.policy,
            "num_replicas": self.num_replicas,
        }

    def _consumed_global(self, consumed_batches: int | None) -> int:
        if not self._active and not self._exhausted:
            return self._resume if self._resume is not None else 0
        if consumed_batches is None:
            if self._exhausted:
                return self.num_batches
            consumed_batches = self._yielded
        total = _per_rank(self.num_batches, self._pass_start, self.num_replicas, self.policy)
        consumed_batches = _check_int("consumed_batches", consumed_batches, minimum=0)
        if consumed_batches > total:
            raise ValueError(
                f"consumed_batches={consumed_batches} exceeds the {total} batches this rank gets in the current "
                "iteration: pass the number of batches this rank trained on since the iteration started"
            )
        if consumed_batches == total:
            return self.num_batches
        return min(self._pass_start + consumed_batches * self.num_replicas, self.num_batches)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continues the saved epoch from its saved position, on this sampler's world size.

        The sampler must be built over the same bucket keys, batch sizes, shuffle
        and policy as the one that saved the state; the saved seed and epoch are
        adopted. The next iteration yields the rest of the epoch's plan; then
        :meth:`set_epoch` moves on as usual.
        """
        missing = [k for k in ("version", "epoch", "seed", "consumed_batches", "num_samples", "fingerprint",
                               "batch_sizes", "shuffle", "policy") if k not in state_dict]
        if missing:
            raise ValueError(
                f"BucketBatchSampler.load_state_dict: the state has no {missing}; pass a dict made by "
                "BucketBatchSampler.state_dict()"
            )
        if state_dict["version"] != _STATE_VERSION:
            raise ValueError(
                f"BucketBatchSampler state version {state_dict['version']!r} is not supported (this torch_ext "
                f"reads version {_STATE_VERSION})"
            )
        fix = "build the sampler from the same dataset, bucket keys and batch_size as the run that saved it"
        if state_dict["num_samples"] != self.num_samples:
            raise ValueError(
                f"BucketBatchSampler.load_state_dict: the state was saved for {state_dict['num_samples']} samples, "
                f"this sampler has {self.num_samples}: it comes from another dataset; {fix}"
            )
        if state_dict["policy"] != self.policy or bool(state_dict["shuffle"]) != self.shuffle:
            raise ValueError(
                f"BucketBatchSampler.load_state_dict: the state was saved with policy={state_dict['policy']!r}, "
                f"shuffle={state_dict['shuffle']!r}, this sampler has policy={self.policy!r}, "
                f"shuffle={self.shuffle!r}: construct it with the saved values to continue that plan"
            )
        if list(state_dict["batch_sizes"]) != self.batch_sizes:
            raise ValueError(
                "BucketBatchSampler.load_state_dict: the state was saved with batch sizes "
                f"{list(state_dict['batch_sizes'])} per bucket, this sampler has {self.batch_sizes} for buckets "
                f"{self.bucket_keys}: use the same batch_size as the run that saved it"
            )
        if int(state_dict["fingerprint"]) & _U64 != self.fingerprint:
            raise ValueError(
                "BucketBatchSampler.load_state_dict: the state was saved for a different assignment of samples to "
                f"buckets (fingerprint {int(state_dict['fingerprint']) & _U64:#018x}, this sampler "
                f"{self.fingerprint:#018x}) over the same number of samples; {fix}"
            )
        consumed = _check_int("consumed_batches", state_dict["consumed_batches"], minimum=0)
        if consumed > self.num_batches:
            raise ValueError(
                f"BucketBatchSampler.load_state_dict: consumed_batches={consumed} exceeds the {self.num_batches} "
                f"batches of the epoch's plan; {fix}"
            )
        self.seed = _check_seed(state_dict["seed"])
        self.epoch = _check_int("epoch", state_dict["epoch"], minimum=0)
        self._resume = consumed
        self._detach_iterators()

    def check_consistent(self, group: Any = None) -> None:
        """Checks, with two small all_gathers, that every rank plans the same epoch.

        The plan needs no communication, but it silently diverges if ranks build
        the sampler from different data (a file list read in another order, a
        different seed). Call this once after construction to turn that into an
        error naming the ranks that differ.
        """
        mine = (self.fingerprint, self.num_samples, self.seed, self.epoch, self.num_replicas, self.policy,
                self.shuffle)
        world = dist.get_world_size(group)
        everyone = all_gather_objects(mine, group)
        if world != self.num_replicas:
            raise ValueError(
                f"BucketBatchSampler has num_replicas={self.num_replicas} but the process group has {world} ranks"
            )
        differ = [r for r, theirs in enumerate(everyone) if theirs != everyone[0]]
        if differ:
            names = ("fingerprint", "num_samples", "seed", "epoch", "num_replicas", "policy", "shuffle")
            lines = [f"rank {r}: " + ", ".join(f"{n}={v}" for n, v in zip(names, everyone[r])) for r in [0, *differ]]
            raise ValueError(
                f"BucketBatchSampler differs across ranks (ranks {differ} disagree with rank 0), so ranks would "
                "yield different batches:\n  " + "\n  ".join(lines) + "\nBuild it from the same bucket keys, "
                "batch_size, seed and policy on every rank."
            )

    def __repr__(self) -> str:
        return (
            f"BucketBatchSampler(num_samples={self.num_samples}, buckets={self.num_buckets}, "
            f"batches={self.num_batches}, per_rank={len(self)}, rank={self.rank}/{self.num_replicas}, "
            f"policy={self.policy!r}, shuffle={self.shuffle}, seed={self.seed}, epoch={self.epoch})"
        )


class RankSamplerView(DistributedSampler):
    """A :class:`BucketBatchSampler` seen as the ``DistributedSampler`` of its rank.

    Iterating yields the sample indices of the rank's next pass, flattened, without
    advancing the batch sampler; ``set_epoch`` forwards to it. It exists so that
    code which looks for a distributed sampler (Lightning's
    ``use_distributed_sampler``, its ``set_epoch`` calls) finds one that agrees
    with the batch sampler instead of adding another split on top.
    """

    def __init__(self, batch_sampler: BucketBatchSampler) -> None:  # noqa: D107 - no dataset to hand to super()
        self.batch_sampler = batch_sampler

    num_replicas = property(lambda self: self.batch_sampler.num_replicas)
    rank = property(lambda self: self.batch_sampler.rank)
    epoch = property(lambda self: self.batch_sampler.epoch)
    seed = property(lambda self: self.batch_sampler.seed)
    shuffle = property(lambda self: self.batch_sampler.shuffle)
    drop_last = property(lambda self: self.batch_sampler.policy == "drop")

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        order, offsets = self.batch_sampler._plan_of_epoch()
        deal = self.batch_sampler._next_pass()
        for s, e in zip(offsets[deal].tolist(), offsets[deal + 1].tolist()):
            yield from order[s:e].tolist()

    def __len__(self) -> int:
        _, offsets = self.batch_sampler._plan_of_epoch()
        deal = self.batch_sampler._next_pass()
        return int((offsets[deal + 1] - offsets[deal]).sum())

    @property
    def num_samples(self) -> int:  # DistributedSampler's name for the per-rank length
        return len(self)

    def __repr__(self) -> str:
        return f"RankSamplerView(rank={self.rank}/{self.num_replicas}, epoch={self.epoch})"


def epoch_length(
    num_samples: int,
    batch_size: int,
    world_size: int,
    num_workers: int = 0,
    drop_last: bool = True,
) -> int:
    """Batches per rank of a stream of ``num_samples`` split over ranks and workers.

    The samples are split as evenly as possible: each rank gets
    ``num_samples // world_size`` or one more, and within a rank each of
    ``num_workers`` DataLoader workers (``0``: the main process) gets its share
    likewise. A DataLoader batches each worker's stream separately, so each worker
    ends with its own short batch unless ``drop_last``.

    Returns the count every rank can be held to: with ``drop_last=True`` the
    smallest rank's count (every rank has that many full batches: cap each rank
    there, e.g. WebDataset's ``with_epoch``); with ``drop_last=False`` the largest
    (ranks with fewer batches must repeat or resample to reach it).
    """
    num_samples = _check_int("num_samples", num_samples, minimum=0)
    batch_size = _check_int("batch_size", batch_size, minimum=1)
    world_size = _check_int("world_size", world_size, minimum=1)
    num_workers = _check_int("num_workers", num_workers, minimum=0)
    workers = max(num_workers, 1)

    def batches(n: int) -> int:
        return n // batch_size if drop_last else -(-n // batch_size)

    per_rank = []
    for r in range(world_size):
        n_rank = num_samples // world_size + (r < num_samples % world_size)
        per_rank.append(sum(batches(n_rank // workers + (w < n_rank % workers)) for w in range(workers)))
    return min(per_rank) if drop_last else max(per_rank)


# --------------------------------------------------------------------------- helpers


def _per_rank(num_batches: int, consumed: int, num_replicas: int, policy: str) -> int:
    remaining = num_batches - consumed
    return remaining // num_replicas if policy == "drop" else -(-remaining // num_replicas)


def _count_batches(counts: list[int], batch_sizes: list[int], policy: str) -> int:
    if policy == "drop":
        return sum(c // b for c, b in zip(counts, batch_sizes))
    return sum(-(-c // b) for c, b in zip(counts, batch_sizes))


def _check_int(name: str, value: Any, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}={value} must be at least {minimum}")
    return value


def _check_seed(seed: Any) -> int:
    seed = _check_int("seed", seed)
    if not -(1 << 63) <= seed <= _U64:
        raise ValueError(f"seed={seed} does not fit in 64 bits")
    return seed


def _as_int64(value: int) -> int:
    value &= _U64
    return value - (1 << 64) if value >= 1 << 63 else value


def _resolve_world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    if num_replicas is None or rank is None:
        if not (dist.is_available() and dist.is_initialized()):
            missing = [n for n, v in (("num_replicas", num_replicas), ("rank", rank)) if v is None]
            raise ValueError(
                f"BucketBatchSampler: {' and '.join(missing)} not given and torch.distributed is not initialized: "
                "call init_process_group() before building the sampler, or pass num_replicas and rank "
                "(num_replicas=1, rank=0 for a single process)"
            )
        if num_replicas is None:
            num_replicas = dist.get_world_size()
        if rank is None:
            rank = dist.get_rank()
    num_replicas = _check_int("num_replicas", num_replicas, minimum=1)
    rank = _check_int("rank", rank, minimum=0)
    if rank >= num_replicas:
        raise ValueError(f"rank={rank} is outside [0, num_replicas={num_replicas})")
    return num_replicas, rank


def _dense_bucket_ids(buckets: BucketsArg, num_samples: int | None) -> tuple[torch.Tensor, list[Hashable]]:
    """Maps bucket keys to dense int32 ids; returns (ids, keys in id order)."""
    if callable(buckets) and not isinstance(buckets, (torch.Tensor, Sequence)):
        if num_samples is None:
            raise ValueError(
                "buckets is a callable, so the number of samples is unknown: pass num_samples=len(dataset)"
            )
        n = _check_int("num_samples", num_samples, minimum=0)
        keys_of = buckets
        buckets = [keys_of(i) for i in range(n)]
    elif num_samples is not None:
        n = _check_int("num_samples", num_samples, minimum=0)
        if len(buckets) != n:
            raise ValueError(f"num_samples={n} but buckets has {len(buckets)} keys: give one key per sample")

    fast = _dense_ids_vectorised(buckets)
    if fast is not None:
        return fast
    return _dense_ids_generic(buckets)


def _dense_ids_vectorised(buckets: Any) -> tuple[torch.Tensor, list[Hashable]] | None:
    """torch.unique over numeric/string keys held in a tensor, an array or a list."""
    values: torch.Tensor | None = None
    if isinstance(buckets, torch.Tensor):
        values = buckets.detach().cpu()
    else:
        try:
            import numpy as np
        except ImportError:  # torch's CPU wheel comes without numpy: the generic path below
            return None
        if isinstance(buckets, np.ndarray):
            arr = buckets
        elif isinstance(buckets, (list, tuple)) and buckets and isinstance(buckets[0], (int, float, tuple, str)):
            try:
                arr = np.asarray(buckets)
            except (ValueError, TypeError):
                return None
        else:
            return None
        if arr.dtype.kind == "U" and arr.ndim == 1:
            if not isinstance(buckets, np.ndarray) and not all(type(k) is str for k in buckets):
                return None  # numpy turned non-strings into strings: keep the keys' own types
            uniq, inverse = np.unique(arr, return_inverse=True)
            return torch.from_numpy(inverse.astype(np.int32).reshape(-1)), uniq.tolist()
        if arr.dtype.kind not in "biuf" or arr.ndim not in (1, 2):
            return None
        values = torch.from_numpy(np.ascontiguousarray(arr))
    if values.dim() not in (1, 2) or values.is_complex():
        raise ValueError(
            f"buckets as a tensor must be 1-D (one key per sample) or 2-D (one key row per sample, e.g. "
            f"(height, width)), got shape {tuple(values.shape)}"
        )
    if values.is_floating_point() and bool(torch.isnan(values).any()):
        bad = int(torch.isnan(values.reshape(values.shape[0], -1)).any(dim=1).nonzero()[0])
        raise ValueError(f"bucket key of sample {bad} is NaN: NaN keys cannot be grouped; give it a real key")
    if values.dim() == 1 and not values.is_floating_point() and values.numel():
        dense = _dense_ids_small_ints(values)
        if dense is not None:
            return dense
    if values.dim() == 1:
        uniq, inverse = torch.unique(values, sorted=True, return_inverse=True)
        keys: list[Hashable] = uniq.tolist()
    else:
        uniq, inverse = torch.unique(values, dim=0, sorted=True, return_inverse=True)
        keys = [tuple(row) for row in uniq.tolist()]
    return inverse.to(torch.int32).reshape(-1).contiguous(), keys


def _dense_ids_small_ints(values: torch.Tensor) -> tuple[torch.Tensor, list[Hashable]] | None:
    """Integer keys in a small non-negative range (bucket ids already): no sort, no int64 copy."""
    lo, hi = int(values.min()), int(values.max())
    if lo < 0 or hi >= max(1 << 16, values.numel()):
        return None
    present = torch.bincount(values.to(torch.int32) if values.dtype == torch.bool else values, minlength=hi + 1) > 0
    keys = present.nonzero().flatten().tolist()
    if values.dtype == torch.int32 and len(keys) == hi + 1:
        return values.contiguous(), keys  # already dense ids 0..B-1: keep them as they are
    remap = (present.cumsum(0) - 1).to(torch.int32)
    if values.dtype == torch.bool:
        keys = [bool(k) for k in keys]
    return remap[values.long() if values.dtype in (torch.bool, torch.uint8, torch.int8) else values], keys


def _dense_ids_generic(buckets: Any) -> tuple[torch.Tensor, list[Hashable]]:
    key_to_id: dict[Hashable, int] = {}
    ids = array.array("i")
    append = ids.append
    try:
        for key in buckets:
            i = key_to_id.get(key)
            if i is None:
                i = key_to_id[key] = len(key_to_id)
            append(i)
    except TypeError as e:
        raise TypeError(
            f"bucket key number {len(ids)} ({type(key).__name__}) is not hashable: bucket keys must be hashable, "
            f"e.g. a tuple instead of a list ({e})"
        ) from None
    keys = list(key_to_id)
    out = torch.frombuffer(ids, dtype=torch.int32).clone() if len(ids) else torch.zeros(0, dtype=torch.int32)
    try:
        sorted_keys = sorted(keys)
    except TypeError:
        return out, keys  # keys of mixed types: first-appearance order (the same on every rank)
    remap = torch.tensor([key_to_id[k] for k in sorted_keys], dtype=torch.long).argsort().to(torch.int32)
    return remap[out.long()].contiguous() if len(out) else out, sorted_keys


def _batch_sizes_for(batch_size: BatchSizeArg, keys: list[Hashable], ids: torch.Tensor) -> list[int]:
    if isinstance(batch_size, Mapping):
        sizes, missing = [], []
        for key in keys:
            try:
                sizes.append(batch_size[key])
            except KeyError:
                missing.append(key)
        if missing:
            counts = torch.bincount(ids, minlength=len(keys)).tolist()
            detail = ", ".join(f"{k!r} ({counts[keys.index(k)]} samples)" for k in missing[:10])
            more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
            raise ValueError(
                f"batch_size has no entry for bucket(s) {detail}{more}: add them to the mapping "
                f"(its keys: {list(batch_size)[:10]}), or pass one int for every bucket"
            )
        for key, size in zip(keys, sizes):
            _check_batch_size(size, f"batch_size[{key!r}]")
        return [int(s) for s in sizes]
    _check_batch_size(batch_size, "batch_size")
    return [int(batch_size)] * len(keys)


def _check_batch_size(size: Any, name: str) -> None:
    size = _check_int(name, size)
    if size < 1:
        raise ValueError(f"{name}={size}: a batch size must be at least 1")

