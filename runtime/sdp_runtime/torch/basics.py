"""Initialisation and rank queries (Horovod's ``hvd.init``, ``hvd.rank``, ...)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .. import _comm
from .._compat import ADVICE, refuse


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job (NCCL with a GPU, Gloo without); later calls do nothing (as in Horovod).

    Arguments:
        comm: Horovod's MPI communicator; must be None (there is no MPI here).
        process_sets: Horovod's process sets; must be None or empty (one global set only:
            any other raises ``NotProvidedError``).

    Example:
        >>> import sdp_runtime.torch as sdp
        >>> sdp.init()
    """
    if process_sets:
        refuse("init(process_sets=...)", ADVICE["ProcessSet"])
    if comm is not None:
        raise ValueError("sdp_runtime uses no MPI communicator: call init() without comm=")
    if not _comm.is_initialized():  # a second init() does nothing, as in Horovod
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


def mpi_enabled() -> bool:
    """Always False: no MPI is used (Horovod's ``mpi_enabled``).

    Example:
        >>> sdp.mpi_enabled()
        False
    """
    return False


def mpi_threads_supported() -> bool:
    """Always False: no MPI is used (Horovod's ``mpi_threads_supported``).

    Example:
        >>> sdp.mpi_threads_supported()
        False
    """
    return False


def gloo_enabled() -> bool:
    """Whether Gloo carries collectives: always, for CPU tensors (Horovod's ``gloo_enabled``).

    Example:
        >>> sdp.gloo_enabled()
        True
    """
    return gloo_built()


def ccl_built() -> bool:
    """Always False: no oneCCL (Horovod's ``ccl_built``).

    Example:
        >>> sdp.ccl_built()
        False
    """
    return False


def ddl_built() -> bool:
    """Always False: no IBM DDL (Horovod's ``ddl_built``).

    Example:
        >>> sdp.ddl_built()
        False
    """
    return False


def cuda_built() -> bool:
    """Whether this torch was built with CUDA (Horovod's ``cuda_built``).

    Example:
        >>> sdp.cuda_built()
        False
    """
    return bool(torch.backends.cuda.is_built())


def rocm_built() -> bool:
    """Whether this torch was built with ROCm (Horovod's ``rocm_built``).

    Example:
        >>> sdp.rocm_built()
        False
    """
    return getattr(torch.version, "hip", None) is not None
