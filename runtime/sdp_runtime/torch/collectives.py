"""Tensor collectives with Horovod's names and signatures (``hvd.allreduce`` and friends).

``name`` is accepted for compatibility and ignored: collectives are matched by order, in one
global group. ``process_set`` may be None or ``global_process_set`` (every process); any other set
is refused (:class:`~sdp_runtime._compat.NotProvidedError`). ``*_async`` functions run at once and
return a handle that ``synchronize`` turns into the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .. import _comm
from .._compat import check_process_set
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
            scale_(t, factor)


def scale_(tensor: torch.Tensor, factor: float) -> None:
    """Multiply ``tensor`` by ``factor`` in place, as Horovod scales: integers in float64 (the
    result truncated toward zero), float16 / bfloat16 in float32, other floats as they are.

    Example:
        >>> scale_(torch.tensor([3]), 0.5)  # tensor([1])
    """
    if tensor.is_complex() or (tensor.is_floating_point() and tensor.element_size() > 2):
        tensor.mul_(factor)
    elif tensor.is_floating_point():
        tensor.copy_(tensor.float() * factor)
    elif tensor.dtype == torch.bool:
        raise TypeError("bool tensors cannot be scaled (prescale_factor / postscale_factor)")
    else:
        tensor.copy_((tensor.double() * factor).trunc())


class _GroupedAllreduce(torch.autograd.Function):
    """Differentiable fused allreduce: each gradient is reduced the same way (as in Horovod)."""

    @staticmethod
    def forward(ctx: Any, args: tuple[Any, ...], *tensors: torch.Tensor) -> Any:  # type: ignore[override]
        ctx.args = args
        out = [t.detach().clone() for t in tensors]
        reduce_in_place(out, *args)
        return tuple(out)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:  # type: ignore[override]
        out = [g.detach().clone() for g in grads]
        reduce_in_place(out, *ctx.args)
        return (None, *out)


class _Broadcast(torch.autograd.Function):
    """Differentiable broadcast: the root gets the average gradient, the others zeros (Horovod)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int) -> torch.Tensor:  # type: ignore[override]
        ctx.root_rank = root_rank
        out = tensor.detach().clone()
        _comm.broadcast_([out], root_rank)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        out = grad.detach().clone()
        reduce_in_place([out], ReduceOp.AVERAGE)
        if _comm.rank() != ctx.root_rank:
            out.zero_()
        return out, None


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
        process_set: None or ``global_process_set``; other sets are refused.

    Example:
        >>> mean_loss = sdp.allreduce(loss.detach(), op=sdp.Average)
    """
    check_process_set(process_set, "allreduce")
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
    check_process_set(process_set, "allreduce_")
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
    """Reduce several tensors in one fused collective; return new tensors (differentiable).

    Arguments:
        tensors: the local values.
        average, name, compression, op, prescale_factor, postscale_factor, process_set: as in
            ``allreduce``.

    Example:
        >>> loss, acc = sdp.grouped_allreduce([loss, acc])
    """
    check_process_set(process_set, "grouped_allreduce")
    args = (resolve_op(average, op), compression, prescale_factor, postscale_factor)
    tensors = list(tensors)
    if any(t.requires_grad for t in tensors) and torch.is_grad_enabled():
        return list(_GroupedAllreduce.apply(args, *tensors))
    out = [t.detach().clone() for t in tensors]
    reduce_in_place(out, *args)
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
    check_process_set(process_set, "grouped_allreduce_")
    tensors = list(tensors)
    reduce_op = resolve_op(average, op)
    reduce_in_place(tensors, reduce_op, compression, prescale_factor, postscale_factor)
    return tensors


def broadcast(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None,
              process_set: Any = None) -> torch.Tensor:
    """Return ``root_rank``'s ``tensor`` on every process (a new tensor;
    differentiable: the root gets the average of the gradients, the others zeros, as Horovod).

    Arguments:
        tensor: the local tensor (its shape and dtype must match the root's).
        root_rank: the process whose value everyone gets.
        name: ignored. process_set: None or ``global_process_set``.

    Example:
        >>> seed = sdp.broadcast(torch.tensor(seed), root_rank=0)
    """
    check_process_set(process_set, "broadcast")
    if tensor.requires_grad and torch.is_grad_enabled():
        return _Broadcast.apply(tensor, root_rank)
    out = tensor.detach().clone()
    _comm.broadcast_([out], root_rank)
    return out


def broadcast_(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None,
               process_set: Any = None) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s value, in place, and return it.

    Arguments:
        tensor: the local tensor.
        root_rank: the process whose value everyone gets.
        name: ignored. process_set: None or ``global_process_set``.

    Example:
        >>> sdp.broadcast_(model.weight.data, root_rank=0)
    """
    check_process_set(process_set, "broadcast_")
    _comm.broadcast_([tensor], root_rank)
    return tensor


class _Allgather(torch.autograd.Function):
    """Differentiable allgather: each process gets the average gradient of its own rows."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.rows = 1 if tensor.dim() == 0 else tensor.shape[0]
        return _comm.allgather(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        reduced = grad.detach().clone()
        reduce_in_place([reduced], ReduceOp.AVERAGE)
        rows = _comm.allgather(torch.tensor([ctx.rows], dtype=torch.int64)).tolist()
        start = sum(rows[: _comm.rank()])
        return reduced.narrow(0, start, ctx.rows)


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: Any = None) -> torch.Tensor:
    """Concatenate every process's ``tensor`` along dim 0 (first dims may differ; differentiable).

    As in Horovod, the gradient each process gets for its rows is the average over processes of
    the gradients of those rows.

    Arguments:
        tensor: the local piece.
        name: ignored.
        process_set: None or ``global_process_set``; other sets are refused.

    Example:
        >>> all_preds = sdp.allgather(preds)
    """
    check_process_set(process_set, "allgather")
    if tensor.requires_grad and torch.is_grad_enabled():
        return _Allgather.apply(tensor)
    return _comm.allgather(tensor)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: Any = None) -> list[torch.Tensor]:
    """``allgather`` of each tensor of ``tensors``, in order.

    Arguments:
        tensors: the local pieces.
        name: ignored.
        process_set: None or ``global_process_set``.

    Example:
        >>> preds, labels = sdp.grouped_allgather([preds, labels])
    """
    check_process_set(process_set, "grouped_allgather")
    return [allgather(t) for t in tensors]


def _my_block(reduced: torch.Tensor) -> torch.Tensor:
    """This process's block of rows of a reducescatter: the first ``rows % size`` blocks have one
    row more."""
    n, rank, rows = _comm.size(), _comm.rank(), reduced.shape[0]
    counts = [rows // n + (1 if r < rows % n else 0) for r in range(n)]
    return reduced.narrow(0, sum(counts[:rank]), counts[rank]).clone()


class _Reducescatter(torch.autograd.Function):
    """Differentiable reducescatter, with Horovod's gradient (an allgather of the gradients)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: ReduceOp, compression: Any,  # type: ignore[override]
                prescale: float, postscale: float) -> torch.Tensor:
        ctx.factor = (_comm.size() if op is ReduceOp.SUM else 1.0) * prescale * postscale
        return _reducescatter(tensor, op, compression, prescale, postscale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        return _comm.allgather(grad * ctx.factor), None, None, None, None


def _reducescatter(tensor: torch.Tensor, op: ReduceOp, compression: Any, prescale: float,
                   postscale: float) -> torch.Tensor:
    if tensor.dim() == 0:
        raise ValueError("reducescatter needs a tensor with at least one dimension")
    out = tensor.detach().clone()
    reduce_in_place([out], op, compression, prescale, postscale)
    return _my_block(out)


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: Any = Compression.none,
    op: ReduceOp | str | None = None,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduce ``tensor`` over all processes and give each process its own block of rows.

    The first dimension is cut in ``size()`` blocks, the first ``rows % size()`` one row longer;
    process ``r`` gets block ``r``. Differentiable (Horovod's gradient: an allgather).

    Arguments:
        tensor: the local value, the same shape on every process.
        name: ignored.
        compression: ``Compression.none`` or ``Compression.fp16``.
        op: ``Average`` (default), ``Sum``, ``Min`` or ``Max``.
        process_set: None or ``global_process_set``.
        prescale_factor, postscale_factor: multiply by these before / after reducing.

    Example:
        >>> my_block = sdp.reducescatter(grads, op=sdp.Sum)
    """
    check_process_set(process_set, "reducescatter")
    args = (resolve_op(None, op), compression, prescale_factor, postscale_factor)
    if tensor.requires_grad and torch.is_grad_enabled():
        return _Reducescatter.apply(tensor, *args)
    return _reducescatter(tensor, *args)


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    compression: Any = Compression.none,
    op: ReduceOp | str | None = None,
    process_set: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """``reducescatter`` of each tensor of ``tensors`` (reduced in one fused collective).

    Arguments:
        tensors: the local values.
        name, compression, op, process_set, prescale_factor, postscale_factor: as in
            ``reducescatter``.

    Example:
        >>> a, b = sdp.grouped_reducescatter([a, b], op=sdp.Sum)
    """
    check_process_set(process_set, "grouped_reducescatter")
    tensors = list(tensors)
    if any(t.dim() == 0 for t in tensors):
        raise ValueError("reducescatter needs tensors with at least one dimension")
    if any(t.requires_grad for t in tensors) and torch.is_grad_enabled():
        return [reducescatter(t, None, compression, op, None, prescale_factor, postscale_factor)
                for t in tensors]
    out = [t.detach().clone() for t in tensors]
    reduce_in_place(out, resolve_op(None, op), compression, prescale_factor, postscale_factor)
    return [_my_block(t) for t in out]


class _Alltoall(torch.autograd.Function):
    """Differentiable alltoall: the gradient goes back the way the rows came."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: list[int]) -> Any:  # type: ignore[override]
        out, received = _comm.alltoall(tensor, splits)
        ctx.received = received
        counts = torch.tensor(received, dtype=torch.int32)
        ctx.mark_non_differentiable(counts)
        return out, counts

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _counts: Any) -> Any:  # type: ignore[override]
        back, _ = _comm.alltoall(grad.contiguous(), ctx.received)
        return back, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: Any = None) -> Any:
    """Send block ``i`` of ``tensor``'s rows to process ``i``; return the blocks received.

    Arguments:
        tensor: the rows to send (other dimensions equal on every process).
        splits: rows for each process (a list or an int tensor, one per process); default: the
            first dimension cut in ``size()`` equal blocks (it must divide evenly).
        name: ignored.
        process_set: None or ``global_process_set``.

    Returns:
        The received rows, in rank order of their sender; with ``splits`` given, also an int32
        tensor of how many rows came from each process (Horovod's ``received_splits``).
        Differentiable.

    Example:
        >>> out, received = sdp.alltoall(rows, splits=[2, 1])
    """
    check_process_set(process_set, "alltoall")
    if splits is None:
        sends = _even_splits(tensor)
    else:
        sends = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if tensor.requires_grad and torch.is_grad_enabled():
        out, counts = _Alltoall.apply(tensor, sends)
    else:
        out, received = _comm.alltoall(tensor, sends)
        counts = torch.tensor(received, dtype=torch.int32)
    return out if splits is None else (out, counts)


def _even_splits(tensor: torch.Tensor) -> list[int]:
    n = _comm.size()
    rows = 1 if tensor.dim() == 0 else tensor.shape[0]
    if rows % n:
        raise ValueError(f"alltoall without splits needs a first dimension ({rows}) that "
                         f"divides by the number of processes ({n}); pass splits=")
    return [rows // n] * n


def barrier(process_set: Any = None) -> None:
    """Wait until every process gets here.

    Example:
        >>> sdp.barrier()
    """
    check_process_set(process_set, "barrier")
    _comm.barrier()


@dataclass
class Handle:
    """What the ``*_async`` functions return; pass it to ``synchronize`` (or call it, as Horovod's
    ``sparse_allreduce_async`` handle is called)."""

    result: Any

    def __call__(self) -> Any:
        return self.result


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


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> Handle:
    """``grouped_allreduce``, returning a handle (the work is already done).

    Example:
        >>> outs = sdp.synchronize(sdp.grouped_allreduce_async([a, b]))
    """
    return Handle(grouped_allreduce(tensors, *args, **kwargs))


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], *args: Any, **kwargs: Any) -> Handle:
    """``grouped_allreduce_``, returning a handle (the work is already done).

    Example:
        >>> sdp.synchronize(sdp.grouped_allreduce_async_([a, b]))
    """
    return Handle(grouped_allreduce_(tensors, *args, **kwargs))


def broadcast_async(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None,
                    process_set: Any = None) -> Handle:
    """``broadcast``, returning a handle (the work is already done).

    Example:
        >>> t2 = sdp.synchronize(sdp.broadcast_async(t, 0))
    """
    return Handle(broadcast(tensor, root_rank, name, process_set))


def broadcast_async_(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None,
                     process_set: Any = None) -> Handle:
    """``broadcast_``, returning a handle (the work is already done).

    Example:
        >>> sdp.synchronize(sdp.broadcast_async_(t, 0))
    """
    return Handle(broadcast_(tensor, root_rank, name, process_set))


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: Any = None) -> Handle:
    """``allgather``, returning a handle (the work is already done).

    Example:
        >>> everything = sdp.synchronize(sdp.allgather_async(t))
    """
    return Handle(allgather(tensor, name, process_set))


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: Any = None) -> Handle:
    """``grouped_allgather``, returning a handle (the work is already done).

    Example:
        >>> a, b = sdp.synchronize(sdp.grouped_allgather_async([a, b]))
    """
    return Handle(grouped_allgather(tensors, name, process_set))


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: Any = None) -> Handle:
    """``alltoall``, returning a handle whose result is ``(output, received_splits)``.

    Example:
        >>> out, received = sdp.synchronize(sdp.alltoall_async(rows, [2, 1]))
    """
    check_process_set(process_set, "alltoall_async")
    sends = _even_splits(tensor) if splits is None else splits
    return Handle(alltoall(tensor.detach(), sends))


def reducescatter_async(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Handle:
    """``reducescatter``, returning a handle (the work is already done).

    Example:
        >>> block = sdp.synchronize(sdp.reducescatter_async(t, op=sdp.Sum))
    """
    return Handle(reducescatter(tensor.detach(), *args, **kwargs))


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], *args: Any,
                                **kwargs: Any) -> Handle:
    """``grouped_reducescatter``, returning a handle (the work is already done).

    Example:
        >>> a, b = sdp.synchronize(sdp.grouped_reducescatter_async([a, b]))
    """
    return Handle(grouped_reducescatter([t.detach() for t in tensors], *args, **kwargs))


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None = None,
                           op: ReduceOp | str | None = None, process_set: Any = None) -> Handle:
    """Reduce a sparse COO tensor by gathering every process's indices and values.

    Arguments:
        tensor: a sparse COO tensor, the same dense shape on every process.
        name: ignored.
        op: ``Average`` (default) or ``Sum``.
        process_set: None or ``global_process_set``.

    Returns:
        A handle whose result is the sparse sum (or average) of every process's tensor
        (uncoalesced: indices may repeat, as in Horovod).

    Example:
        >>> grad = sdp.synchronize(sdp.sparse_allreduce_async(emb.weight.grad, op=sdp.Average))
    """
    check_process_set(process_set, "sparse_allreduce_async")
    reduce_op = resolve_op(None, op)
    if reduce_op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise ValueError(f"sparse_allreduce_async supports Average and Sum, not {reduce_op.name}")
    indices = _comm.allgather(tensor._indices().t().contiguous()).t()
    values = _comm.allgather(tensor._values())
    if reduce_op is ReduceOp.AVERAGE:
        values = values / _comm.size()
    return Handle(torch.sparse_coo_tensor(indices, values, tensor.size()))


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
