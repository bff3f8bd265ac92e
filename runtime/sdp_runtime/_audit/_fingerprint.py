"""Cheap fingerprints of tensors, comparable across ranks (plain floats, JSON-ready)."""

from __future__ import annotations

import hashlib
from typing import Any

#: Values kept per tensor to compare and to say how far apart two ranks are.
SAMPLES = 32


def weights(t: Any) -> list[Any]:
    """``[sum, sum of |x|, [up to 32 strided values]]`` of a torch tensor, in float64."""
    flat = _flat(t)
    if flat.numel() == 0:
        return [0.0, 0.0, []]
    return [*_sums(flat), _strided(flat)]


def strided(t: Any) -> list[float]:
    """Up to 32 values of a torch tensor, evenly strided, in float64 (the rest is not read:
    cheap on a whole data set)."""
    flat = t.detach().reshape(-1)
    stride = max(1, flat.numel() // SAMPLES)
    return _flat(flat[::stride][:SAMPLES]).double().cpu().tolist()


def _strided(flat: Any) -> list[float]:
    stride = max(1, flat.numel() // SAMPLES)
    return flat[::stride][:SAMPLES].double().cpu().tolist()


def grads(t: Any) -> list[float]:
    """``[sum, sum of |x|]`` of a gradient (torch tensor), in float64."""
    if getattr(t, "is_sparse", False):
        t = t.coalesce().values()
    flat = _flat(t)
    if flat.numel() == 0:
        return [0.0, 0.0]
    return _sums(flat)


def _flat(t: Any) -> Any:
    import torch

    flat = t.detach().reshape(-1)
    if flat.is_complex():
        return flat.abs()
    if not flat.is_floating_point():
        return flat.to(torch.float64)
    return flat


def _sums(flat: Any) -> list[float]:
    """Sums accumulated in float64, without a float64 copy of the tensor."""
    import torch

    both = torch.stack([flat.sum(dtype=torch.float64),
                        flat.abs().sum(dtype=torch.float64)]).cpu().tolist()
    return [float(both[0]), float(both[1])]


def samples(t: Any) -> list[str]:
    """An 8-byte hash (hex) of each sample (row along the first dimension) of a torch tensor."""
    import torch

    x = t.detach()
    if x.dim() == 0 or x.shape[0] == 0:
        return []
    rows = x.cpu().contiguous().reshape(x.shape[0], -1)
    if rows.dtype == torch.bool:
        rows = rows.to(torch.uint8)
    raw = rows.view(torch.uint8) if rows.shape[1] else rows.to(torch.uint8)
    return sample_rows(raw.numpy())


def sample_rows(array: Any) -> list[str]:
    """An 8-byte hash (hex) of each sample (row along the first dimension) of a numpy array
    (strings too: a text batch)."""
    import numpy as np

    a = np.asarray(array)
    if a.ndim == 0 or a.shape[0] == 0:
        return []
    rows = np.ascontiguousarray(a).reshape(a.shape[0], -1)
    if rows.dtype == object:
        return [hashlib.blake2b(b"\0".join(x if isinstance(x, bytes) else str(x).encode()
                                            for x in row), digest_size=8).hexdigest()
                for row in rows]
    return [hashlib.blake2b(row.tobytes(), digest_size=8).hexdigest() for row in rows]
