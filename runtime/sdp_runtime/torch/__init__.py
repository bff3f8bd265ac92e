"""The PyTorch API: Horovod's names (``hvd.init``, ``hvd.DistributedOptimizer``, ...) plus
``DistributedDataParallel``, on torch.distributed.

    import sdp_runtime.torch as sdp      # was: import horovod.torch as hvd
    sdp.init()

SMDDP's names are in ``sdp_runtime.torch.distributed`` and ``sdp_runtime.torch.parallel``.
This package never imports TensorFlow.
"""

from __future__ import annotations

from .._order import rank0_first
from .._output import rank0_print
from .._types import (
    AlreadyInitializedError,
    CommunicationError,
    MismatchError,
    NotInitializedError,
    ReduceOp,
)
from .basics import (
    cross_rank,
    cross_size,
    device,
    gloo_built,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    nccl_built,
    rank,
    shutdown,
    size,
)
from .collectives import (
    Average,
    Handle,
    Max,
    Min,
    Sum,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allreduce,
    grouped_allreduce_,
    poll,
    synchronize,
)
from .compression import Compression, Compressor
from .ddp import DistributedDataParallel
from .functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from .optimizer import DistributedOptimizer

__all__ = [
    "AlreadyInitializedError",
    "Average",
    "CommunicationError",
    "Compression",
    "Compressor",
    "DistributedDataParallel",
    "DistributedOptimizer",
    "Handle",
    "Max",
    "Min",
    "MismatchError",
    "NotInitializedError",
    "ReduceOp",
    "Sum",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "cross_rank",
    "cross_size",
    "device",
    "gloo_built",
    "grouped_allreduce",
    "grouped_allreduce_",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_built",
    "nccl_built",
    "poll",
    "rank",
    "rank0_print",
    "rank0_first",
    "shutdown",
    "size",
    "synchronize",
]
