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

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from ..base import Transform
from ..siblings import is_package_folder
from .flow import Site, epoch_loop, follow, holds_only, unpacked_target
from .loaders import sets_epoch
from .scopes import assigned_binding, binding_of, training_loops, uses


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

    @property
    def roles(self) -> frozenset[str]:
        """What this module does for the others, though it trains nothing itself."""
        return frozenset(
            {"data"} if self.feeds else set()) | ({"entry"} if self.starts else set())


@dataclass(frozen=True)
class Export:
    """A loader a producer's conversion sharded (or found sharded) for a ``LoaderFeed``."""

    function: str
    index: int | None
    line: int
    shuffles: bool
    #: It had its DistributedSampler before this conversion.
    already: bool = False


# -- import resolution -------------------------------------------------------------------------


@dataclass
class Project:
    """The Python files of one run, by module name, and the names their packages re-export."""

    files: Mapping[Path, bytes]
    _modules: dict[str, Path] = field(default_factory=dict)
    _names: dict[Path, str] = field(default_factory=dict)
    _trees: dict[Path, ast.Module | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seen: dict[str, list[Path]] = {}
        for path in self.files:
            name = module_name(path)
            self._names[path] = name
            seen.setdefault(name, []).append(path)
        # Two files that would be the same module (two scripts' folders): neither is resolved.
        self._modules = {name: paths[0] for name, paths in seen.items() if len(paths) == 1}

    def name_of(self, path: Path) -> str:
        return self._names[path]

    def resolve(self, path: Path, qualified: str) -> tuple[Path, str] | None:
        """The file and top-level name that ``qualified`` (as ``path`` spells it) refers to."""
        absolute = self._absolute(path, qualified)
        return self._lookup(absolute, 0) if absolute else None

    def module_file(self, path: Path, qualified: str) -> Path | None:
        """The file of the module ``qualified`` names (``pkg.trainer.__module__`` or
        ``.trainer.__module__``: the suffix marks a module, not a name in it)."""
        absolute = self._absolute(path, qualified.removesuffix(".__module__"))
        if absolute is None:
            return None
        return self._modules.get(absolute) or self._modules.get(absolute + ".__init__")

    def _absolute(self, path: Path, qualified: str) -> str | None:
        level = len(qualified) - len(qualified.lstrip("."))
        if not level:
            return qualified
        package = self._names[path].split(".")
        if path.name != "__init__.py":
            package = package[:-1]
        if level - 1 > len(package) or (level > 1 and level - 1 == len(package)):
            return None
        base = package[: len(package) - (level - 1)]
        return ".".join([*base, qualified[level:]]) if base else qualified[level:]

    def _lookup(self, absolute: str, depth: int) -> tuple[Path, str] | None:
        parts = absolute.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module = self._modules.get(".".join(parts[:cut]))
            if module is None:
                continue
            rest = parts[cut:]
            if len(rest) != 1:
                return None
            return self._definition(module, rest[0], depth)
        return None

    def _definition(self, module: Path, name: str, depth: int) -> tuple[Path, str] | None:
        tree = self.tree(module)
        if tree is None:
            return None
        for stmt in reversed(tree.body):  # the last top-level binding wins
            if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)) and stmt.name == name:
                return module, name
            if isinstance(stmt, ast.ImportFrom) and depth < 5:
                for alias in stmt.names:
                    if (alias.asname or alias.name) != name or stmt.module is None:
                        continue
                    source = "." * stmt.level + stmt.module + "." + alias.name
                    absolute = self._absolute(module, source)
                    return self._lookup(absolute, depth + 1) if absolute else None
            if _binds(stmt, name):
                return None  # assigned some other way: not followed
        return None

    def writing_callback(self, path: Path, name: str) -> bool:
        """Whether ``name`` is a Keras callback class of ``path`` that writes files (it opens a
        file to write or append, or saves: ``open(p, "a")``, ``model.save(...)``, ...)."""
        tree = self.tree(path)
        cls = next((s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == name),
                   None) if tree is not None else None
        if cls is None or not any(_name_of(b).endswith("Callback") for b in cls.bases):
            return False
        return any(_writes(node) for node in ast.walk(cls))

    def writing_function(self, path: Path, name: str) -> bool:
        """Whether ``name`` is a module-level function of ``path`` that writes files
        (``save_checkpoint(model, path)`` around ``torch.save``)."""
        tree = self.tree(path)
        function = next((s for s in tree.body if isinstance(s, ast.FunctionDef)
                         and s.name == name), None) if tree is not None else None
        return function is not None and any(_writes(node) for node in ast.walk(function))

    def tree(self, path: Path) -> ast.Module | None:
        """The ``ast`` of a file (parsed once; None if it does not parse)."""
        if path not in self._trees:
            try:
                self._trees[path] = ast.parse(self.files[path])
            except (SyntaxError, ValueError, RecursionError, MemoryError):  # not parsed
                self._trees[path] = None
        return self._trees[path]


#: Methods and functions that write files (``program.writes`` holds the full vocabulary, by
#: qualified name; a callback class in another module is read with ``ast``, names only).
_WRITING_CALLS = frozenset({"save", "save_weights", "savez", "savetxt", "to_csv", "dump",
                            "write_text", "write_bytes", "imwrite", "savefig"})


def _name_of(expr: ast.expr) -> str:
    return expr.attr if isinstance(expr, ast.Attribute) else getattr(expr, "id", "")


def _writes(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    name = _name_of(node.func)
    if name == "open" and isinstance(node.func, ast.Name):
        modes = [a for a in node.args[1:2]] + [k.value for k in node.keywords if k.arg == "mode"]
        return any(
            isinstance(m, ast.Constant) and isinstance(m.value, str) and set(m.value) & set("wax")
            for m in modes
        )
    return name in _WRITING_CALLS


def _binds(stmt: ast.stmt, name: str) -> bool:
    targets: Iterable[ast.expr] = ()
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        targets = (stmt.target,)
    return any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t))


def module_name(path: Path) -> str:
    """``src/pkg/data.py`` -> ``pkg.data`` when ``src/pkg`` holds an ``__init__.py``."""
    parts = [path.stem] if path.name != "__init__.py" else []
    folder = path.parent
    while is_package_folder(folder) and folder.name:
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts) or path.parent.name


# -- questions a transform asks about its file -------------------------------------------------


def module_facts(t: Transform) -> ModuleFacts | None:
    return t.state.options.project


def result_sites(
    t: Transform, call: cst.Call, index: int | None
) -> tuple[list[Site], set[int]]:
    """The loops that iterate what ``call`` returns (``index``: the unpacked element), and every
    node its value was followed through."""
    sites: list[Site] = []
    seen: set[int] = set()
    if index is None:
        follow(t, call, None, (), 1, sites, seen)
        return sites, seen
    target = _unpacked(t, call)
    element = unpacked_target(t, call, index, len(target)) if target is not None else None
    binding = binding_of(t, element) if element is not None else None
    for use in uses(t, binding) if binding is not None else ():
        follow(t, use, binding, (), 1, sites, seen)
    return sites, seen


def _unpacked(t: Transform, call: cst.Call) -> list[cst.BaseElement] | None:
    assign = t.parent(call)
    if not (isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1):
        return None
    target = assign.targets[0].target
    return list(target.elements) if isinstance(target, (cst.Tuple, cst.List)) else None


def _training_loops(t: Transform) -> set[cst.CSTNode]:
    """PyTorch: loops around ``backward()``/``step()``; TensorFlow: around the optimizer steps."""
    if t.state.info.framework == "torch":
        return training_loops(t)
    from .training import training_facts  # (tensorflow) builds on this module's neighbours

    return {loop for site in training_facts(t).sites for loop in site.loops}


def training_results(t: Transform, call: cst.Call) -> list[tuple[int | None, Site]]:
    """``(index, site)`` for each part of what ``call`` returns that a training loop iterates."""
    loops = _training_loops(t)
    target = _unpacked(t, call)
    indices: list[int | None] = list(range(len(target))) if target is not None else [None]
    found = []
    for index in indices:
        site = next((s for s in result_sites(t, call, index)[0] if s.loop in loops), None)
        if site is not None:
            found.append((index, site))
    return found


def feeds_training(t: Transform, call: cst.Call, index: int | None) -> bool:
    """Whether a training loop of this file iterates what ``call`` returns (at ``index``)."""
    return any(i == index for i, _ in training_results(t, call))


def single_process_fallback(
    t: Transform, sampler: str, call: str, args: list[str], shuffle: str
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
    step = t.module.default_indent
    return cst.parse_statement(
        f"{sampler} = (\n{step}{call}(\n{step * 2}{', '.join(args)}\n{step})\n"
        f"{step}if {t.sdp}.is_initialized()\n{step}else {fallback}\n)\n"
    )


def imported_data(t: Transform, loops: set[cst.CSTNode] | None = None) -> cst.Call | bool:
    """Loaders built in other modules that feed ``loops`` (default: every training loop of the
    file): False if none does; True if all are sharded where they are built (in this run, or
    already); else the first call whose loader is not."""
    loops = _training_loops(t) if loops is None else loops
    found: cst.Call | bool = False
    for call, source in sourced_calls(t):
        if any(s.loop in loops for s in result_sites(t, call, source.index)[0]):
            if not source.sharded:
                return call
            found = True
    return found


def fed_returns(t: Transform) -> list[tuple[cst.Return, cst.BaseExpression, LoaderFeed]]:
    """``(return statement, returned value, feed)``: the values this module's functions return
    for another module's training loops (``index``: that element of a returned tuple)."""
    facts = module_facts(t)
    found = []
    for feed in facts.feeds if facts is not None else ():
        function = next((s for s in t.module.body if isinstance(s, cst.FunctionDef)
                         and s.name.value == feed.function), None)
        for ret in cst.matchers.findall(function, cst.matchers.Return()) if function else ():
            assert isinstance(ret, cst.Return)
            value = ret.value
            if feed.index is not None:
                elements = value.elements if isinstance(value, cst.Tuple) else ()
                value = elements[feed.index].value if feed.index < len(elements) else None
            if value is not None and t.enclosing_function(ret) is function:
                found.append((ret, value, feed))
    return found


def imported_sites(t: Transform) -> list[tuple[Site, ShardedSource]]:
    """The loops of this file that iterate data another module builds, and its facts."""
    return [
        (site, source)
        for call, source in sourced_calls(t)
        for site in result_sites(t, call, source.index)[0]
    ]


def returned_feed(t: Transform, call: cst.Call) -> LoaderFeed | None:
    """The ``LoaderFeed`` of this module that ``call`` (a DataLoader) is returned for."""
    facts = module_facts(t)
    if facts is None or not facts.feeds:
        return None
    for function, index in returned_by(t, call):
        for feed in facts.feeds:
            if feed.function == function and feed.index == index:
                return feed
    return None


def returned_by(t: Transform, call: cst.Call) -> list[tuple[str, int | None]]:
    """``(top-level function, tuple index or None)`` for each ``return`` that gives ``call``'s
    value (directly, or through the one name it is assigned to)."""
    nodes: list[cst.CSTNode] = [call]
    binding = assigned_binding(t, call)
    if binding is not None:
        nodes += uses(t, binding)
    found = []
    for node in nodes:
        parent = t.parent(node)
        index: int | None = None
        if isinstance(parent, cst.Element) and isinstance(t.parent(parent), cst.Tuple):
            container = t.parent(parent)
            assert isinstance(container, cst.Tuple)
            index = next(i for i, e in enumerate(container.elements) if e is parent)
            node, parent = container, t.parent(container)
        if not (isinstance(parent, cst.Return) and parent.value is node):
            continue
        function = t.enclosing_function(node)
        if function is not None and isinstance(t.parent(function), cst.Module):
            found.append((function.name.value, index))
    return found


def sourced_calls(t: Transform) -> list[tuple[cst.Call, ShardedSource]]:
    """Calls of this file whose results another module's conversion shards where they are built."""
    facts = module_facts(t)
    found = []
    for source in facts.sources if facts is not None else ():
        for call in t.calls_to(source.callee):
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


def imported_loaders(t: Transform) -> ImportedLoaders:
    """Which loaders built elsewhere feed this file's training, and where their ``set_epoch``
    goes (first in the epoch loop; none where that loop calls it already, or with no shuffle)."""
    found = ImportedLoaders()
    done: set[tuple[int, str]] = set()
    for call, source in sourced_calls(t):
        if not feeds_training(t, call, source.index):
            continue
        found.feeds = True
        if not source.sharded:
            found.unsharded.append((call, source))
            continue
        receivers = epoch_receivers(t, call, source.index) if source.shuffles else []
        for loop, receiver, _site in receivers:
            target = loop.target
            if (id(loop), receiver) in done or not isinstance(loop.body, cst.IndentedBlock):
                continue
            done.add((id(loop), receiver))
            if not isinstance(target, cst.Name) or sets_epoch(t, loop, receiver):
                continue
            found.set_epochs.append((loop, f"{receiver}.set_epoch({target.value})", source))
    return found


def epoch_receivers(
    t: Transform, call: cst.Call, index: int | None
) -> list[tuple[cst.For, str, Site]]:
    """``(epoch loop, code of the loader, site)``: where ``<loader>.sampler.set_epoch(epoch)``
    goes for a loader built in another module (the loop that drives each training site)."""
    loops = training_loops(t)
    found = []
    sites, flow = result_sites(t, call, index)
    for site in sites:
        if site.loop not in loops:
            continue
        where = epoch_loop(t, site)
        if where is None or where[1] is None or not holds_only(t, where[1], flow):
            continue
        found.append((where[0], f"{where[1].code}.sampler", site))
    return found
