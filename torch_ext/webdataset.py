"""Exact per-rank epoch lengths for WebDataset, and equal ones.

WebDataset splits *shards*, not samples: ``split_by_node`` gives rank ``r`` of
``W`` the shards ``urls[r::W]``, and ``split_by_worker`` gives DataLoader worker
``w`` of ``K`` the rank's shards ``[w::K]`` (webdataset 1.0 splits the URL list
in its given order, before any shard shuffling). When shards hold different
numbers of samples, or their count does not divide by ``W``, ranks get different
numbers of batches, and the rank with more batches waits forever in its next
collective (webdataset#225, #188).

Given the shard URLs and how many samples each holds (or counting them from
local tar files), this module computes the exact batches each rank gets under
that split, and sets ``with_epoch`` on the loader so every rank yields the same
count; ``with_length`` is set too, so ``len(loader)`` is known and Lightning's
progress bar shows a total instead of "?".

    from torch_ext.webdataset import count_samples, set_epoch_length
    counts = count_samples(urls)                      # or your own shard index
    dataset = wds.WebDataset(urls, nodesplitter=wds.split_by_node, shardshuffle=False)
    dataset = dataset.decode().to_tuple("cls").batched(16, partial=True)
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=2)
    set_epoch_length(loader, urls, counts, batch_size=16)   # every rank: same count

When the counts are unknown, use ``torch_ext.even_batches(loader)``, which ends
the epoch on every rank at the same step with one small collective per step.
Tested with webdataset 1.0.2.
"""
from __future__ import annotations

import dataclasses
import os
import re
import tarfile
from collections.abc import Sequence
from typing import Any

__all__ = [
    "ShardSplit",
    "count_samples",
    "expand_urls",
    "rank_batches",
    "set_epoch_length",
    "shard_split",
]

_POLICIES = ("drop", "pad")
# WebDataset skips tar members whose name starts with "__...__" (metadata).
_META = re.compile(r"__[^/]*__(?:/|$)")


def expand_urls(urls: str | Sequence[str]) -> list[str]:
    """The shard list WebDataset iterates: brace patterns (``shard-{000..009}.tar``) expanded."""
    if isinstance(urls, str):
        try:
            from webdataset.shardlists import expand_urls as wds_expand
        except ImportError:  # pragma: no cover - without webdataset, no brace expansion
            return [urls]
        return list(wds_expand(urls))
    return [str(u) for u in urls]


def _local_path(url: str) -> str:
    if url.startswith("file:"):
        url = url[len("file:") :]
        if url.startswith("//"):
            url = url[2:]
    if "://" in url or url.startswith("pipe:"):
        raise ValueError(
            f"count_samples can only read local tar files, not {url!r}: pass samples_per_shard from your shard "
            "index (e.g. the sizes recorded when the shards were written)"
        )
    return url


def _sample_key(name: str) -> str | None:
    """The sample a tar member belongs to, by WebDataset's naming rule, or None if it has none.

    A member ``dir/abc.seg.jpg`` belongs to sample ``dir/abc``: the name up to the
    first dot of the last path component. Names without such a dot, or with an
    empty stem, belong to no sample.
    """
    head, _, base = name.rpartition("/")
    stem, dot, _ = base.partition(".")
    if not dot or not stem:
        return None
    return f"{head}/{stem}" if head else stem


def count_samples(urls: str | Sequence[str]) -> list[int]:
    """Samples in each shard, read from the tar headers (the data is not read).

    Counts the way WebDataset groups tar members into samples: regular files,
    metadata members (``__...__``) skipped, consecutive members with the same key
    forming one sample. Local paths and ``file:`` URLs only.
    """
    counts = []
    for url in expand_urls(urls):
        path = _local_path(url)
        if not os.path.exists(path):
            raise FileNotFoundError(f"shard {url!r} does not exist (looked at {path!r})")
        n, previous = 0, None
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                if not member.isreg() or _META.match(member.name):
                    continue
                key = _sample_key(member.name)
                if key is None:
                    continue
                if key != previous:
                    n += 1
                    previous = key
        counts.append(n)
    return counts


def _world(world_size: int | None, group: Any = None) -> int:
    if world_size is not None:
        return int(world_size)
    try:
        from webdataset.utils import pytorch_worker_info
    except ImportError:  # pragma: no cover
        import torch.distributed as dist

        return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
    # The same source split_by_node reads (RANK/WORLD_SIZE, else the process group).
    return pytorch_worker_info(group=group)[1]


@dataclasses.dataclass(frozen=True)
class ShardSplit:
    """How ``split_by_node`` then ``split_by_worker`` distribute shards, and their samples.

    ``shards[r][w]`` are the shard indices worker ``w`` of rank ``r`` reads
    (one worker when ``num_workers`` is 0: the main process), ``samples[r][w]``
    how many samples those hold.
    """

    urls: tuple[str, ...]
    samples_per_shard: tuple[int, ...]
    world_size: int
    num_workers: int
    shards: tuple[tuple[tuple[int, ...], ...], ...]
    samples: tuple[tuple[int, ...], ...]

    @property
    def samples_per_rank(self) -> list[int]:
        return [sum(per_worker) for per_worker in self.samples]

    def batches_per_rank(self, batch_size: int, partial: bool = True, per_worker: bool = True) -> list[int]:
        """Batches each rank yields.

        ``partial``: whether a short last batch is kept (``batched(bs, partial=True)``,
        WebDataset's default; a DataLoader's ``drop_last=False``). ``per_worker``:
        batches are formed in each worker (``dataset.batched(...)`` or the
        DataLoader's ``batch_size``), so each worker has its own last batch;
        ``False`` when the loader re-batches the rank's whole stream
        (``loader.unbatched().batched(...)``).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1")

        def batches(n: int) -> int:
            return -(-n // batch_size) if partial else n // batch_size

        if per_worker:
            return [sum(batches(n) for n in per_worker_samples) for per_worker_samples in self.samples]
        return [batches(n) for n in self.samples_per_rank]


def shard_split(
    urls: str | Sequence[str],
    samples_per_shard: Sequence[int] | None = None,
    world_size: int | None = None,
    num_workers: int = 0,
) -> ShardSplit:
    """The shards and samples every rank and worker gets under ``split_by_node`` / ``split_by_worker``.

    ``samples_per_shard``: one count per URL; ``None`` counts them from the (local)
    tar files. ``world_size``: default as ``split_by_node`` finds it (RANK /
    WORLD_SIZE, else the default process group). Raises if a rank or a worker
    would get no shard: WebDataset then yields nothing there (or raises "No
    samples found"), and that rank cannot keep up with the others.
    """
    url_list = expand_urls(urls)
    counts = count_samples(url_list) if samples_per_shard is None else [int(c) for c in samples_per_shard]
    if len(counts) != len(url_list):
        raise ValueError(
            f"samples_per_shard has {len(counts)} counts for {len(url_list)} shards: give one count per shard, in "
            "the order of the URLs"
        )
    bad = [(u, c) for u, c in zip(url_list, counts) if c < 0]
    if bad:
        raise ValueError(f"negative sample counts {bad}: a shard holds zero or more samples")
    world = _world(world_size)
    if world < 1:
        raise ValueError(f"world_size={world} must be at least 1")
    if num_workers < 0:
        raise ValueError(f"num_workers={num_workers} must be at least 0")
    workers = max(num_workers, 1)
    if len(url_list) < world:
        raise ValueError(
            f"{len(url_list)} shards cannot feed {world} ranks: WebDataset splits whole shards, so "
            f"{world - len(url_list)} rank(s) would get none. Write the data into at least {world} shards"
        )
    if len(url_list) < world * workers:
        raise ValueError(
            f"{len(url_list)} shards cannot feed {world} ranks x {workers} DataLoader workers: WebDataset splits "
            f"whole shards, so some workers would get none. Use num_workers <= {len(url_list) // world}, or write "
            f"the data into at least {world * workers} shards"
        )
    shards, samples = [], []
    for r in range(world):
        mine = list(range(len(url_list)))[r::world]
        per_worker = [tuple(mine[w::workers]) for w in range(workers)]
        shards.append(tuple(per_worker))
        samples.append(tuple(sum(counts[s] for s in ws) for ws in per_worker))
    return ShardSplit(tuple(url_list), tuple(counts), world, num_workers, tuple(shards), tuple(samples))


def rank_batches(
    urls: str | Sequence[str],
    samples_per_shard: Sequence[int] | None,
    batch_size: int,
    world_size: int | None = None,
    num_workers: int = 0,
    partial: bool = True,
    per_worker: bool = True,
) -> list[int]:
    """The exact number of batches each rank gets under ``split_by_node`` / ``split_by_worker``.

    See :func:`shard_split` and :meth:`ShardSplit.batches_per_rank` for the arguments.
    """
    split = shard_split(urls, samples_per_shard, world_size, num_workers)
    return split.batches_per_rank(batch_size, partial=partial, per_worker=per_worker)


def set_epoch_length(
    loader: Any,
    urls: str | Sequence[str],
    samples_per_shard: Sequence[int] | None = None,
    *,
    batch_size: int,
    world_size: int | None = None,
    num_workers: int | None = None,
    partial: bool = True,
    per_worker: bool = True,
    policy: str = "drop",
) -> int:
    """Makes every rank's epoch the same number of batches; returns that number.

    ``loader``: the ``wds.WebLoader`` (or any WebDataset pipeline whose items are
    batches of one rank: with ``num_workers > 0`` that must be the loader, since
    ``with_epoch`` on the dataset counts per worker). ``num_workers``: default:
    the loader's. ``policy="drop"``: the epoch is the smallest rank's count; ranks
    with more stop early and no rank repeats a batch. ``policy="pad"``: the
    largest rank's count; ranks with fewer start their shards over to fill it, so
    every sample is seen at least once.

    Sets ``loader.with_epoch(n)`` (exactly ``n`` batches per iteration, restarting
    the rank's shards if they run out) and ``with_length(n)`` (``len(loader)``).
    """
    if policy not in _POLICIES:
        raise ValueError(f"policy={policy!r} is not a policy: use 'drop' (no repeats) or 'pad' (no sample left out)")
    if not hasattr(loader, "with_epoch"):
        raise TypeError(
            f"set_epoch_length needs a WebDataset pipeline (wds.WebLoader or wds.DataPipeline), got "
            f"{type(loader).__name__}"
        )
    inner = getattr(loader, "pipeline", [None])[0]
    loader_workers = getattr(inner, "num_workers", None)  # WebLoader wraps a DataLoader
    if num_workers is None:
        num_workers = loader_workers or 0
    elif loader_workers is not None and loader_workers != num_workers:
        raise ValueError(f"num_workers={num_workers} but the loader's DataLoader has num_workers={loader_workers}")
    if loader_workers is None and num_workers > 0:
        raise ValueError(
            f"with num_workers={num_workers}, set the epoch on the loader (wds.WebLoader), not on the dataset: "
            "with_epoch on a dataset counts the batches of each worker, not of the rank"
        )
    counts = rank_batches(urls, samples_per_shard, batch_size, world_size, num_workers, partial, per_worker)
    n = min(counts) if policy == "drop" else max(counts)
    if n == 0:
        raise ValueError(
            f"with batch_size={batch_size} and partial={partial}, some rank gets no batch (per-rank batches: "
            f"{counts}): use partial=True, a smaller batch size, or policy='pad'"
        )
    loader.with_epoch(n)
    if hasattr(loader, "with_length"):
        result = loader.with_length(n, silent=True)
        if result is not loader:  # pragma: no cover - webdataset returns the same object
            raise RuntimeError("with_length returned a new object; keep the loader it returns")
    return n
