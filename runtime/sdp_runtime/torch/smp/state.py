"""``smp.init`` and the rank queries: SMP's process layout on sdp_runtime's process group.

See :mod:`sdp_runtime._smp_config` for the configuration keys and the layout. With one partition
(the default) every process is a data-parallel replica: ``mp_rank() == 0``, ``mp_size() == 1``,
``dp_rank() == rank()``, ``dp_size() == size()``.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from ... import _comm, _smp_config
from ..._types import NotInitializedError


class CommGroup(enum.Enum):
    """SMP's process groups: everyone, one model replica, one partition's replicas, the ranks
    holding the same tensor-parallel slice, one tensor-parallel group, one pipeline."""

    WORLD = 0
    MP_GROUP = 1
    DP_GROUP = 2
    RDP_GROUP = 3
    TP_GROUP = 4
    PP_GROUP = 5


class RankType(enum.Enum):
    """How a rank number given to ``recv_from`` is meant."""

    WORLD_RANK = 0
    MP_RANK = 1
    DP_RANK = 2
    RDP_RANK = 3
    TP_RANK = 4
    PP_RANK = 5


WORLD = CommGroup.WORLD
MP_GROUP = CommGroup.MP_GROUP
DP_GROUP = CommGroup.DP_GROUP
RDP_GROUP = CommGroup.RDP_GROUP
TP_GROUP = CommGroup.TP_GROUP
PP_GROUP = CommGroup.PP_GROUP


@dataclass
class _State:
    config: _smp_config.Config
    layout: _smp_config.Layout
    groups: dict[CommGroup, Any]  # torch ProcessGroup (None = the world), only when size > 1
    members: dict[CommGroup, list[int]]


_state: _State | None = None


def init(config: Mapping[str, Any] | None = None) -> None:
    """Join the job and read SMP's configuration; call it once, first, on every process.

    Arguments:
        config: SMP's parameters (``{"partitions": 2, "microbatches": 4, ...}``), over those of
            ``SM_HP_MP_PARAMETERS``. More than one partition, tensor parallelism or sharded data
            parallelism shards the model with FSDP (see ``DistributedModel``).

    Raises:
        ValueError: a degree does not divide the number of processes (one process alone runs
            the whole model, whatever the configuration).

    Example:
        >>> import sdp_runtime.torch.smp as smp
        >>> smp.init({"microbatches": 2})
    """
    global _state
    if _state is not None:
        return  # SMP scripts may call init() from several places
    cfg = _smp_config.read(config)
    if not _comm.is_initialized():
        _comm.init()
    if _comm.size() == 1 and cfg.sharded:
        # `python train.py`: one process holds the whole model, whatever SageMaker's job used.
        print(f"sdp_runtime.torch.smp: one process: the model is not sharded (configured: "
              f"{cfg.partitions} partition(s), tensor-parallel degree "
              f"{cfg.tensor_parallel_degree}, sharded data-parallel degree "
              f"{cfg.sharded_data_parallel_degree})", file=sys.stderr)
        cfg = dataclasses.replace(cfg, partitions=1, tensor_parallel_degree=1,
                                  sharded_data_parallel_degree=1)
    layout = _smp_config.Layout(_comm.rank(), _comm.size(), cfg)
    every_group = {
        CommGroup.MP_GROUP: _partition(layout.size, layout.mp_size, contiguous=True),
        CommGroup.DP_GROUP: _partition(layout.size, layout.mp_size, contiguous=False),
        CommGroup.RDP_GROUP: _partition(layout.size, layout.tp_size, contiguous=False),
        # within a replica: tp_rank = mp_rank % tp_size, pp_rank = mp_rank // tp_size
        CommGroup.TP_GROUP: _partition(layout.size, layout.tp_size, contiguous=True),
        CommGroup.PP_GROUP: [ranks[t::layout.tp_size] for ranks in
                             _partition(layout.size, layout.mp_size, contiguous=True)
                             for t in range(layout.tp_size)],
    }
    members = {CommGroup.WORLD: list(range(layout.size))}
    members.update({kind: next(g for g in every if layout.rank in g)
                    for kind, every in every_group.items()})
    groups: dict[CommGroup, Any] = {CommGroup.WORLD: None}
    if layout.size > 1:
        for kind, every in every_group.items():
            for ranks in every:  # every process creates every group, in the same order
                group = None if len(ranks) == layout.size else dist.new_group(ranks)
                if layout.rank in ranks:
                    groups[kind] = group
    _state = _State(cfg, layout, groups, members)


def _partition(size: int, width: int, *, contiguous: bool) -> list[list[int]]:
    """Consecutive blocks of ``width`` ranks, or the ranks equal modulo ``width``."""
    if contiguous:
        return [list(range(s, s + width)) for s in range(0, size, width)]
    return [list(range(r, size, width)) for r in range(width)]


def require(what: str) -> _State:
    if _state is None:
        raise NotInitializedError(f"smp.{what}")
    return _state


def reset() -> None:
    """Forget the configuration (``smp.init`` reads it again); the process group stays."""
    global _state
    _state = None


def is_initialized() -> bool:
    """Whether ``smp.init()`` has run."""
    return _state is not None


def config() -> _smp_config.Config:
    """The configuration ``smp.init`` read."""
    return require("config").config


def layout() -> _smp_config.Layout:
    return require("layout").layout


def rank() -> int:
    """This process's rank among all processes."""
    return layout().rank


def size() -> int:
    """The number of processes."""
    return layout().size


def local_rank() -> int:
    """This process's rank on its machine (its GPU)."""
    require("local_rank")
    return _comm.local_rank()


def local_size() -> int:
    """The number of processes on this machine."""
    require("local_size")
    return _comm.local_size()


def mp_rank() -> int:
    """This process's rank within its model replica (0 under plain data parallelism)."""
    return layout().mp_rank


def mp_size() -> int:
    """Processes per model replica: partitions x tensor-parallel degree (1 by default)."""
    return layout().mp_size


def dp_rank() -> int:
    """Which model replica this process belongs to (``rank()`` under data parallelism)."""
    return layout().dp_rank


def dp_size() -> int:
    """The number of model replicas (``size()`` under data parallelism)."""
    return layout().dp_size


def pp_rank() -> int:
    """This process's pipeline partition within its replica."""
    return layout().pp_rank


def pp_size() -> int:
    """The number of pipeline partitions (``partitions``)."""
    return layout().pp_size


def tp_rank() -> int:
    """This process's tensor-parallel rank."""
    return layout().tp_rank


def tp_size() -> int:
    """The tensor-parallel degree."""
    return layout().tp_size


def rdp_rank() -> int:
    """This process's rank among the processes holding its tensor-parallel slice."""
    return layout().rdp_rank


def rdp_size() -> int:
    """The number of processes holding the same tensor-parallel slice."""
    return layout().rdp_size


def get_mp_group() -> list[int]:
    """The ranks of this process's model replica."""
    return list(require("get_mp_group").members[CommGroup.MP_GROUP])


def get_dp_group() -> list[int]:
    """The ranks holding the same partition as this process."""
    return list(require("get_dp_group").members[CommGroup.DP_GROUP])


def process_group(kind: CommGroup) -> Any:
    """The torch.distributed group for ``kind`` (None: the default group)."""
    return require("process group").groups.get(kind)


def get_tp_group() -> list[int]:
    """The ranks of this process's tensor-parallel group."""
    return list(require("get_tp_group").members[CommGroup.TP_GROUP])


def get_pp_group() -> list[int]:
    """The ranks of this process's pipeline (one per partition, same tensor-parallel rank)."""
    return list(require("get_pp_group").members[CommGroup.PP_GROUP])


def get_rdp_group() -> list[int]:
    """The ranks holding the same tensor-parallel slice as this process."""
    return list(require("get_rdp_group").members[CommGroup.RDP_GROUP])


def get_world_process_group() -> Any:
    """torch.distributed's group of all processes."""
    require("get_world_process_group")
    return dist.group.WORLD


def get_mp_process_group() -> Any:
    """torch.distributed's group of this process's model replica."""
    return process_group(CommGroup.MP_GROUP) or dist.group.WORLD


def get_dp_process_group() -> Any:
    """torch.distributed's group of the processes holding this process's partition: the group
    to average buffers or metrics over, as SMP's documentation suggests.

    Example:
        >>> torch.distributed.all_reduce(t, group=smp.get_dp_process_group())
    """
    return process_group(CommGroup.DP_GROUP) or dist.group.WORLD


def get_rdp_process_group() -> Any:
    """torch.distributed's group of the processes holding this tensor-parallel slice."""
    return process_group(CommGroup.RDP_GROUP) or dist.group.WORLD


def get_tp_process_group() -> Any:
    """torch.distributed's group of this process's tensor-parallel group."""
    return process_group(CommGroup.TP_GROUP) or dist.group.WORLD


def get_pp_process_group() -> Any:
    """torch.distributed's group of this process's pipeline."""
    return process_group(CommGroup.PP_GROUP) or dist.group.WORLD
