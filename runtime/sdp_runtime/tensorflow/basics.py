"""Who am I: init, shutdown, size, rank, local_rank, ... (Horovod/SMDDP names).

The rank queries are the torch package's own (``sdp_runtime.torch.basics``: both frameworks
answer from ``sdp_runtime._comm``). ``init`` differs in one way, as in Horovod's TF API: a second
call does nothing; and ``shutdown`` also frees this package's reusable buffers.
"""

from __future__ import annotations

from typing import Any

from sdp_runtime import _comm
from sdp_runtime.tensorflow import buffers
from sdp_runtime.torch.basics import (
    cross_rank,
    cross_size,
    gloo_built,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    nccl_built,
    rank,
    size,
)

__all__ = [
    "cross_rank",
    "cross_size",
    "gloo_built",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_built",
    "nccl_built",
    "rank",
    "shutdown",
    "size",
]


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job (NCCL with a GPU, Gloo without); later calls do nothing.

    Rank and size come from ``sdp-run``/torchrun, SLURM or MPI variables; with none set the
    process is rank 0 of 1 and no launcher is needed. ``SDP_BACKEND`` forces a backend.

    Arguments:
        comm: Horovod's MPI communicator; must be None (there is no MPI here).
        process_sets: Horovod's process sets; must be None (one global set only).

    Example:
        >>> import sdp_runtime.tensorflow as sdp
        >>> sdp.init()
    """
    if comm is not None or process_sets is not None:
        raise ValueError("sdp_runtime has one global group only: call init() without arguments")
    if not _comm.is_initialized():
        _comm.init()


def shutdown() -> None:
    """Leave the job and free the reusable buffers; ``init()`` may be called again afterwards.

    Example:
        >>> sdp.shutdown()
    """
    buffers.clear()
    _comm.shutdown()
