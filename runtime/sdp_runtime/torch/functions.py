"""Broadcasting a model's and an optimizer's state, and arbitrary objects (Horovod's names)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .. import _comm
from .._compat import check_process_set


def broadcast_parameters(params: Any, root_rank: int = 0) -> None:
    """Overwrite parameters and buffers on every process with ``root_rank``'s, in place.

    All tensors travel fused in a few buckets, whatever their dtypes.

    Arguments:
        params: ``model.state_dict()``, ``model.named_parameters()``, a list of ``(name, tensor)``
            pairs, or an iterable of tensors. A dict is taken in key order, as Horovod does.
        root_rank: the process whose values everyone gets.

    Example:
        >>> sdp.broadcast_parameters(model.state_dict(), root_rank=0)
    """
    if isinstance(params, Mapping):
        ordered = sorted(params.items(), key=lambda kv: str(kv[0]))
        items: Iterable[Any] = [value for _, value in ordered]
    else:
        items = [p[1] if isinstance(p, tuple) else p for p in params]
    tensors = [t for t in items if isinstance(t, torch.Tensor)]
    _comm.broadcast_(tensors, root_rank)


@dataclass(frozen=True)
class _Slot:
    """Stands for a tensor in the optimizer state skeleton sent from the root."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def _hollow(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """Copy of ``obj`` with each tensor replaced by a ``_Slot`` (tensors collected in order)."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach())
        return _Slot(len(tensors) - 1, tuple(obj.shape), obj.dtype)
    if isinstance(obj, dict):
        return {k: _hollow(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_hollow(v, tensors) for v in obj)
    return obj


def _fill(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, _Slot):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: _fill(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_fill(v, tensors) for v in obj)
    return obj


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Make every process's optimizer state (and hyperparameters) equal to ``root_rank``'s.

    Works while the state is still empty on some processes (e.g. before the first step), and for
    every optimizer whose ``state_dict()`` holds tensors and plain values (SGD with momentum, Adam,
    ...): the root sends the layout as one object, then all tensors in fused buckets, and the
    other processes load the result with ``optimizer.load_state_dict``.

    Arguments:
        optimizer: the optimizer (a ``DistributedOptimizer`` or a plain one).
        root_rank: the process whose state everyone gets.

    Example:
        >>> sdp.broadcast_optimizer_state(optimizer, root_rank=0)
    """
    if _comm.alone():
        return
    mine = _comm.rank() == root_rank
    tensors: list[torch.Tensor] = []
    skeleton = _hollow(optimizer.state_dict(), tensors) if mine else None
    skeleton = _comm.broadcast_object(skeleton, root_rank)
    if not mine:
        slots: list[_Slot] = []
        _collect_slots(skeleton, slots)
        slots.sort(key=lambda s: s.index)
        tensors = [torch.empty(s.shape, dtype=s.dtype) for s in slots]
    _comm.broadcast_(tensors, root_rank)
    if not mine:
        optimizer.load_state_dict(_fill(skeleton, tensors))


def _collect_slots(obj: Any, out: list[_Slot]) -> None:
    if isinstance(obj, _Slot):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect_slots(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _collect_slots(v, out)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: Any = None) -> Any:
    """Return ``root_rank``'s ``obj`` (any picklable object) on every process.

    Arguments:
        obj: the object (only the root's matters).
        root_rank: the process whose object everyone gets.
        name: ignored. process_set: None or ``global_process_set``.

    Example:
        >>> start_epoch = sdp.broadcast_object(start_epoch, root_rank=0)
    """
    check_process_set(process_set, "broadcast_object")
    return _comm.broadcast_object(obj, root_rank)


def allgather_object(obj: Any, name: str | None = None, process_set: Any = None) -> list[Any]:
    """Return every process's ``obj`` as a list in rank order.

    Arguments:
        obj: any picklable object.
        name: ignored. process_set: None or ``global_process_set``.

    Example:
        >>> counts = sdp.allgather_object(len(dataset_shard))
    """
    check_process_set(process_set, "allgather_object")
    return _comm.allgather_object(obj)
