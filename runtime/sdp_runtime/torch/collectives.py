"""Tensor collectives with Horovod's names and signatures (``hvd.allreduce`` and friends).

``name`` and ``process_set`` arguments are accepted for compatibility and ignored: collectives
are matched by order, in one global group. ``*_async`` functions run at once and return a handle
that ``synchronize`` turns into the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .. import _comm
from .._types import ReduceOp
from .compression import Compression, wire_name

Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX


def resolve_op(average: bool | None, op: ReduceOp | str | None) -> ReduceOp:
    """Horovod's rule: ``op`` wins; else ``average=False`` means SUM; the default is AVERAGE.

    Example:
        >>> resolve_op(False, None)
        <ReduceOp.SUM: 'sum'>
    """
    if op is not None and average is not None:
        raise ValueError("give either op= or the older average=, not both")
    if op is None:
        return ReduceOp.SUM if average is False else ReduceOp.AVERAGE
    return ReduceOp.parse(op)


def reduce_in_place(
    tensors: Sequence[torch.Tensor],
    op: ReduceOp,
    compression: Any = Compression.none,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> None:
    """Allreduce ``tensors`` in place, fused, with scaling and any compressor (shared helper).

    Example:
        >>> reduce_in_place([p.grad for p in model.parameters()], Average)
    """
    tensors = list(tensors)
    wire = wire_name(compression)
    with torch.no_grad():
        _scale(tensors, prescale_factor)
        if wire is not None:
            _comm.allreduce_(tensors, op, wire)
        else:  # a user's compressor: compress each tensor, reduce what it returns, undo
            packed = [compression.compress(t) for t in tensors]
            _comm.allreduce_([c for c, _ in packed], op, "none")
            for t, (c, ctx) in zip(tensors, packed, strict=True):
                t.copy_(compression.decompress(c, ctx))
        _scale(tensors, postscale_factor)


def _scale(tensors: list[torch.Tensor], factor: float) -> None:
    if factor != 1.0:
        for t in tensors:
            t.mul_(factor)


class _Allreduce(torch.autograd.Function):
    """Differentiable allreduce: the gradient is reduced the same way (as in Horovod)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, *args: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.args = args
        out = tensor.detach().clone()
        reduce_in_place([out], *args)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        out = grad.detach().clone()
        reduce_in_place([out], *ctx.args)
        return (out, *([None] * len(ctx.args)))


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: ReduceOp | str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
) -> torch.Tensor:
    """Return ``tensor`` reduced over all processes (a new tensor; differentiable).

    Arguments:
        tensor: the local value.
        average: Horovod's older switch (False means SUM); prefer ``op``.
        name: ignored.
        compression: ``Compression.none`` or ``Compression.fp16`` (or a custom compressor).
        op: ``Average`` (default), ``Sum``, ``Min`` or ``Max``.
        prescale_factor: multiply by this before reducing.
        postscale_factor: multiply by this after reducing.
        process_set: ignored (one global set).

    Example:
        >>> mean_loss = sdp.allreduce(loss.detach(), op=sdp.Average)
    """
    args = (resolve_op(average, op), compression, prescale_factor, postscale_factor)
    if tensor.requires_grad and torch.is_grad_enabled():
        return _Allreduce.apply(tensor, *args)
    out = tensor.detach().clone()
    reduce_in_place([out], *args)
    return out


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    compression: Any = Compression.none,
) -> torch.Tensor:
    """Reduce ``tensor`` over all processes in place and return it.

    Arguments:
        tensor: the local value, overwritten with the result.
        average, name, op, prescale_factor, postscale_factor, process_set, compression: as in
            ``allreduce``.

    Example:
        >>> sdp.allreduce_(metric_sum, op=sdp.Sum)
    """
    reduce_op = resolve_op(average, op)
    reduce_in_place([tensor], reduce_op, compression, prescale_factor, postscale_factor)
    return tensor


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: ReduceOp | str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
) -> list[torch.Tensor]:
    """Reduce several tensors in one fused collective; return new tensors.

    Arguments:
        tensors: the local values.
        average, name, compression, op, prescale_factor, postscale_factor, process_set: as in
            ``allreduce``.

    Example:
        >>> loss, acc = sdp.grouped_allreduce([loss, acc])
    """
    out = [t.detach().clone() for t in tensors]
    reduce_in_place(out, resolve_op(average, op), compression, prescale_factor, postscale_factor)
    return out


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = None,
    compression: Any = Compression.none,
) -> list[torch.Tensor]:
    """Reduce several tensors in place in one fused collective and return them.

    Arguments:
        tensors: the local values, overwritten with the results.
        average, name, op, prescale_factor, postscale_factor, process_set, compression: as in
            ``allreduce``.

    Example:
        >>> sdp.grouped_allreduce_([p.grad for p in model.parameters()])
    """
    tensors = list(tensors)
    reduce_op = resolve_op(average, op)
    reduce_in_place(tensors, reduce_op, compression, prescale_factor, postscale_factor)
    return tensors


def broadcast(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None,
              process_set: Any = None) -> torch.Tensor:
    """Return ``root_rank``'s ``tensor`` on every process (a new tensor).

    Arguments:
        tensor: the local tensor (its shape and dtype must match the root's).
        root_rank: the process whose value everyone gets.
        name, process_set: ignored.

    Example:
        >>> seed = sdp.broadcast(torch.tensor(seed), root_rank=0)
    """
    out = tensor.detach().clone()
    _comm.broadcast_([out], root_rank)
    return out


def broadcast_(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None,
               process_set: Any = None) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s value, in place, and return it.

    Arguments:
        tensor: the local tensor.
        root_rank: the process whose value everyone gets.
        name, process_set: ignored.

    Example:
        >>> sdp.broadcast_(model.weight.data, root_rank=0)
    """
    _comm.broadcast_([tensor], root_rank)
    return tensor


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: Any = None) -> torch.Tensor:
    """Concatenate every process's ``tensor`` along dim 0 (first dims may differ).

    Arguments:
        tensor: the local piece.
        name, process_set: ignored.

    Example:
        >>> all_preds = sdp.allgather(preds)
    """
    return _comm.allgather(tensor)


def barrier(process_set: Any = None) -> None:
    """Wait until every process gets here.

    Example:
        >>> sdp.barrier()
    """
    _comm.barrier()


@dataclass
class Handle:
    """What the ``*_async`` functions return; pass it to ``synchronize``."""

    result: Any


def allreduce_async(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Handle:
    """``allreduce``, returning a handle (the work is already done).

    Example:
        >>> h = sdp.allreduce_async(t); t2 = sdp.synchronize(h)
    """
    return Handle(allreduce(tensor, *args, **kwargs))


def allreduce_async_(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Handle:
    """``allreduce_``, returning a handle (the work is already done).

    Example:
        >>> sdp.synchronize(sdp.allreduce_async_(t))
    """
    return Handle(allreduce_(tensor, *args, **kwargs))


def broadcast_async(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None) -> Handle:
    """``broadcast``, returning a handle (the work is already done).

    Example:
        >>> t2 = sdp.synchronize(sdp.broadcast_async(t, 0))
    """
    return Handle(broadcast(tensor, root_rank))


def broadcast_async_(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None) -> Handle:
    """``broadcast_``, returning a handle (the work is already done).

    Example:
        >>> sdp.synchronize(sdp.broadcast_async_(t, 0))
    """
    return Handle(broadcast_(tensor, root_rank))


def allgather_async(tensor: torch.Tensor, name: str | None = None) -> Handle:
    """``allgather``, returning a handle (the work is already done).

    Example:
        >>> everything = sdp.synchronize(sdp.allgather_async(t))
    """
    return Handle(allgather(tensor))


def synchronize(handle: Handle) -> Any:
    """The result of an ``*_async`` call.

    Example:
        >>> sdp.synchronize(handle)
    """
    return handle.result


def poll(handle: Handle) -> bool:
    """Whether an ``*_async`` call has finished: always True.

    Example:
        >>> sdp.poll(handle)
        True
    """
    return True
