"""What a project run tells one module's conversion, as data (no libcst here: a warm run reads
the contract's answers, repairs included, from the cache without loading the converter).

``ModuleFacts`` (``Options.project``) holds what the other modules of the run say about a module:
the loaders it builds for another module's loop (``LoaderFeed``), the loaders built elsewhere
that it iterates (``ShardedSource``), the entry points that run it, and the edits the
whole-program contract asks of it (``Repair``). The questions a transform asks about them are
``program.project``'s."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Repair:
    """An edit the whole-program contract asks of this module, where a part of the program is
    missing (``sdp_convert.projects`` hands it over, then checks the program again).

    ``kind`` says what (``wrap_model``: wrap the model made by the call at ``line`` in
    ``DistributedDataParallel``; ``shard_loader``: give the DataLoader built there a
    DistributedSampler; ``set_epoch``: call the sampler's ``set_epoch`` in the epoch loop around
    the loop at ``line``; ``scale_lr``: scale the learning rate of the optimizer made there;
    ``distributed_compile``: wrap the optimizer ``compile`` gets there; ``shard_dataset``: shard
    the ``tf.data`` pipeline made there (by ``program.tfshards``' rules); ``shard_arguments``:
    split the arrays the call there passes to another module's builder of the training and
    other data (``detail``: ``builder:0,1``, the builder's name and the arguments' positions);
    ``sort_listing``: sort the file paths listed by the call there (they are split, at
    ``detail``); ``partly_split``: the data of the loop (or ``fit``) there is split on some of
    the paths that bind it only (``detail``: which, for its notes);
    ``broadcast_callback``: give that ``fit`` rank 0's
    weights; ``init``: initialise the runtime in this entry point). ``line`` is a line of the file
    as the user wrote it, ``code`` the code of the node there (both find it again);
    ``detail``: where the part is trained (``learner.py:18``), for the report."""

    kind: str
    path: Path
    line: int
    code: str
    detail: str = ""
    #: ``known_loader``: the loader's sampler shuffles (its ``set_epoch`` matters).
    shuffle: bool = True
    #: ``init``: the framework of the training the entry point runs (``torch``,
    #: ``tensorflow``), for an entry that imports none itself.
    framework: str = ""


@dataclass(frozen=True)
class LoaderFeed:
    """A loader a top-level function of this module returns (``index``: its position in the
    returned tuple; None: the whole value) feeds a training loop of another module."""

    function: str
    index: int | None
    #: Where the other module receives it (``main.py:38``), for the report.
    used_by: str


@dataclass(frozen=True)
class ShardedSource:
    """What ``callee()`` returns (at ``index``) is a loader sharded where it is built, in another
    module: this module's epoch loop calls its sampler's ``set_epoch``."""

    #: The callee's qualified name as this module spells it (``data.get_loaders``).
    callee: str
    index: int | None
    #: Where the loader is built (``data.py:19``), for the report.
    at: str
    #: Its sampler shuffles (set_epoch is needed).
    shuffles: bool
    #: The loader gets its sampler in this run, or has one already. False: the module that builds
    #: it is not converted in this run (a file given alone): nothing here may assume it.
    sharded: bool = True


@dataclass(frozen=True)
class ModuleFacts:
    """What the other modules of the project say about one module (``Options.project``)."""

    feeds: tuple[LoaderFeed, ...] = ()
    sources: tuple[ShardedSource, ...] = ()
    #: An entry point: the training modules (library modules, no entry point of their own) it
    #: imports and runs; ``sdp.init()`` goes here.
    starts: tuple[str, ...] = ()
    #: A training module without an entry point: the entry points that run it (and initialise).
    started_by: tuple[str, ...] = ()
    #: The framework of the training modules an entry point runs.
    framework: str | None = None
    #: Keras callbacks other modules define that write files (qualified names as this module
    #: spells them): like ModelCheckpoint, this script adds them on rank 0 only.
    rank0_callbacks: tuple[str, ...] = ()
    #: Functions other modules define that write files (``utils.save_checkpoint``): this
    #: module's calls of them run on rank 0 only, like ``torch.save``.
    writers: tuple[str, ...] = ()
    #: Classes other modules define whose instances write files as they are used (a logger that
    #: opens its file in ``__init__``): made on rank 0 only, like an open file.
    handles: tuple[str, ...] = ()
    #: Imported by a training script of the run: its own directory creation gets exist_ok=True
    #: (harmless for any other importer, one process or many).
    helper: bool = False
    #: Classes other modules define that hold an optimizer and step it in their own methods
    #: (``ScheduledOptim.step_and_update_lr()``): (qualified name as this module spells it, the
    #: module's display name, the methods that step, whether it writes ``param_group["lr"]``).
    optimizer_wrappers: tuple[tuple[str, str, tuple[str, ...], bool], ...] = ()
    #: Edits the whole-program contract asks of this module (``Repair``).
    repairs: tuple[Repair, ...] = ()
    #: Functions other modules define that run what every rank must run together
    #: (``validation(model, ...)`` running the model's forward, a barrier): (qualified name as
    #: this module spells it, the calls on the way inside it when each parameter is handed a
    #: wrapped model (``("model(...)",)``), whether it reaches one without being handed any).
    #: Such a call never goes onto rank 0 alone (``program.ranks.reaches_collective``).
    collective_helpers: tuple[tuple[str, tuple[str, ...], bool], ...] = ()
    #: Names its star imports of project modules bring from outside the project, with their
    #: qualified names there (``("ModelCheckpoint", "keras.callbacks.ModelCheckpoint")``).
    star_names: tuple[tuple[str, str], ...] = ()
    #: For a module that distributes itself: the literal values the modules it imports give
    #: attributes of a configuration object at their top level (``config.train.distributed =
    #: False`` in ``config/defaults.py``), as (the attribute path less its root,
    #: ``"train.distributed"``, the value as code, where: ``"config/defaults.py:176"``); a path
    #: given two different values is left out.
    attribute_defaults: tuple[tuple[str, str, str], ...] = ()

    @property
    def roles(self) -> frozenset[str]:
        """What this module does for the others, though it trains nothing itself: ``data``,
        ``entry``, ``helper``, and ``repair:<kind>`` for each repair asked of it (an
        ``init`` repair makes it an entry)."""
        kinds = {f"repair:{r.kind}" for r in self.repairs}
        entry = bool(self.starts) or any(r.kind == "init" for r in self.repairs)
        return frozenset(
            {"data"} if self.feeds else set()) | ({"entry"} if entry else set()) | (
            {"helper"} if self.helper else set()) | kinds


@dataclass(frozen=True)
class Export:
    """A loader a producer's conversion sharded (or found sharded) for a ``LoaderFeed``."""

    function: str
    index: int | None
    line: int
    shuffles: bool
    #: It had its DistributedSampler before this conversion.
    already: bool = False
