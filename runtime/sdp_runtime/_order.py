"""Work that each machine's local rank 0 does first: downloads into a shared directory."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from . import _comm


@contextlib.contextmanager
def rank0_first() -> Iterator[None]:
    """Run the block on each machine's local rank 0 first, then on the other ranks.

    The others wait at the start; when local rank 0 is done they run the block too and find what
    it left (a dataset already downloaded and unpacked), instead of every rank writing the same
    files at once. Accelerate's ``main_process_first()`` and Lightning's ``prepare_data`` do the
    same. With one process it only runs the block.

    Example:
        >>> with sdp.rank0_first():
        ...     train_set = datasets.MNIST("data", train=True, download=True)
    """
    first = _comm.local_rank() == 0
    if _comm.alone():
        yield
        return
    if not first:
        _comm.barrier()
    try:
        yield
    finally:
        if first:
            _comm.barrier()
