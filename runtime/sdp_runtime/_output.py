"""Printing on rank 0 only: ``sdp.rank0_print`` (what ``sdp-convert --rank0-output all`` writes)."""

from __future__ import annotations

import builtins
from typing import Any

from . import _comm, _env


def rank0_print(*args: Any, **kwargs: Any) -> None:
    """``print`` on rank 0 only (every rank before ``init()``: the rank from the launcher's
    environment then).

    Arguments:
        *args, **kwargs: as for ``print``.

    Example:
        >>> sdp.rank0_print(f"epoch {epoch}: loss {loss:.4f}")
    """
    rank = _comm.rank() if _comm.is_initialized() else _env.detect().rank
    if rank == 0:
        builtins.print(*args, **kwargs)
