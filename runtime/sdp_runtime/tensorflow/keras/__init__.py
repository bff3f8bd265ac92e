"""Keras 3 helpers: ``import sdp_runtime.tensorflow.keras as hvd`` (horovod.tensorflow.keras).

Besides the basics and collectives of :mod:`sdp_runtime.tensorflow`, it has the Keras
``DistributedOptimizer``, :func:`load_model`, :func:`prepare_train_function` (``fit`` under XLA)
and the ``callbacks`` module
(``BroadcastGlobalVariablesCallback``, ``MetricAverageCallback``, ``LearningRateWarmupCallback``).
"""

from __future__ import annotations

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
    init,
    is_initialized,
    local_rank,
    local_size,
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
    "init",
    "is_initialized",
    "load_model",
    "local_rank",
    "local_size",
    "prepare_train_function",
    "rank",
    "rank0_print",
    "shard",
    "shutdown",
    "size",
]
