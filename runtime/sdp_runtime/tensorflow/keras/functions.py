"""Horovod's Keras collectives, with its Keras signatures (``name`` second).

``horovod.tensorflow.keras.allreduce(value, name=None, average=None, ...)`` orders its arguments
differently from ``horovod.tensorflow.allreduce``; these take Keras's order and call the
TensorFlow package's functions.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from sdp_runtime.tensorflow.collectives import allreduce as _allreduce
from sdp_runtime.tensorflow.compression import Compression, Compressor, ReduceOp
from sdp_runtime.tensorflow.exchange import reducescatter as _reducescatter


def allreduce(
    value: Any,
    name: str | None = None,
    average: bool | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op: ReduceOp | None = None,
    compression: type[Compressor] = Compression.none,
) -> tf.Tensor:
    """Reduce a value (tensor, array or number) over all processes (Horovod's Keras signature).

    Arguments:
        value: the local value.
        name: accepted for Horovod compatibility, unused.
        average: Horovod's older switch (False means SUM); prefer ``op``.
        prescale_factor, postscale_factor: multiply by these before / after reducing.
        op: ``Average`` (default), ``Sum``, ``Min`` or ``Max``.
        compression: ``Compression.none`` or ``Compression.fp16``.

    Example:
        >>> mean_acc = sdp.allreduce(accuracy)
    """
    return _allreduce(tf.convert_to_tensor(value), compression=compression, op=op,
                      average=average, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor)


def reducescatter(value: Any, name: str | None = None, op: ReduceOp | None = None) -> tf.Tensor:
    """Reduce a value over all processes and return this process's block of rows.

    Arguments:
        value: the local value (at least one dimension).
        name: accepted for Horovod compatibility, unused.
        op: ``Average`` (default), ``Sum``, ``Min`` or ``Max``.

    Example:
        >>> block = sdp.reducescatter(values, op=sdp.Sum)
    """
    return _reducescatter(tf.convert_to_tensor(value), op=op)
