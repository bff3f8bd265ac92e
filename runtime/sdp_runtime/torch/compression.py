"""Gradient compression for the wire, with Horovod's names (``Compression.none`` / ``.fp16``).

Built-in compressors are applied inside the fused collective (``_comm``), so they cost one cast per
bucket rather than one per tensor. A user-written compressor (a class with Horovod's
``compress``/``decompress`` static methods) also works with the functions that take one: its
``compress`` runs before the collective and ``decompress`` after.
"""

from __future__ import annotations

from typing import Any

import torch


class Compressor:
    """Interface of a compressor (Horovod's ``horovod.torch.compression.Compressor``)."""

    #: the name ``_comm`` knows it by, or None for a compressor it cannot apply itself
    wire: str | None = None

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Return the tensor to send and what ``decompress`` needs to undo it."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Undo ``compress``."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Send tensors as they are."""

    wire = "none"

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Send float32/float64 tensors as float16, halving the bytes on the wire."""

    wire = "fp16"

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if tensor.dtype in (torch.float32, torch.float64):
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """The compressors, as ``Compression.none`` and ``Compression.fp16`` (Horovod's spelling)."""

    none = NoneCompressor
    fp16 = FP16Compressor


def wire_name(compression: Any) -> str | None:
    """The ``_comm`` name of ``compression`` (a compressor, ``"fp16"``, ``None``), else None.

    Example:
        >>> wire_name(Compression.fp16)
        'fp16'
    """
    if compression is None:
        return "none"
    if isinstance(compression, str):
        name = compression.lower()
        if name not in ("none", "fp16"):
            raise ValueError(f"unknown compression {compression!r}; use Compression.none or .fp16")
        return name
    wire = getattr(compression, "wire", None)
    usable = hasattr(compression, "compress") and hasattr(compression, "decompress")
    if wire is None and not usable:
        raise TypeError(f"{compression!r} is not a compressor (no compress/decompress methods)")
    return wire
