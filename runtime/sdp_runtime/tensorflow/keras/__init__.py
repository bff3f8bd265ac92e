"""Keras 3 helpers: ``import sdp_runtime.tensorflow.keras as hvd`` (horovod.tensorflow.keras).

Besides the basics and collectives of :mod:`sdp_runtime.tensorflow`, it has the Keras
``DistributedOptimizer``, :func:`load_model`, :func:`prepare_train_function` (``fit`` under XLA)
and the ``callbacks`` module
(``BroadcastGlobalVariablesCallback``, ``MetricAverageCallback``, ``LearningRateWarmupCallback``,
``LearningRateScheduleCallback``), and Horovod's build queries (``nccl_built``, ``gloo_built``,
``mpi_built``).
"""

from __future__ import annotations

from sdp_runtime._order import rank0_first
from sdp_runtime.tensorflow import (
    Average,
    Compression,
    Max,
    Min,
    ReduceOp,
    Sum,
    allgather,
    allreduce,
    barrier,
    broadcast,
    broadcast_object,
    broadcast_variables,
    gloo_built,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    nccl_built,
    rank,
    rank0_print,
    shard,
    shutdown,
    size,
)
from sdp_runtime.tensorflow.keras import callbacks
from sdp_runtime.tensorflow.keras.optimizer import DistributedOptimizer, load_model
from sdp_runtime.tensorflow.keras.xla import XlaWarning, prepare_train_function

__all__ = [
    "Average",
    "Compression",
    "DistributedOptimizer",
    "Max",
    "Min",
    "ReduceOp",
    "Sum",
    "XlaWarning",
    "allgather",
    "allreduce",
    "barrier",
    "broadcast",
    "broadcast_object",
    "broadcast_variables",
    "callbacks",
    "gloo_built",
    "init",
    "is_initialized",
    "load_model",
    "local_rank",
    "local_size",
    "mpi_built",
    "nccl_built",
    "prepare_train_function",
    "rank",
    "rank0_print",
    "rank0_first",
    "shard",
    "shutdown",
    "size",
]
