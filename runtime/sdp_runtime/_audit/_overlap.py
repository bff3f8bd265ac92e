"""How much of the training data more than one rank read: over the first epoch where the
DataLoaders' records allow it, else over the first steps.

A PyTorch DataLoader that trained (an optimizer stepped right after one of its batches) records
the indices of its first pass, mapped through ``Subset``\\ s to the data set below (a bitmap),
and, for its first K batches, each sample's index and a hash of it. The loaders of the ranks are
matched by the line that made them. Their index sets are compared when the ranks' data sets are
shown to hold the same samples: the same type and length, and the same content fingerprint (a
TensorDataset's tensors, a data set's ``data``/``targets``/``samples``), or, without one, the
same hash at every index two ranks both hashed (at least one). A pass cut short by the end of
the job counts the indices its sampler would read when the sampler says so without being run
(SequentialSampler, RandomSampler without replacement, SubsetRandomSampler), else the part read.
A sampler that draws with replacement overlaps by chance: its overlap is not a defect (identical
draws are, and give identical gradients).

Otherwise (an IterableDataset, data sets that differ per rank, random augmentation, tf.data
under Keras ``fit``), the hashes of the samples of the first K batches are compared, up to the
step before any rank meets a sample of its own again (from then on a shuffling sampler hands
the ranks each other's samples of the last epoch, by design).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class Overlap:
    fraction: float
    shared: int  # samples read by more than one rank
    total: int  # distinct samples read
    scope: str  # "epoch" (read), "planned" (from the sampler) or "first steps"
    loader: dict[str, Any] | None  # the lowest rank's record of the loader, if any
    whole: bool = False  # every rank read every sample of the data set
    same_order: bool = False  # and their first batches were the same


def measure(by_rank: Mapping[int, list[dict[str, Any]]],
            loaders: Mapping[int, list[dict[str, Any]]]) -> Overlap | None:
    """The largest overlap among the training loaders (else among ``inputs`` records).

    Example:
        >>> measure(by_rank, script.loaders).fraction
        1.0
    """
    found = [o for o in (_group(group) for group in _groups(loaders)) if o is not None]
    # A loader drawing with replacement overlaps by chance: another loader's overlap first.
    best = [o for o in found if not drawn_with_replacement(o)] or found
    if best:
        return max(best, key=lambda o: (o.fraction, o.shared))
    steps = {r: sorted((int(x["step"]), x.get("samples", [])) for x in recs
                       if x.get("kind") == "inputs") for r, recs in by_rank.items()}
    return window({r: s for r, s in steps.items() if s}, None)


def drawn_with_replacement(overlap: Overlap) -> bool:
    """Whether the overlap is that of a sampler drawing with replacement on every rank: ranks
    drawing independently meet some of the same samples by chance (only identical draws, which
    give identical gradients, are a defect)."""
    return bool(overlap.loader and overlap.loader.get("replacement"))


def _groups(loaders: Mapping[int, list[dict[str, Any]]]) -> list[dict[int, dict[str, Any]]]:
    """The same loader on each rank (made by the same line, n-th of that line), when it
    trained on some rank."""
    groups: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for rank, recs in loaders.items():
        count: dict[str, int] = {}
        for rec in sorted(recs, key=lambda x: int(x.get("loader", 0))):
            where = str(rec.get("where"))
            n = count[where] = count.get(where, 0) + 1
            groups.setdefault((where, n), {})[rank] = rec
    return [g for g in groups.values() if len(g) > 1 and any(r.get("trained") for r in g.values())]


def _group(group: dict[int, dict[str, Any]]) -> Overlap | None:
    # Ranks whose samplers say they are the same data-parallel replica (a DistributedSampler
    # with num_replicas = the data-parallel size, under model parallelism: the ranks of one
    # replica read the same batches by design) count once.
    replicas = [(rec.get("replicas"), rec.get("replica")) for rec in group.values()]
    if all(isinstance(n, int) and isinstance(i, int) for n, i in replicas):
        one: dict[tuple[Any, Any], int] = {}
        for rank, key in zip(group, replicas, strict=True):
            one.setdefault(key, rank)
        group = {r: group[r] for r in sorted(one.values())}
        if len(group) < 2:
            return None
    first = group[min(group)]
    sets = {r: _decode(rec.get("epoch")) for r, rec in group.items()}
    if all(s is not None for s in sets.values()) and _same_data_set(list(group.values())):
        seen = shared = 0  # bitmaps: bit i is sample i
        for s in sets.values():
            shared |= seen & s  # type: ignore[operator]
            seen |= s  # type: ignore[operator]
        total = seen.bit_count()
        if not total:
            return None
        length = first.get("len")
        whole = isinstance(length, int) and all(
            s.bit_count() == length for s in sets.values())  # type: ignore[union-attr]
        planned = any((rec.get("epoch") or {}).get("how") == "planned" for rec in group.values())
        firsts = [json.dumps((rec.get("first") or [None])[0]) for rec in group.values()]
        return Overlap(shared.bit_count() / total, shared.bit_count(), total,
                       "planned" if planned else "epoch", first, whole, len(set(firsts)) == 1)
    steps = {r: [(b + 1, [h for _, h in batch]) for b, batch in enumerate(rec.get("first") or [])]
             for r, rec in group.items()}
    return window(steps, first)


def _decode(epoch: Mapping[str, Any] | None) -> int | None:
    """The indices of a pass as a bitmap (an int: bit i is sample i)."""
    if not epoch:
        return None
    if "list" in epoch:
        indices = [int(i) for i in epoch["list"]]
        if indices and (min(indices) < 0 or max(indices) >= 1 << 27):
            return None  # not positions in a data set
        raw = bytearray(max(indices, default=0) // 8 + 1)
        for i in indices:
            raw[i >> 3] |= 1 << (i & 7)
        return int.from_bytes(raw, "little")
    return int.from_bytes(base64.b64decode(epoch.get("bits", "")), "little")


def _same_data_set(recs: list[dict[str, Any]]) -> bool:
    """Whether the ranks' loaders read the same samples under the same indices."""
    if len({(r.get("dataset"), r.get("len")) for r in recs}) > 1:
        return False
    contents = [r.get("content") for r in recs]
    hashed = [{i: h for batch in r.get("first") or [] for i, h in batch if i is not None}
              for r in recs]
    agree = disagree = 0
    for a, one in enumerate(hashed):
        for other in hashed[a + 1:]:
            for i in one.keys() & other.keys():
                if one[i] == other[i]:
                    agree += 1
                else:
                    disagree += 1
    if all(c is not None for c in contents):
        # The same tensors below, but a data set of the script's may map its indices onto them
        # differently on each rank (``SplitDataset(...).select(rank)``): the samples read at
        # the same index must agree too.
        return len(set(contents)) == 1 and disagree == 0
    return agree > 0 and disagree == 0


def window(steps: Mapping[int, list[tuple[int, list[str]]]],
           loader: dict[str, Any] | None) -> Overlap | None:
    """The samples seen by more than one rank in the first steps of the first epoch: up to the
    step before any rank meets a sample of its own again."""
    limit = None
    for rank_steps in steps.values():
        own: set[str] = set()
        last = None
        for step, hashes in rank_steps:
            if own & set(hashes):
                break
            own.update(hashes)
            last = step
        if rank_steps and last is not None:
            limit = last if limit is None else min(limit, last)
    if limit is None:
        return None
    seen: dict[str, set[int]] = {}
    for r, rank_steps in steps.items():
        for step, hashes in rank_steps:
            if step <= limit:
                for h in hashes:
                    seen.setdefault(h, set()).add(r)
    if not seen or len({r for rs in seen.values() for r in rs}) < 2:
        return None
    shared = sum(1 for rs in seen.values() if len(rs) > 1)
    return Overlap(shared / len(seen), shared, len(seen), "first steps", loader)
