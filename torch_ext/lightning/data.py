"""DataLoaders that Lightning leaves alone: already distributed, equal batch counts.

Lightning (``Trainer(use_distributed_sampler=True)``, the default) checks every
training DataLoader: unless its ``sampler`` is a ``DistributedSampler``, it
builds a ``DistributedSampler`` and re-creates the DataLoader around it, and a
custom batch sampler is re-created as ``cls(sampler, batch_size=...,
drop_last=...)`` or rejected. For a bucket sampler either outcome is wrong: the
per-rank split would be done twice, or batch counts would differ per rank.

:class:`BucketDataLoader` is a plain ``torch.utils.data.DataLoader`` whose
``sampler`` is the :class:`~torch_ext.samplers.RankSamplerView` of its
:class:`~torch_ext.BucketBatchSampler`: Lightning sees a distributed sampler,
keeps the loader as it is, and calls ``set_epoch`` on it before every epoch
(which advances the bucket sampler's plan).

This module does not import Lightning; it only speaks the protocol Lightning
checks (lightning 2.6: ``DataConnector._requires_distributed_sampler`` and
``lightning.fabric.utilities.data._set_sampler_epoch``).
"""
from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, Dataset

from torch_ext.samplers import BucketBatchSampler, RankSamplerView

__all__ = ["BucketDataLoader"]


def _find_bucket_sampler(batch_sampler: Any) -> BucketBatchSampler | None:
    # Lightning wraps batch samplers for prediction (_IndexBatchSamplerWrapper keeps
    # the original as `_batch_sampler`); look through such wrappers.
    seen = 0
    while batch_sampler is not None and seen < 8:
        if isinstance(batch_sampler, BucketBatchSampler):
            return batch_sampler
        batch_sampler = getattr(batch_sampler, "_batch_sampler", None)
        seen += 1
    return None


class BucketDataLoader(DataLoader):
    """A DataLoader over a :class:`~torch_ext.BucketBatchSampler` that frameworks see as distributed.

    ``BucketDataLoader(dataset, batch_sampler=sampler, num_workers=..., ...)``
    takes the DataLoader arguments except ``sampler``, ``batch_size``,
    ``shuffle`` and ``drop_last`` (the batch sampler decides those). Its
    ``sampler`` attribute is ``batch_sampler.sampler``, a ``DistributedSampler``
    view of this rank's indices, so Lightning with ``use_distributed_sampler=True``
    does not re-wrap it, and calls its ``set_epoch`` every epoch.
    """

    def __init__(self, dataset: Dataset, batch_sampler: Any, **kwargs: Any) -> None:
        bucket = _find_bucket_sampler(batch_sampler)
        if bucket is None:
            raise TypeError(
                f"BucketDataLoader needs a torch_ext.BucketBatchSampler as batch_sampler, got "
                f"{type(batch_sampler).__name__}; for other batch samplers use torch.utils.data.DataLoader"
            )
        for name in ("sampler", "batch_size", "shuffle", "drop_last"):
            # Lightning passes the defaults back when it re-creates the loader; anything else is a mistake.
            value = kwargs.pop(name, None)
            if value not in (None, False, 1):
                raise ValueError(
                    f"BucketDataLoader: {name}={value!r} conflicts with the batch sampler, which decides the "
                    "samples, batch sizes and order; set them on the BucketBatchSampler instead"
                )
        self._bucket_view: RankSamplerView = bucket.sampler
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)

    # DataLoader.__init__ assigns its default SequentialSampler to `sampler`; the
    # property keeps the view instead. (After __init__, DataLoader forbids the
    # assignment anyway.)
    @property
    def sampler(self) -> RankSamplerView:  # type: ignore[override]
        return self._bucket_view

    @sampler.setter
    def sampler(self, value: Any) -> None:
        pass

    @property
    def bucket_sampler(self) -> BucketBatchSampler:
        """The BucketBatchSampler behind this loader (for ``state_dict``, ``set_epoch``)."""
        return self._bucket_view.batch_sampler
