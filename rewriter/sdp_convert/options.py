"""What the user asked for, as the engine reads it: in a module of its own, without libcst, so that
the command line and the cache (``cache``) can build and key options without loading the engine.
``sdp_convert.base`` re-exports both names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["LrScaling", "Options"]

LrScaling = Literal["linear", "sqrt", "none"]


@dataclass(frozen=True)
class Options:
    """What the user asked for. ``only``/``skip`` hold transform names."""

    lr_scaling: LrScaling = "linear"
    framework: Literal["auto", "torch", "tensorflow"] = "auto"
    #: What prints on rank 0 only: progress bars (tqdm), also ``print`` calls ("all"), or nothing.
    rank0_output: Literal["progress", "all", "none"] = "progress"
    only: frozenset[str] = frozenset()
    skip: frozenset[str] = frozenset()
    #: Run the transforms on a script that uses sdp_runtime already (normally left alone): the
    #: engine's check that a conversion is a fixed point, and tests of the same.
    recheck: bool = False
    #: The file of this run that imports this one and runs it in torch.multiprocessing workers
    #: sharing one model (Hogwild, ``siblings``): this file is then parallel already.
    parallel_importer: str = ""
