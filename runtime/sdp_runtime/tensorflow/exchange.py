"""Collectives that move rows between processes: alltoall, reducescatter, grouped_allgather.

Horovod's TF functions of these names, computed by the PyTorch package's (one implementation:
``sdp_runtime.torch.collectives``) on DLPack views of the TF tensors, in eager mode and inside a
``tf.function`` (one ``tf.py_function`` per call). Not differentiable in TF.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
import torch

from sdp_runtime._compat import check_process_set
from sdp_runtime.tensorflow.bridge import tf_to_torch, torch_to_tf
from sdp_runtime.tensorflow.collectives import (
    _check_dtype,
    _refuse_xla,
    allgather,
    py_collective,
)
from sdp_runtime.tensorflow.compression import Compression, Compressor, ReduceOp, resolve_op
from sdp_runtime.torch import collectives as torch_collectives


def _call(fn: Callable[..., Any], tensors: Sequence[tf.Tensor], name: str,
          shapes: Sequence[tf.TensorShape]) -> list[tf.Tensor]:
    """Run ``fn`` (torch tensors in, one torch tensor out per input) eagerly or in a
    py_function."""

    def eager(*ins: tf.Tensor) -> list[tf.Tensor]:
        outs = fn(*[tf_to_torch(t) for t in ins])
        return [torch_to_tf(o.contiguous()) for o in outs]

    if tf.executing_eagerly():
        return eager(*tensors)
    _refuse_xla()
    outs = py_collective(eager, list(tensors), [t.dtype for t in tensors], name)
    for out, shape in zip(outs, shapes, strict=True):
        out.set_shape(shape)
    return list(outs)


def grouped_allgather(tensors: Sequence[Any], name: str | None = None,
                      process_set: Any = None) -> list[tf.Tensor]:
    """``allgather`` of each tensor, in order.

    Arguments:
        tensors: tensors or variables.
        name: accepted for Horovod compatibility, unused.
        process_set: None or ``global_process_set``.

    Example:
        >>> preds, labels = sdp.grouped_allgather([preds, labels])
    """
    check_process_set(process_set, "grouped_allgather")
    return [allgather(t) for t in tensors]


def alltoall(tensor: Any, splits: Any = None, name: str | None = None,
             ignore_name_scope: bool = False, process_set: Any = None) -> Any:
    """Send block ``i`` of ``tensor``'s rows to process ``i``; return the rows received.

    Arguments:
        tensor: the rows to send (other dimensions equal on every process).
        splits: rows for each process (one per process); default: equal blocks.
        name, ignore_name_scope: accepted for Horovod compatibility, unused.
        process_set: None or ``global_process_set``.

    Returns:
        The received rows in rank order of their sender; with ``splits``, also an int32 tensor of
        how many rows came from each process.

    Example:
        >>> rows, received = sdp.alltoall(rows, splits=[2, 1])
    """
    check_process_set(process_set, "alltoall")
    tensor = tf.convert_to_tensor(tensor)
    _check_dtype(tensor.dtype)
    if splits is None:
        shape = tf.TensorShape([None]).concatenate(tensor.shape[1:])
        (out,) = _call(lambda t: [torch_collectives.alltoall(t)], [tensor], "sdp_alltoall", [shape])
        return out
    splits = tf.cast(tf.convert_to_tensor(splits), tf.int64)

    def eager(*ins: tf.Tensor) -> list[tf.Tensor]:
        out, counts = torch_collectives.alltoall(tf_to_torch(ins[0]), ins[1].numpy().tolist())
        return [torch_to_tf(out.contiguous()), tf.constant(counts.numpy(), tf.int32)]

    if tf.executing_eagerly():
        return tuple(eager(tensor, splits))
    _refuse_xla()
    out, counts = py_collective(eager, [tensor, splits], [tensor.dtype, tf.int32], "sdp_alltoall")
    out.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
    counts.set_shape([None])
    return out, counts


def grouped_reducescatter(
    tensors: Sequence[Any],
    device_dense: str = "",
    compression: type[Compressor] = Compression.none,
    op: ReduceOp | None = None,
    name: str | None = None,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[tf.Tensor]:
    """Reduce each tensor over all processes and give each process its block of rows.

    The first dimension is cut in ``size()`` blocks, the first ``rows % size()`` one row longer;
    process ``r`` gets block ``r``. All tensors are reduced in one fused collective.

    Arguments:
        tensors: tensors or variables, the same shapes on every process.
        device_dense, name: accepted for Horovod compatibility, unused.
        compression: ``Compression.none`` or ``Compression.fp16``.
        op: ``ReduceOp.AVERAGE`` (default), ``SUM``, ``MIN`` or ``MAX``.
        process_set: None or ``global_process_set``.
        prescale_factor, postscale_factor: multiply by these before / after reducing.

    Example:
        >>> a, b = sdp.grouped_reducescatter([a, b], op=sdp.Sum)
    """
    check_process_set(process_set, "grouped_reducescatter")
    values = [tf.convert_to_tensor(t) for t in tensors]
    for t in values:
        _check_dtype(t.dtype)
        if t.shape.rank == 0:
            raise ValueError("reducescatter needs tensors with at least one dimension")
    reduce_op = resolve_op(op, None)
    wire = compression.wire or "none"

    def work(*ins: torch.Tensor) -> list[torch.Tensor]:
        return torch_collectives.grouped_reducescatter(
            list(ins), compression=wire, op=reduce_op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor)

    if not values:
        return []
    shapes = [tf.TensorShape([None]).concatenate(t.shape[1:]) for t in values]
    return _call(work, values, "sdp_reducescatter", shapes)


def reducescatter(
    tensor: Any,
    device_dense: str = "",
    compression: type[Compressor] = Compression.none,
    op: ReduceOp | None = None,
    name: str | None = None,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> tf.Tensor:
    """Reduce ``tensor`` over all processes and return this process's block of rows.

    Arguments:
        tensor: a tensor or variable, the same shape on every process.
        device_dense, compression, op, name, process_set, prescale_factor, postscale_factor:
            as in :func:`grouped_reducescatter`.

    Example:
        >>> block = sdp.reducescatter(tensor, op=sdp.Sum)
    """
    check_process_set(process_set, "reducescatter")
    return grouped_reducescatter([tensor], device_dense, compression, op, name, None,
                                 prescale_factor, postscale_factor)[0]
