"""What the user asked for, as the engine reads it: in a module of its own, without libcst, so that
the command line and the cache (``cache``) can build and key options without loading the engine.
``sdp_convert.base`` re-exports both names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # program.project imports libcst: not at run time, here
    from .program.facts import ModuleFacts

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
    #: The file's own line length (``formatting.line_length_for``): changed lines longer than
    #: this are formatted with black (``formatting.format_changed``).
    line_length: int = 88
    #: What the other modules of the project say about this one (``program.project``): loaders
    #: it builds for another module's training loop, loaders built elsewhere that it iterates.
    #: None: the file is converted on its own. Not part of a cache key: these facts follow from
    #: the contents of the project's files, whose digests the runner passes as the key's deps.
    project: ModuleFacts | None = field(default=None, metadata={"cache_key": False})
