"""``smp.save`` / ``smp.load``: checkpoints written once, or one per shard (``partial=True``)."""

from __future__ import annotations

import os
from typing import Any

import torch

from ... import _comm
from . import state


def _partial_path(path: str | os.PathLike[str]) -> str:
    layout = state.layout()
    return f"{os.fspath(path)}_{layout.rank % layout.shard_size}"


_PARTIAL_ADVICE = (
    "Every rank holding a shard of the model writes its own file: call smp.save(..., "
    "partial=True) on every rank, outside any rank test (only the first replica's ranks write)"
)


def save(obj: Any, f: str | os.PathLike[str] | Any, partial: bool = True, **kwargs: Any) -> None:
    """``torch.save`` for SMP: ``partial=False`` writes ``f`` once, on rank 0 (a whole state:
    ``model.state_dict()`` loads into the plain model); ``partial=True`` writes this shard's
    ``f_<shard>`` (``_<mp_rank>`` as SMP names it) on the ranks of the first replica only, which
    must all call it (one that does not gives ``CommunicationError`` after half of
    ``SDP_TIMEOUT``, not a checkpoint missing its shard).

    Arguments:
        obj: what to save (``{"model_state_dict": model.state_dict(), ...}``).
        f: the file name (a file object is written once, on rank 0, whatever ``partial``).
        partial: one file per shard (SMP's default) or one file.
        **kwargs: given to ``torch.save`` (``pickle_module``, ``pickle_protocol``).

    Example:
        >>> smp.save({"model_state_dict": model.state_dict()}, "model.pt", partial=False)
    """
    layout = state.layout()
    if partial and isinstance(f, (str, os.PathLike)):
        if layout.rank < layout.shard_size:
            # A shard missing from the checkpoint would only show when resuming: stop here.
            _comm.meet("smp.save(partial=True)", range(layout.shard_size), _PARTIAL_ADVICE)
            torch.save(obj, _partial_path(f), **kwargs)
    elif layout.rank == 0:  # one file (a file object: always one)
        torch.save(obj, f if not isinstance(f, (str, os.PathLike)) else os.fspath(f), **kwargs)


def load(f: str | os.PathLike[str], map_location: Any = None, partial: bool = True,
         **kwargs: Any) -> Any:
    """``torch.load`` for SMP: ``partial=True`` reads this shard's ``f_<shard>``.

    Example:
        >>> checkpoint = smp.load("model.pt", partial=False)
        >>> model.load_state_dict(checkpoint["model_state_dict"])
    """
    path = _partial_path(f) if partial else os.fspath(f)
    if map_location is None:
        map_location = _comm.device()
    kwargs.setdefault("weights_only", False)
    return torch.load(path, map_location=map_location, **kwargs)
