"""Gradient compression (``Compression.none`` / ``Compression.fp16``) and reduce-op aliases.

A compressor follows Horovod's interface: ``compress(tensor) -> (tensor, ctx)`` and
``decompress(tensor, ctx) -> tensor``. The two built-in ones are also known by name to
``sdp_runtime._comm``, which applies them to whole fused buckets; a user-defined compressor is
applied tensor by tensor in TF around the allreduce.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from sdp_runtime import ReduceOp

# Horovod spells the ops as module-level constants (hvd.Average, hvd.Sum, ...).
Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX


class Compressor:
    """Interface for gradient compressors (Horovod's ``Compressor``).

    ``wire`` is the name ``_comm.allreduce_`` knows the compressor by; ``None`` means the
    compressor runs in TF, tensor by tensor.
    """

    wire: str | None = None

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        """Return the tensor to send and what :meth:`decompress` needs to undo it."""
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        """Undo :meth:`compress`."""
        return tensor


class NoneCompressor(Compressor):
    """Send tensors as they are."""

    wire = "none"


class FP16Compressor(Compressor):
    """Send float32/float64 tensors as float16, halving the bytes on the wire."""

    wire = "fp16"

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        if tensor.dtype in (tf.float32, tf.float64):
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    """The built-in compressors: ``Compression.none`` and ``Compression.fp16``.

    Example:
        >>> tape = sdp.DistributedGradientTape(tape, compression=sdp.Compression.fp16)
    """

    none = NoneCompressor
    fp16 = FP16Compressor


def resolve_op(op: ReduceOp | None, average: bool | None) -> ReduceOp:
    """Combine SMDDP's ``op=`` and Horovod's older ``average=`` into one ``ReduceOp``."""
    if average is not None:
        if op is not None:
            raise ValueError("pass either op= or average=, not both")
        return ReduceOp.AVERAGE if average else ReduceOp.SUM
    if op is None:
        return ReduceOp.AVERAGE
    if not isinstance(op, ReduceOp):
        raise NotImplementedError(
            f"reduce op {op!r} is not supported; use ReduceOp.AVERAGE, SUM, MIN or MAX"
        )
    return op
