"""Several modules, one program: the imports between the files of one run, and what one module's
conversion must know of the others.

``main.py`` iterates the loaders that ``data.get_loaders()`` builds. Converted one at a time,
``data.py`` trains nothing (left alone) and ``main.py`` builds no DataLoader (a manual note), so
every rank would train on all the data. As one program:

* ``data.py`` learns that the first loader ``get_loaders()`` returns feeds a training loop of
  ``main.py`` (``LoaderFeed``), and gives it its DistributedSampler where it is built;
* ``main.py`` learns that what ``data.get_loaders()`` returns at that position is sharded where it
  is built (``ShardedSource``): its epoch loop calls ``train_loader.sampler.set_epoch(epoch)``,
  its learning rate is scaled, and no "no DataLoader" note is written.

``Project`` resolves a qualified name as one file spells it (``data.get_loaders``,
``.data.get_loaders``, ``pkg.get_loaders`` through a package ``__init__`` that re-exports it) to the
file and the top-level function that define it; the run (``sdp_convert.projects``) asks each
training script which project functions feed its training loops, converts the modules that build
those loaders, and hands each file its ``ModuleFacts`` through ``Options.project``. The questions
below are asked by the transforms of one file about those facts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from ..modules import Project, module_name  # noqa: F401 - re-exported (its users import them here)
from .builders import conditional_statement
from .facts import (  # noqa: F401 - re-exported (the transforms import them here)
    Export,
    LoaderFeed,
    ModuleFacts,
    Repair,
    ShardedSource,
)
from .flow import Site, epoch_loop, follow, holds_only, range_loop_around, unpacked_target
from .index import file_index
from .loaders import sets_epoch
from .positions import node_positions
from .scopes import arguments_for, assigned_binding, binding_of, training_loops, uses
from .syntax import assigned_target, findall
from .training import training_facts

if TYPE_CHECKING:
    from .model import FileModel


# -- questions a transform asks about its file -------------------------------------------------


def module_facts(fm: FileModel) -> ModuleFacts | None:
    return fm.project


def result_sites(
    fm: FileModel, call: cst.Call, index: int | None
) -> tuple[list[Site], set[int]]:
    """The loops that iterate what ``call`` returns (``index``: the unpacked element), and every
    node its value was followed through."""
    sites: list[Site] = []
    seen: set[int] = set()
    if index is None:
        follow(fm, call, None, (), 1, sites, seen)
        return sites, seen
    target = _unpacked(fm, call)
    element = unpacked_target(fm, call, index, len(target)) if target is not None else None
    binding = binding_of(fm, element) if element is not None else None
    for use in uses(fm, binding) if binding is not None else ():
        follow(fm, use, binding, (), 1, sites, seen)
    return sites, seen


def _unpacked(fm: FileModel, call: cst.Call) -> list[cst.BaseElement] | None:
    assign = fm.parent(call)
    if not (isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1):
        return None
    target = assign.targets[0].target
    return list(target.elements) if isinstance(target, (cst.Tuple, cst.List)) else None


def _training_loops(fm: FileModel) -> set[cst.CSTNode]:
    """PyTorch: loops around ``backward()``/``step()``; TensorFlow: around the optimizer steps."""
    if fm.info.framework == "torch":
        return training_loops(fm)
    return {loop for site in training_facts(fm).sites for loop in site.loops}


def training_results(fm: FileModel, call: cst.Call) -> list[tuple[int | None, Site]]:
    """``(index, site)`` for each part of what ``call`` returns that a training loop iterates."""
    loops = _training_loops(fm)
    target = _unpacked(fm, call)
    indices: list[int | None] = list(range(len(target))) if target is not None else [None]
    found = []
    for index in indices:
        site = next((s for s in result_sites(fm, call, index)[0] if s.loop in loops), None)
        if site is not None:
            found.append((index, site))
    return found


def feeds_training(fm: FileModel, call: cst.Call, index: int | None) -> bool:
    """Whether a training loop of this file iterates what ``call`` returns (at ``index``)."""
    return any(i == index for i, _ in training_results(fm, call))


def single_process_fallback(
    fm: FileModel, sampler: str, call: str, args: list[str], shuffle: str
) -> cst.BaseStatement:
    """``sampler = (<call>(<args>) if sdp.is_initialized() else <what DataLoader would use>)``.

    For a module other code imports too: without ``init()`` (one process, an evaluation script)
    the loader keeps DataLoader's own sampler, ``RandomSampler`` for ``shuffle=True``, none
    (sequential) for ``shuffle=False``; with it, each rank reads its own shard."""
    torch = call.split(".", 1)[0]
    random = f"{torch}.utils.data.RandomSampler({args[0]})"
    if shuffle in ("False", "None", "0"):
        fallback = "None"
    elif shuffle == "True":
        fallback = random
    else:
        fallback = f"{random} if {shuffle} else None"
    return conditional_statement(fm, sampler, call, args, f"{fm.sdp}.is_initialized()", fallback)


def imported_data(fm: FileModel, loops: set[cst.CSTNode] | None = None) -> cst.Call | bool:
    """Loaders built in other modules that feed ``loops`` (default: every training loop of the
    file): False if none does; True if all are sharded where they are built (in this run, or
    already); else the first call whose loader is not."""
    loops = _training_loops(fm) if loops is None else loops
    found: cst.Call | bool = False
    for call, source in sourced_calls(fm):
        if any(s.loop in loops for s in result_sites(fm, call, source.index)[0]):
            if not source.sharded:
                return call
            found = True
    return found


def fed_returns(fm: FileModel) -> list[tuple[cst.Return, cst.BaseExpression, LoaderFeed]]:
    """``(return statement, returned value, feed)``: the values this module's functions return
    for another module's training loops (``index``: that element of a returned tuple)."""
    facts = module_facts(fm)
    found = []
    for feed in facts.feeds if facts is not None else ():
        function = next((s for s in fm.module.body if isinstance(s, cst.FunctionDef)
                         and s.name.value == feed.function), None)
        for ret in findall(function, cst.matchers.Return()) if function else ():
            assert isinstance(ret, cst.Return)
            value = ret.value
            if feed.index is not None:
                elements = value.elements if isinstance(value, cst.Tuple) else ()
                value = elements[feed.index].value if feed.index < len(elements) else None
            if value is not None and fm.enclosing_function(ret) is function:
                found.append((ret, value, feed))
    return found


def imported_sites(fm: FileModel) -> list[tuple[Site, ShardedSource]]:
    """The loops of this file that iterate data another module builds, and its facts."""
    return [
        (site, source)
        for call, source in sourced_calls(fm)
        for site in result_sites(fm, call, source.index)[0]
    ]


def returned_feed(fm: FileModel, call: cst.Call) -> LoaderFeed | None:
    """The ``LoaderFeed`` of this module that ``call`` (a DataLoader) is returned for."""
    facts = module_facts(fm)
    if facts is None or not facts.feeds:
        return None
    for function, index in returned_by(fm, call):
        for feed in facts.feeds:
            if feed.function == function and feed.index == index:
                return feed
    return None


def returned_by(fm: FileModel, call: cst.Call) -> list[tuple[str, int | None]]:
    """``(top-level function, tuple index or None)`` for each ``return`` that gives ``call``'s
    value (directly, or through the one name it is assigned to)."""
    nodes: list[cst.CSTNode] = [call]
    binding = assigned_binding(fm, call)
    if binding is not None:
        nodes += uses(fm, binding)
    found = []
    for node in nodes:
        parent = fm.parent(node)
        index: int | None = None
        if isinstance(parent, cst.Element) and isinstance(fm.parent(parent), cst.Tuple):
            container = fm.parent(parent)
            assert isinstance(container, cst.Tuple)
            index = next(i for i, e in enumerate(container.elements) if e is parent)
            node, parent = container, fm.parent(container)
        if not (isinstance(parent, cst.Return) and parent.value is node):
            continue
        function = fm.enclosing_function(node)
        if function is not None and isinstance(fm.parent(function), cst.Module):
            found.append((function.name.value, index))
    return found


def sourced_calls(fm: FileModel) -> list[tuple[cst.Call, ShardedSource]]:
    """Calls of this file whose results another module's conversion shards where they are built."""
    facts = module_facts(fm)
    found = []
    for source in facts.sources if facts is not None else ():
        for call in fm.calls_to(source.callee):
            found.append((call, source))
    return found


@dataclass
class ImportedLoaders:
    """This module's view of the loaders other modules build for its training loops."""

    #: Some feed a training loop here.
    feeds: bool = False
    #: Calls whose loaders the other module does not shard in this run (it is only read).
    unsharded: list[tuple[cst.Call, ShardedSource]] = field(default_factory=list)
    #: ``(epoch loop, "train_loader.sampler.set_epoch(epoch)", source)`` still to write.
    set_epochs: list[tuple[cst.For, str, ShardedSource]] = field(default_factory=list)


def imported_loaders(fm: FileModel) -> ImportedLoaders:
    """Which loaders built elsewhere feed this file's training, and where their ``set_epoch``
    goes (first in the epoch loop; none where that loop calls it already, or with no shuffle)."""
    found = ImportedLoaders()
    done: set[tuple[int, str]] = set()
    for call, source in sourced_calls(fm):
        if not feeds_training(fm, call, source.index):
            continue
        found.feeds = True
        if not source.sharded:
            found.unsharded.append((call, source))
            continue
        receivers = epoch_receivers(fm, call, source.index) if source.shuffles else []
        for loop, receiver, _site in receivers:
            target = loop.target
            if (id(loop), receiver) in done or not isinstance(loop.body, cst.IndentedBlock):
                continue
            done.add((id(loop), receiver))
            if not isinstance(target, cst.Name) or sets_epoch(fm, loop, receiver):
                continue
            found.set_epochs.append((loop, f"{receiver}.set_epoch({target.value})", source))
    return found


def epoch_receivers(
    fm: FileModel, call: cst.Call, index: int | None
) -> list[tuple[cst.For, str, Site]]:
    """``(epoch loop, code of the loader, site)``: where ``<loader>.sampler.set_epoch(epoch)``
    goes for a loader built in another module (the loop that drives each training site)."""
    loops = training_loops(fm)
    found = []
    sites, flow = result_sites(fm, call, index)
    for site in sites:
        if site.loop not in loops:
            continue
        where = epoch_loop(fm, site)
        if where is None or where[1] is None or not holds_only(fm, where[1], flow):
            continue
        found.append((where[0], f"{where[1].code}.sampler", site))
    return found


# -- repairs -------------------------------------------------------------------------------------


def repairs_of(fm: FileModel, kind: str) -> list[tuple[Repair, cst.CSTNode]]:
    """The repairs of ``kind`` asked of this file, each with the node it names (a call, a loop;
    the module for ``init``). A repair whose node is not found (the file changed) is left out."""
    facts = module_facts(fm)
    wanted = [r for r in facts.repairs if r.kind == kind] if facts is not None else []
    if not wanted:
        return []
    found: list[tuple[Repair, cst.CSTNode]] = []
    index = file_index(fm)
    for repair in wanted:
        if not repair.code:
            found.append((repair, fm.module))
            continue
        node = _repair_node(fm, index.by_type, repair)
        if node is not None:
            found.append((repair, node))
    return found


def _repair_node(fm: FileModel, by_type: dict, repair: Repair) -> cst.CSTNode | None:
    """The node a repair names: of its kind (a loop, a call), on its line, with its code, or
    (an earlier transform of the run rewrote it: ``tqdm(loader, disable=...)``) with the same
    head (the loop's target, the call's callee)."""
    text = " ".join(repair.code.split())
    # A name or attribute (``self.model`` of ``model, config = self.model, self.config``, where
    # a model is bound to the loop's local name): the value of an assignment on its line.
    dotted = all(part.isidentifier() for part in text.split("."))
    kinds: tuple[type, ...] = (
        (cst.For, cst.CompFor) if repair.code.startswith("for ")
        else (cst.Attribute, cst.Name) if dotted else (cst.Call,))
    nodes = [n for kind in kinds for n in by_type.get(kind, [])]
    if dotted:
        nodes = [n for n in nodes if assigned_target(fm, n) is not None]
    same = [n for n in nodes if " ".join(repair_code(fm, n).split()) == text]
    if len(same) == 1:
        return same[0]
    head = _head(text)
    near = same or [n for n in nodes if _head(" ".join(repair_code(fm, n).split())) == head]
    if not near:
        return None
    lines = _node_lines(fm, near)
    on_line = [n for n, line in zip(near, lines, strict=True) if line == repair.line]
    return on_line[0] if on_line else None


def _head(code: str) -> str:
    """``for x, y in`` of a loop's header; the callee of a call (``torch.nn.Linear``)."""
    if code.startswith("for "):
        return code.split(" in ", 1)[0]
    return code.split("(", 1)[0]


def repair_code(fm: FileModel, node: cst.CSTNode) -> str:
    """What a ``Repair`` names a node by: its code; a loop's header only (its body may carry
    the notes of an earlier conversion)."""
    if isinstance(node, (cst.For, cst.CompFor)):
        return f"for {fm.code(node.target)} in {fm.code(node.iter)}"
    return fm.code(node)


def _node_lines(fm: FileModel, nodes: list[cst.CSTNode]) -> list[int]:
    where = node_positions(fm.module, {id(n) for n in nodes})
    return [where.get(id(n), (1, 0))[0] for n in nodes]


@dataclass
class KnownLoader:
    """A loop of this file that reads a loader another module builds and splits (``Repair``
    ``known_loader``), and where its sampler's ``set_epoch`` goes."""

    loop: cst.For | cst.CompFor
    #: Where the loader is built (``data.py:30``), for the report.
    built_at: str
    #: The code of the sampler (``self.loader.sampler``) at ``epochs`` (or at the loop).
    receiver: str
    #: The ``for epoch in range(...)`` loop that takes the ``set_epoch``; None where none is
    #: found (in the loop's function, or around a call of it in this file).
    epochs: cst.For | None


_ITERATED = ("builtins.enumerate", "tqdm.tqdm", "tqdm.auto.tqdm", "builtins.iter")


def known_loaders(fm: FileModel) -> list[KnownLoader]:
    """The loops of this file the whole-program model found reading a loader split in another
    module whose sampler shuffles (one without: the same order every epoch is what the script
    asked for, and nothing is to be done but to say nothing); every such loop counts, for the
    "no DataLoader feeding this loop" question, in ``has_known_loaders``."""
    found = []
    for repair, loop in repairs_of(fm, "known_loader"):
        if not isinstance(loop, (cst.For, cst.CompFor)) or not repair.shuffle:
            continue
        iterable = loop.iter
        while isinstance(iterable, cst.Call) and iterable.args and fm.refers_to(
            iterable.func, *_ITERATED
        ):
            iterable = iterable.args[0].value
        where = _epoch_loop(fm, loop, iterable)
        receiver = f"{fm.code(where[1] if where else iterable).strip()}.sampler"
        found.append(KnownLoader(loop, repair.detail, receiver, where[0] if where else None))
    return found


def has_known_loaders(fm: FileModel) -> bool:
    return any(isinstance(loop, (cst.For, cst.CompFor))
               for _, loop in repairs_of(fm, "known_loader"))


def _epoch_loop(fm: FileModel, loop: cst.CSTNode, iterable: cst.BaseExpression
                ) -> tuple[cst.For, cst.BaseExpression] | None:
    """The ``for epoch in range(...)`` around ``loop`` and the expression holding the loader
    there: in the same function, or, where ``iterable`` is a parameter of the loop's function,
    around a call of it in this file (the argument it passes)."""

    def usable(epochs: cst.For | None) -> bool:
        return epochs is not None and isinstance(epochs.target, cst.Name) and isinstance(
            epochs.body, cst.IndentedBlock)

    epochs = range_loop_around(fm, loop)
    if usable(epochs):
        assert epochs is not None
        return epochs, iterable
    function = fm.enclosing_function(loop)
    if function is None or not isinstance(iterable, cst.Name) or not any(
        p.name.value == iterable.value for p in function.params.params
    ):
        return None
    for value, call in arguments_for(fm, function, iterable.value):
        epochs = range_loop_around(fm, call)
        if usable(epochs):
            assert epochs is not None
            return epochs, value
    return None
