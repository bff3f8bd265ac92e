"""Who am I: init, shutdown, size, rank, local_rank, ... (Horovod/SMDDP names).

The rank queries are the torch package's own (``sdp_runtime.torch.basics``: both frameworks
answer from ``sdp_runtime._comm``). ``init`` differs in one way, as in Horovod's TF API: a second
call does nothing; and ``shutdown`` also frees this package's reusable buffers.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from sdp_runtime import _comm
from sdp_runtime._compat import ADVICE, check_process_set, refuse
from sdp_runtime.tensorflow import buffers
from sdp_runtime.torch.basics import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    size,
)

__all__ = [
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "gloo_built",
    "gloo_enabled",
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
    "process_set_included_op",
    "rank",
    "rank_op",
    "rocm_built",
    "shutdown",
    "size",
    "size_op",
]


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job (NCCL with a GPU, Gloo without); later calls do nothing.

    Rank and size come from ``sdp-run``/torchrun, SLURM or MPI variables; with none set the
    process is rank 0 of 1 and no launcher is needed. ``SDP_BACKEND`` forces a backend.

    Arguments:
        comm: Horovod's MPI communicator; must be None (there is no MPI here).
        process_sets: Horovod's process sets; must be None or empty (one global set only:
            any other raises ``NotProvidedError``).

    Example:
        >>> import sdp_runtime.tensorflow as sdp
        >>> sdp.init()
    """
    if process_sets:
        refuse("init(process_sets=...)", ADVICE["ProcessSet"])
    if comm is not None:
        raise ValueError("sdp_runtime uses no MPI communicator: call init() without comm=")
    if not _comm.is_initialized():
        _comm.init()


def shutdown() -> None:
    """Leave the job and free the reusable buffers; ``init()`` may be called again afterwards.

    Example:
        >>> sdp.shutdown()
    """
    buffers.clear()
    _comm.shutdown()


def is_homogeneous() -> bool:
    """Whether every machine runs as many processes: always true of ``sdp-run`` (Horovod's).

    Example:
        >>> sdp.is_homogeneous()
        True
    """
    return _comm.size() % _comm.local_size() == 0


def _int_op(value: int, name: str | None) -> tf.Tensor:
    return tf.constant(value, dtype=tf.int32, name=name)


def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """``size()`` as an int32 tensor (Horovod's op for graphs).

    Arguments:
        process_set_id: 0 (the global set) only.
        name: the constant's name.

    Example:
        >>> n = sdp.size_op()
    """
    check_process_set(None if process_set_id == 0 else process_set_id, "size_op")
    return _int_op(_comm.size(), name)


def local_size_op(name: str | None = None) -> tf.Tensor:
    """``local_size()`` as an int32 tensor.

    Example:
        >>> n = sdp.local_size_op()
    """
    return _int_op(_comm.local_size(), name)


def rank_op(name: str | None = None) -> tf.Tensor:
    """``rank()`` as an int32 tensor.

    Example:
        >>> r = sdp.rank_op()
    """
    return _int_op(_comm.rank(), name)


def local_rank_op(name: str | None = None) -> tf.Tensor:
    """``local_rank()`` as an int32 tensor.

    Example:
        >>> r = sdp.local_rank_op()
    """
    return _int_op(_comm.local_rank(), name)


def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """1 as an int32 tensor: every process is in the global set, the only one.

    Example:
        >>> sdp.process_set_included_op()
    """
    check_process_set(None if process_set_id == 0 else process_set_id, "process_set_included_op")
    return _int_op(1, name)
