"""Initialisation and rank queries (Horovod's ``hvd.init``, ``hvd.rank``, ...)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .. import _comm


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job (NCCL with a GPU, Gloo without); every process calls it once, first.

    Arguments:
        comm: Horovod's MPI communicator; must be None (there is no MPI here).
        process_sets: Horovod's process sets; must be None (one global set only).

    Example:
        >>> import sdp_runtime.torch as sdp
        >>> sdp.init()
    """
    if comm is not None or process_sets is not None:
        raise ValueError("sdp_runtime has one global group only: call init() without arguments")
    _comm.init()


def shutdown() -> None:
    """Leave the job; ``init()`` may be called again afterwards.

    Example:
        >>> sdp.shutdown()
    """
    _comm.shutdown()


def is_initialized() -> bool:
    """Whether ``init()`` has run.

    Example:
        >>> sdp.is_initialized()
        True
    """
    return _comm.is_initialized()


def size() -> int:
    """Number of processes in the job.

    Example:
        >>> lr = 0.1 * sdp.size()
    """
    return _comm.size()


def rank() -> int:
    """This process's rank, from 0 to ``size() - 1``.

    Example:
        >>> if sdp.rank() == 0: torch.save(model.state_dict(), "model.pt")
    """
    return _comm.rank()


def local_size() -> int:
    """Number of processes on this machine.

    Example:
        >>> sdp.local_size()
        2
    """
    return _comm.local_size()


def local_rank() -> int:
    """This process's rank on its machine: the GPU it should use.

    Example:
        >>> torch.cuda.set_device(sdp.local_rank())
    """
    return _comm.local_rank()


def cross_size() -> int:
    """Number of machines (assuming the same number of processes on each).

    Example:
        >>> sdp.cross_size()
        1
    """
    return _comm.placement().num_nodes


def cross_rank() -> int:
    """Index of this process's machine.

    Example:
        >>> sdp.cross_rank()
        0
    """
    return _comm.placement().node_rank


def device() -> torch.device:
    """The device collectives use: ``cuda:<local rank>`` with NCCL, else ``cpu``.

    Example:
        >>> model.to(sdp.device())
    """
    return _comm.device()


def nccl_built() -> bool:
    """Whether NCCL can be used in this process (a CUDA build with a GPU).

    Example:
        >>> sdp.nccl_built()
        False
    """
    return bool(dist.is_nccl_available() and torch.cuda.is_available())


def gloo_built() -> bool:
    """Whether Gloo is available (always, on the platforms torch supports).

    Example:
        >>> sdp.gloo_built()
        True
    """
    return bool(dist.is_gloo_available())


def mpi_built() -> bool:
    """Always False: the runtime uses torch.distributed, not MPI.

    Example:
        >>> sdp.mpi_built()
        False
    """
    return False
