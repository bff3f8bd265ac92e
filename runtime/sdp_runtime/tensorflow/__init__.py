"""The Horovod/SMDDP TensorFlow API on torch.distributed: ``import sdp_runtime.tensorflow as hvd``.

Works in eager mode and inside ``tf.function`` (not inside an XLA-compiled function: Keras ``fit``
keeps XLA around the collectives, see :mod:`sdp_runtime.tensorflow.keras.xla`), with Keras 3
variables. Keras ``model.fit`` helpers live in :mod:`sdp_runtime.tensorflow.keras`, also reachable
as ``hvd.keras`` (imported on first use).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from sdp_runtime._compat import NotProvidedError, global_process_set, not_provided
from sdp_runtime._output import rank0_print
from sdp_runtime._types import CommunicationError
from sdp_runtime.tensorflow.basics import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_rank_op,
    local_size,
    local_size_op,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    process_set_included_op,
    rank,
    rank_op,
    rocm_built,
    shutdown,
    size,
    size_op,
)
from sdp_runtime.tensorflow.collectives import (
    allgather,
    allgather_object,
    allreduce,
    barrier,
    broadcast,
    broadcast_,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
    grouped_allreduce,
    oob_allreduce,
    overlap,
)
from sdp_runtime.tensorflow.compression import (
    Average,
    Compression,
    Compressor,
    Max,
    Min,
    ReduceOp,
    Sum,
)
from sdp_runtime.tensorflow.data import shard, shared_seed
from sdp_runtime.tensorflow.exchange import (
    alltoall,
    grouped_allgather,
    grouped_reducescatter,
    reducescatter,
)
from sdp_runtime.tensorflow.optimizer import DistributedOptimizer
from sdp_runtime.tensorflow.tape import DistributedGradientTape

from .._order import rank0_first

#: Horovod's error for a failed collective: here, the runtime's own.
HorovodInternalError = CommunicationError

_not_provided = not_provided(__name__, "horovod.tensorflow")

__all__ = [
    "Average",
    "Compression",
    "Compressor",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "HorovodInternalError",
    "Max",
    "Min",
    "NotProvidedError",
    "ReduceOp",
    "Sum",
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_object",
    "broadcast_object_fn",
    "broadcast_variables",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "init",
    "is_homogeneous",
    "is_initialized",
    "local_rank",
    "local_rank_op",
    "local_size",
    "local_size_op",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "oob_allreduce",
    "overlap",
    "process_set_included_op",
    "rank",
    "rank0_first",
    "rank0_print",
    "rank_op",
    "reducescatter",
    "rocm_built",
    "shard",
    "shared_seed",
    "shutdown",
    "size",
    "size_op",
]


def __getattr__(name: str) -> ModuleType:
    # sdp-convert writes ``sdp.keras.DistributedOptimizer(...)`` and ``sdp.keras.callbacks...``
    # under ``import sdp_runtime.tensorflow as sdp`` alone. Imported here, on first use, so that
    # scripts without Keras never import it (and without a cycle: the package imports this one).
    if name == "keras":
        return importlib.import_module(f"{__name__}.keras")
    return _not_provided(name)  # Horovod's names it lacks: NotProvidedError, with advice
