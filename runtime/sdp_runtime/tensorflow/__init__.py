"""The Horovod/SMDDP TensorFlow API on torch.distributed: ``import sdp_runtime.tensorflow as hvd``.

Works in eager mode and inside ``tf.function`` (not inside an XLA-compiled function: Keras ``fit``
keeps XLA around the collectives, see :mod:`sdp_runtime.tensorflow.keras.xla`), with Keras 3
variables. Keras ``model.fit`` helpers live in :mod:`sdp_runtime.tensorflow.keras`, also reachable
as ``hvd.keras`` (imported on first use).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from sdp_runtime._output import rank0_print
from sdp_runtime.tensorflow.basics import (
    cross_rank,
    cross_size,
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
from sdp_runtime.tensorflow.collectives import (
    allgather,
    allgather_object,
    allreduce,
    barrier,
    broadcast,
    broadcast_object,
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
from sdp_runtime.tensorflow.data import shard
from sdp_runtime.tensorflow.optimizer import DistributedOptimizer
from sdp_runtime.tensorflow.tape import DistributedGradientTape

from .._order import rank0_first

__all__ = [
    "Average",
    "Compression",
    "Compressor",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "Max",
    "Min",
    "ReduceOp",
    "Sum",
    "allgather",
    "allgather_object",
    "allreduce",
    "barrier",
    "broadcast",
    "broadcast_object",
    "broadcast_variables",
    "cross_rank",
    "cross_size",
    "gloo_built",
    "grouped_allreduce",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_built",
    "nccl_built",
    "oob_allreduce",
    "overlap",
    "rank",
    "rank0_print",
    "rank0_first",
    "shard",
    "shutdown",
    "size",
]


def __getattr__(name: str) -> ModuleType:
    # sdp-convert writes ``sdp.keras.DistributedOptimizer(...)`` and ``sdp.keras.callbacks...``
    # under ``import sdp_runtime.tensorflow as sdp`` alone. Imported here, on first use, so that
    # scripts without Keras never import it (and without a cycle: the package imports this one).
    if name == "keras":
        return importlib.import_module(f"{__name__}.keras")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
