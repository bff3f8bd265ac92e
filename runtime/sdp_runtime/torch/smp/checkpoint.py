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


# -- save_checkpoint / resume_from_checkpoint -----------------------------------------------------

_NEWEST = "newest"
_CHECKPOINT_ADVICE = (
    "smp.save_checkpoint saves the state of every shard of the model: call it on every rank, "
    "outside any rank test, with the same tag (rank 0 writes what is written once)"
)


def save_checkpoint(path: str | os.PathLike[str], tag: str, partial: bool = True,
                    model: Any = None, optimizer: Any = None, user_content: Any = None,
                    translate_if_full: bool = True,
                    num_kept_partial_checkpoints: int | None = None) -> None:
    """Save a checkpoint as SMP lays it out, on every rank together.

    ``partial=True``: ``path/<tag>_partial/`` holds ``model_<shard>.pt`` and
    ``optimizer_<shard>.pt`` (``local_state_dict()`` of each shard, written by the ranks of the
    first replica) and ``user_content.pt``. ``partial=False``: ``path/<tag>`` is the whole
    model's ``state_dict()`` (the plain module's keys: it loads into the model without SMP; no
    optimizer state, as in SMP's full checkpoints) and ``path/user_content_<tag>`` the user
    content. Both write ``path/newest`` (the tag), which ``resume_from_checkpoint`` reads.

    Arguments:
        path: the directory (created if missing).
        tag: the checkpoint's name, the same on every rank (``f"total_steps{step}"``).
        partial: one file per shard (resumable with the same configuration) or the whole model.
        model, optimizer: ``smp.DistributedModel`` / ``smp.DistributedOptimizer`` (None: not
            saved).
        user_content: anything picklable, returned by ``resume_from_checkpoint``.
        translate_if_full: SMP's translation to Hugging Face names; the state here already has
            the module's own names.
        num_kept_partial_checkpoints: keep only this many partial checkpoints in ``path``.

    Raises:
        CommunicationError: a rank did not call it (see ``smp.save``).

    Example:
        >>> smp.save_checkpoint("ckpt", tag=f"total_steps{step}", partial=True, model=model,
        ...                     optimizer=optimizer, user_content={"step": step})
    """
    layout = state.layout()
    root = os.fspath(path)
    _comm.meet(f"smp.save_checkpoint({tag!r})", range(layout.size), _CHECKPOINT_ADVICE)
    if partial:
        folder = os.path.join(root, f"{tag}_partial")
        shard = layout.rank % layout.shard_size
        if layout.rank < layout.shard_size:
            os.makedirs(folder, exist_ok=True)
            if model is not None:
                torch.save(model.local_state_dict(), os.path.join(folder, f"model_{shard}.pt"))
            if optimizer is not None:
                torch.save(optimizer.local_state_dict(),
                           os.path.join(folder, f"optimizer_{shard}.pt"))
        if layout.rank == 0:
            torch.save({"user_content": user_content, "shards": layout.shard_size},
                       os.path.join(folder, "user_content.pt"))
    else:
        whole = model.state_dict() if model is not None else None  # every rank: gathered
        if layout.rank == 0:
            os.makedirs(root, exist_ok=True)
            if whole is not None:
                torch.save(whole, os.path.join(root, tag))
            torch.save(user_content, os.path.join(root, f"user_content_{tag}"))
    if layout.size > 1:
        _comm.barrier()  # every shard is written before ``newest`` names the checkpoint
    if layout.rank == 0:
        with open(os.path.join(root, _NEWEST), "w") as f:
            f.write(tag)
        if partial and num_kept_partial_checkpoints:
            _prune(root, num_kept_partial_checkpoints)


def _prune(root: str, keep: int) -> None:
    import shutil

    found = [os.path.join(root, d) for d in os.listdir(root)
             if d.endswith("_partial") and os.path.isfile(os.path.join(root, d, "user_content.pt"))]
    found.sort(key=os.path.getmtime)
    for folder in found[:-keep]:
        shutil.rmtree(folder, ignore_errors=True)


def resume_from_checkpoint(path: str | os.PathLike[str], tag: str | None = None,
                           partial: bool = True, strict: bool = True, load_optimizer: bool = True,
                           load_sharded_optimizer_state: bool = True,
                           translate_function: Any = None) -> Any:
    """Load a ``save_checkpoint`` checkpoint into the ``smp.DistributedModel`` and
    ``smp.DistributedOptimizer`` of this script (call it after both are made, on every rank)
    and return its user content.

    Arguments:
        path: the directory given to ``save_checkpoint``.
        tag: the checkpoint (None: the newest, from ``path/newest``).
        partial: a partial checkpoint (saved with the same number of shards: the same
            configuration and number of processes) or a full one (the model only; also one
            written by ``smp.save(model.state_dict(), path/tag, partial=False)``).
        strict: no missing or unexpected keys in the model's state.
        load_optimizer, load_sharded_optimizer_state: load the optimizer's state (partial).
        translate_function: applied to a full checkpoint's state before it is loaded.

    Raises:
        FileNotFoundError: no such checkpoint (or no ``newest`` file).
        ValueError: a partial checkpoint saved with another number of shards.

    Example:
        >>> user_content = smp.resume_from_checkpoint("ckpt", partial=True)
        >>> step = user_content["step"]
    """
    from .model import current_model, current_optimizer

    model, optimizer = current_model(), current_optimizer()
    if model is None:
        raise RuntimeError("smp.resume_from_checkpoint: make the smp.DistributedModel (and "
                           "smp.DistributedOptimizer) first, then resume")
    root = os.fspath(path)
    if tag is None:
        newest = os.path.join(root, _NEWEST)
        if not os.path.isfile(newest):
            raise FileNotFoundError(f"smp.resume_from_checkpoint: no checkpoint in {root} "
                                    f"({newest} is missing)")
        with open(newest) as f:
            tag = f.read().strip()
    layout = state.layout()
    device = _comm.device()
    if not partial:
        whole = torch.load(os.path.join(root, tag), map_location=device, weights_only=False)
        if translate_function is not None:
            whole = translate_function(whole)
        model.load_state_dict(whole, strict=strict)
        content = os.path.join(root, f"user_content_{tag}")
        return (torch.load(content, map_location="cpu", weights_only=False)
                if os.path.isfile(content) else None)
    folder = os.path.join(root, f"{tag}_partial")
    meta = torch.load(os.path.join(folder, "user_content.pt"), map_location="cpu",
                      weights_only=False)
    if meta["shards"] != layout.shard_size:
        raise ValueError(
            f"smp.resume_from_checkpoint: {folder} was saved with {meta['shards']} shard(s) of "
            f"the model, this job has {layout.shard_size}; resume with the configuration and "
            "number of processes it was saved with, or save a full checkpoint (partial=False)")
    shard = layout.rank % layout.shard_size
    model_file = os.path.join(folder, f"model_{shard}.pt")
    if os.path.isfile(model_file):
        model.load_state_dict(torch.load(model_file, map_location=device, weights_only=False),
                              strict=strict)
    optimizer_file = os.path.join(folder, f"optimizer_{shard}.pt")
    if optimizer is not None and load_optimizer and os.path.isfile(optimizer_file):
        optimizer.load_state_dict(torch.load(optimizer_file, map_location=device,
                                             weights_only=False))
    return meta["user_content"]
