"""Flat torch buffers for fused collectives, reused once TF no longer holds views of them.

Results go back to TF as zero-copy views of the flat buffer they were reduced in, so a buffer
can only be reused when every TF tensor viewing it is gone. torch counts the references to a
buffer's storage (DLPack and NumPy views included), which tells exactly that. Reusing matters:
a fresh 100 MB buffer costs 40-60 ms in page faults, a reused one none.
"""

from __future__ import annotations

import threading

import torch

#: Buffers kept per (dtype, device); beyond that, buffers TF still holds are forgotten first.
MAX_BUFFERS = 4

_pool: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
lock = threading.RLock()
_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _free(buf: torch.Tensor) -> bool:
    if _use_count is None:  # cannot tell: never reuse
        return False
    # The pool's tensor and the temporary storage handle below are two references; any other
    # is a view handed to TF by an earlier call and still alive.
    return _use_count(buf.untyped_storage()._cdata) <= 2


def flat_buffer(dtype: torch.dtype, device: torch.device, numel: int) -> torch.Tensor:
    """Return a 1-D tensor of ``numel`` elements nobody else uses; hold :data:`lock` while using it.

    Arguments:
        dtype, device: of the buffer.
        numel: number of elements needed.

    Example:
        >>> with lock:
        ...     flat = flat_buffer(torch.float32, torch.device("cpu"), 1024)
    """
    buffers = _pool.setdefault((dtype, device), [])
    fits = [b for b in buffers if b.numel() >= numel and _free(b)]
    if fits:
        return min(fits, key=torch.Tensor.numel)[:numel]
    buf = torch.empty(numel, dtype=dtype, device=device)
    buffers.append(buf)
    if len(buffers) > MAX_BUFFERS:
        # Forget a buffer TF still holds (it keeps it alive), else the smallest free one.
        others = [i for i, b in enumerate(buffers) if b is not buf]
        held = [i for i in others if not _free(buffers[i])]
        del buffers[held[0] if held else min(others, key=lambda i: buffers[i].numel())]
    return buf[:numel]  # a view: while it lives, the buffer counts as used


def clear() -> None:
    """Drop every cached buffer (views TF still holds stay valid)."""
    with lock:
        _pool.clear()
