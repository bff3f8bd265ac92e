"""This rank's part of a list of examples (``shard``), for data no ``DistributedSampler`` reads.

A legacy torchtext ``Iterator``/``BucketIterator`` takes a ``Dataset`` whose ``examples`` list it
batches (and shuffles) itself; no sampler can be given to it. ``shard(dataset)`` gives it a copy
of the dataset holding every ``size()``-th example from this rank's on: ``ceil(n / size())``
examples on every rank, the first ones again at the end where ``n`` does not divide (as
``DistributedSampler`` pads), so every rank makes the same number of batches. The examples must be
in the same order on every rank (read from files or a pickle in order, not shuffled per process).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _comm

__all__ = ["shard"]


def shard(data: Any) -> Any:
    """Return this rank's part of ``data``, the same number of items on every rank.

    Arguments:
        data: a list or tuple (any sequence), or an object with an ``examples`` list (a
            torchtext ``Dataset``).

    Returns:
        A list of ``ceil(n / size())`` items (rank ``r`` gets items ``r``, ``r + size()``, ...,
        wrapping to the first items to fill the last place), or a shallow copy of the dataset
        with that list as its ``examples`` (the original is left as it is). Without ``init()``,
        or with one process, ``data`` itself.

    Example:
        >>> train_iterator = BucketIterator(sdp.shard(train), batch_size=64, train=True)
    """
    if not _comm.is_initialized() or _comm.size() == 1:
        return data
    if hasattr(data, "examples") and not isinstance(data, Sequence):
        # A shallow copy made by hand: torchtext's Dataset answers any missing attribute
        # (``__setstate__`` too) with a generator, which ``copy.copy`` would call.
        part = object.__new__(type(data))
        part.__dict__.update(vars(data))
        part.examples = _part(list(data.examples), _comm.size(), _comm.rank())
        return part
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        return _part(list(data), _comm.size(), _comm.rank())
    raise TypeError(
        f"sdp.shard takes a list of examples or a dataset with an `examples` list, not "
        f"{type(data).__name__}: give a DataLoader a DistributedSampler instead")


def _part(items: list, size: int, rank: int) -> list:
    if not items:
        return []
    per_rank = -(-len(items) // size)
    return [items[(rank + i * size) % len(items)] for i in range(per_rank)]
