"""Keras 3 helpers: ``import sdp_runtime.tensorflow.keras as hvd`` (horovod.tensorflow.keras).

Besides the basics and collectives of :mod:`sdp_runtime.tensorflow`, it has the Keras
``DistributedOptimizer``, :func:`load_model`, :func:`prepare_train_function` (``fit`` under XLA)
and the ``callbacks`` module
(``BroadcastGlobalVariablesCallback``, ``MetricAverageCallback``, ``LearningRateWarmupCallback``,
``LearningRateScheduleCallback``, ``BestModelCheckpoint``), and Horovod's build queries
(``nccl_built``, ``gloo_built``, ``mpi_built``, ...). ``allreduce`` and ``reducescatter`` take
Horovod's Keras argument order (``name`` second). Horovod names it does not provide raise
``NotProvidedError`` saying what to do instead.
"""

from __future__ import annotations

from sdp_runtime._compat import NotProvidedError, global_process_set, not_provided
from sdp_runtime._order import rank0_first
from sdp_runtime.tensorflow import (
    Average,
    Compression,
    HorovodInternalError,
    Max,
    Min,
    ReduceOp,
    Sum,
    allgather,
    allgather_object,
    barrier,
    broadcast,
    broadcast_object,
    broadcast_variables,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
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
    rank0_print,
    rocm_built,
    shard,
    shutdown,
    size,
)
from sdp_runtime.tensorflow.keras import callbacks
from sdp_runtime.tensorflow.keras.functions import allreduce, reducescatter
from sdp_runtime.tensorflow.keras.optimizer import DistributedOptimizer, load_model
from sdp_runtime.tensorflow.keras.xla import XlaWarning, prepare_train_function

__all__ = [
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "Max",
    "Min",
    "NotProvidedError",
    "ReduceOp",
    "Sum",
    "XlaWarning",
    "allgather",
    "allgather_object",
    "allreduce",
    "barrier",
    "broadcast",
    "broadcast_object",
    "broadcast_variables",
    "callbacks",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_initialized",
    "load_model",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "prepare_train_function",
    "rank",
    "rank0_first",
    "rank0_print",
    "reducescatter",
    "rocm_built",
    "shard",
    "shutdown",
    "size",
]

# Horovod names this package does not provide raise NotProvidedError, saying what to do instead.
__getattr__ = not_provided(__name__, "horovod.tensorflow.keras")
