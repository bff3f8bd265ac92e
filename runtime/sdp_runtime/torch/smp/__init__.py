"""SageMaker model parallelism's PyTorch API (``smdistributed.modelparallel.torch``) on
sdp_runtime, for ``import sdp_runtime.torch.smp as smp``.

Data parallel by default; a configuration with more than one partition, tensor parallelism or
sharded data parallelism shards the model with PyTorch FSDP2 (see :mod:`.model`). ``@smp.step``
splits batches into microbatches as SMP does (see :mod:`.step`).
"""

from __future__ import annotations

from . import amp, nn
from .checkpoint import load, resume_from_checkpoint, save, save_checkpoint
from .comm import allgather, barrier, broadcast, recv_from
from .model import (
    DistributedModel,
    DistributedOptimizer,
    delay_param_initialization,
    model_creation,
    partition,
    set_activation_checkpointing,
    set_partition,
    tensor_parallelism,
)
from .state import (
    DP_GROUP,
    MP_GROUP,
    PP_GROUP,
    RDP_GROUP,
    TP_GROUP,
    WORLD,
    CommGroup,
    RankType,
    dp_rank,
    dp_size,
    get_dp_group,
    get_dp_process_group,
    get_mp_group,
    get_mp_process_group,
    get_pp_group,
    get_pp_process_group,
    get_rdp_group,
    get_rdp_process_group,
    get_tp_group,
    get_tp_process_group,
    get_world_process_group,
    init,
    is_initialized,
    local_rank,
    local_size,
    mp_rank,
    mp_size,
    pp_rank,
    pp_size,
    rank,
    rdp_rank,
    rdp_size,
    size,
    tp_rank,
    tp_size,
)
from .step import StepOutput, step


def is_tracing() -> bool:
    """False: there is no tracing pass (the model is placed when it is wrapped)."""
    return False


__all__ = [
    # joining the job, and where this process stands
    "init", "is_initialized", "rank", "size", "local_rank", "local_size", "mp_rank", "mp_size",
    "dp_rank", "dp_size", "pp_rank", "pp_size", "tp_rank", "tp_size", "rdp_rank", "rdp_size",
    "get_mp_group", "get_dp_group", "get_tp_group", "get_pp_group", "get_rdp_group",
    "get_dp_process_group", "get_mp_process_group", "get_rdp_process_group",
    "get_tp_process_group", "get_pp_process_group", "get_world_process_group",
    # the model, its optimizer and its step
    "DistributedModel", "DistributedOptimizer", "StepOutput", "step", "partition", "amp",
    "set_partition", "set_activation_checkpointing", "tensor_parallelism",
    "delay_param_initialization", "model_creation", "is_tracing", "nn",
    # checkpoints
    "save", "load", "save_checkpoint", "resume_from_checkpoint",
    # communication on SMP's groups
    "CommGroup", "RankType", "WORLD", "MP_GROUP", "DP_GROUP", "RDP_GROUP", "TP_GROUP", "PP_GROUP",
    "barrier", "broadcast",
    "recv_from", "allgather",
]
