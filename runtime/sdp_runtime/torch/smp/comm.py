"""SMP's communication primitives on its groups: ``barrier``, ``broadcast`` / ``recv_from``,
``allgather``."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ... import _comm
from .state import CommGroup, RankType, process_group, require

_RANK_GROUP = {
    RankType.WORLD_RANK: CommGroup.WORLD,
    RankType.MP_RANK: CommGroup.MP_GROUP,
    RankType.DP_RANK: CommGroup.DP_GROUP,
    RankType.RDP_RANK: CommGroup.RDP_GROUP,
    RankType.TP_RANK: CommGroup.TP_GROUP,
    RankType.PP_RANK: CommGroup.PP_GROUP,
}


def _members(group: CommGroup) -> list[int]:
    return require("communication").members[group]


def barrier(group: CommGroup = CommGroup.WORLD) -> None:
    """Wait for every process of ``group``.

    Example:
        >>> smp.barrier()
    """
    if len(_members(group)) > 1:
        dist.barrier(group=process_group(group))


def broadcast(obj: Any, group: CommGroup = CommGroup.WORLD) -> None:
    """Send ``obj`` (picklable) to the other processes of ``group``, which call ``recv_from``.

    Example:
        >>> if smp.rank() == 0:
        ...     smp.broadcast(config, smp.CommGroup.WORLD)
        ... else:
        ...     config = smp.recv_from(0, smp.RankType.WORLD_RANK)
    """
    if len(_members(group)) > 1:
        dist.broadcast_object_list([obj], src=_comm.rank(), group=process_group(group),
                                   device=_comm.device())


def recv_from(src_rank: int, rank_type: RankType = RankType.WORLD_RANK) -> Any:
    """Receive what process ``src_rank`` (counted as ``rank_type`` says) sent with
    ``broadcast``."""
    group = _RANK_GROUP[rank_type]
    members = _members(group)
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=members[src_rank], group=process_group(group),
                               device=_comm.device())
    return box[0]


def allgather(obj: Any, group: CommGroup = CommGroup.WORLD) -> list[Any]:
    """Every process's ``obj`` in ``group``, in rank order."""
    members = _members(group)
    if len(members) == 1:
        return [obj]
    out: list[Any] = [None] * len(members)
    dist.all_gather_object(out, obj, group=process_group(group))
    return out
