"""The PyTorch API: Horovod's names (``hvd.init``, ``hvd.DistributedOptimizer``, ...) plus
``DistributedDataParallel``, on torch.distributed.

    import sdp_runtime.torch as sdp      # was: import horovod.torch as hvd
    sdp.init()

SMDDP's names are in ``sdp_runtime.torch.distributed`` and ``sdp_runtime.torch.parallel``.
This package never imports TensorFlow.
"""

from __future__ import annotations

from .._compat import NotProvidedError, global_process_set, not_provided
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
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    device,
    gloo_built,
    gloo_enabled,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
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
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from .compression import Compression, Compressor
from .data import shard
from .ddp import DistributedDataParallel
from .functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from .optimizer import DistributedOptimizer

#: Horovod's error for a failed collective: here, the runtime's own.
HorovodInternalError = CommunicationError

# Horovod names this package does not provide raise NotProvidedError, saying what to do instead.
__getattr__ = not_provided(__name__, "horovod.torch")

__all__ = [
    "AlreadyInitializedError",
    "Average",
    "CommunicationError",
    "Compression",
    "Compressor",
    "DistributedDataParallel",
    "DistributedOptimizer",
    "Handle",
    "HorovodInternalError",
    "Max",
    "Min",
    "MismatchError",
    "NotInitializedError",
    "NotProvidedError",
    "ReduceOp",
    "Sum",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "device",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "rank0_first",
    "rank0_print",
    "reducescatter",
    "reducescatter_async",
    "rocm_built",
    "shard",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "synchronize",
]
