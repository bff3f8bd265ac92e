"""The ``smdistributed.dataparallel.torch.distributed`` API, so an SMDDP script runs after an
import swap::

    import sdp_runtime.torch.distributed as dist          # was smdistributed.dataparallel...
    from sdp_runtime.torch.parallel.distributed import DistributedDataParallel as DDP

Only the global group exists (``group.WORLD``); ``group`` arguments are accepted and ignored.
Collectives run at once; with ``async_op=True`` they return a finished work handle.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _comm
from .._types import ReduceOp
from .ddp import DistributedDataParallel

__all__ = [
    "DistributedDataParallel",
    "ReduceOp",
    "all_gather",
    "all_gather_object",
    "all_reduce",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "get_local_rank",
    "get_local_size",
    "get_rank",
    "get_world_size",
    "group",
    "init_process_group",
    "is_available",
    "is_initialized",
]


class group:  # noqa: N801 (SMDDP's spelling)
    """SMDDP's process groups: only ``group.WORLD``."""

    WORLD = None


class _Done:
    """A finished work handle (what ``async_op=True`` returns)."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _handle(async_op: bool) -> _Done | None:
    return _Done() if async_op else None


def is_available() -> bool:
    """Whether the library can be used: always True (it also runs as a single process).

    Example:
        >>> dist.is_available()
        True
    """
    return True


def init_process_group(*args: Any, backend: str | None = None, **kwargs: Any) -> None:
    """Initialise (SMDDP's ``init_process_group()``); arguments other than the backend are ignored.

    Arguments:
        backend: ``"nccl"`` or ``"gloo"``; any other value (``"smddp"``) picks the default.

    Example:
        >>> dist.init_process_group()
    """
    if args and backend is None and isinstance(args[0], str):
        backend = args[0]
    _comm.init(backend if backend in ("nccl", "gloo") else None)


def is_initialized() -> bool:
    """Whether ``init_process_group()`` has run.

    Example:
        >>> dist.is_initialized()
        True
    """
    return _comm.is_initialized()


def get_rank(group: Any = None) -> int:
    """This process's rank.

    Example:
        >>> dist.get_rank()
        0
    """
    return _comm.rank()


def get_world_size(group: Any = None) -> int:
    """Number of processes.

    Example:
        >>> dist.get_world_size()
        2
    """
    return _comm.size()


def get_local_rank() -> int:
    """This process's rank on its machine.

    Example:
        >>> torch.cuda.set_device(dist.get_local_rank())
    """
    return _comm.local_rank()


def get_local_size() -> int:
    """Number of processes on this machine.

    Example:
        >>> dist.get_local_size()
        2
    """
    return _comm.local_size()


def barrier(group: Any = None, async_op: bool = False) -> _Done | None:
    """Wait until every process gets here.

    Example:
        >>> dist.barrier()
    """
    _comm.barrier()
    return _handle(async_op)


def all_reduce(tensor: torch.Tensor, op: ReduceOp | str = ReduceOp.SUM, group: Any = None,
               async_op: bool = False) -> _Done | None:
    """Reduce ``tensor`` in place over all processes (SUM by default).

    Arguments:
        tensor: input and output.
        op: ``ReduceOp.SUM``, ``AVERAGE``, ``MIN`` or ``MAX``.
        group: ignored.
        async_op: return a (finished) work handle.

    Example:
        >>> dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
    """
    _comm.allreduce_([tensor], ReduceOp.parse(op))
    return _handle(async_op)


def broadcast(tensor: torch.Tensor, src: int = 0, group: Any = None,
              async_op: bool = False) -> _Done | None:
    """Overwrite ``tensor`` with process ``src``'s, in place.

    Example:
        >>> dist.broadcast(weights, src=0)
    """
    _comm.broadcast_([tensor], src)
    return _handle(async_op)


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None,
               async_op: bool = False) -> _Done | None:
    """Fill ``tensor_list[i]`` with process ``i``'s ``tensor`` (all the same shape).

    Example:
        >>> parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        >>> dist.all_gather(parts, t)
    """
    if len(tensor_list) != _comm.size():
        raise ValueError(f"tensor_list needs {_comm.size()} tensors, one per process")
    gathered = _comm.allgather(tensor.unsqueeze(0))
    with torch.no_grad():
        for out, part in zip(tensor_list, gathered, strict=True):
            out.copy_(part)
    return _handle(async_op)


def all_to_all_single(output: torch.Tensor, input: torch.Tensor,  # noqa: A002 (torch's name)
                      output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None, group: Any = None,
                      async_op: bool = False) -> _Done | None:
    """Send block ``i`` of ``input``'s rows to process ``i``; fill ``output`` with what arrives.

    Arguments:
        output: the received rows, in rank order of their sender (its size must match).
        input: the rows to send.
        output_split_sizes: rows expected from each process (checked); default equal blocks.
        input_split_sizes: rows for each process; default equal blocks.
        group: ignored (one global group).
        async_op: return a (finished) work handle.

    Example:
        >>> out = torch.empty(4); dist.all_to_all_single(out, torch.arange(4.0))
    """
    n = _comm.size()
    rows = input.shape[0] if input.dim() else 1
    if input_split_sizes is None:
        if rows % n:
            raise ValueError(f"all_to_all_single: input's first dimension ({rows}) does not "
                             f"divide by the number of processes ({n}); pass input_split_sizes")
        input_split_sizes = [rows // n] * n
    received, counts = _comm.alltoall(input, list(input_split_sizes))
    if output_split_sizes is not None and list(output_split_sizes) != counts:
        raise ValueError(f"all_to_all_single: output_split_sizes {list(output_split_sizes)} but "
                         f"the processes sent {counts} rows")
    if output.numel() != received.numel():
        raise ValueError(f"all_to_all_single: output has {output.numel()} elements, but "
                         f"{received.numel()} arrived")
    with torch.no_grad():
        output.copy_(received.view(output.shape))
    return _handle(async_op)


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """Fill ``object_list[i]`` with process ``i``'s ``obj``.

    Example:
        >>> out = [None] * dist.get_world_size(); dist.all_gather_object(out, stats)
    """
    object_list[:] = _comm.allgather_object(obj)


def broadcast_object_list(object_list: list[Any], src: int = 0, group: Any = None) -> None:
    """Overwrite ``object_list``'s items with process ``src``'s, in place.

    Example:
        >>> box = [config]; dist.broadcast_object_list(box, src=0); config = box[0]
    """
    object_list[:] = _comm.broadcast_object(list(object_list), src)
