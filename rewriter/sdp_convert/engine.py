"""Convert one file: parse, classify, run the pipeline in one traversal, verify, return.

The pipeline's transforms share one metadata resolution of the original tree and run together in
one traversal (``_Traversal``): each ``leave_*`` hook of each transform sees the original node
(whose metadata and position are known) and the node as rewritten by the transforms before it.
Statement edits go through the shared ``EditPlan``, applied here once per statement body, so edits
of different transforms compose. Positions are computed only when something is reported.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.codemod.visitors._add_imports import _GatherTopImportsBeforeStatements
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider

from . import inserted, rebuild
from .analysis import Detector, FileInfo, detect, steps_in_wrapper, worth_parsing
from .base import FileState, Options, Transform
from .changes import Change, ConversionError
from .compiles import check as _check_syntax  # CPython's own verdict, its message
from .formatting import format_changed
from .longparse import parse_module
from .pipeline import PIPELINE
from .program.builders import rank0_test
from .program.index import FileIndex, index_module
from .program.model import FileModel
from .program.positions import node_positions
from .program.project import Export, training_results
from .program.sharding import input_optimisation
from .program.syntax import walk

__all__ = ["Options", "Result", "convert"]


@dataclass
class Result:
    """The outcome of converting one source."""

    source: bytes
    output: bytes
    info: FileInfo
    changes: list[Change] = field(default_factory=list)
    #: Project mode: loaders this file shards for another module (``program.project.Export``).
    exports: list[Export] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.output != self.source

    @property
    def manual(self) -> list[Change]:
        return [c for c in self.changes if c.manual]


def convert(source: bytes | str, options: Options | None = None) -> Result:
    """Convert one Python source. Raises ``ConversionError`` for input that cannot be handled.

    The output parses, and converting it again changes nothing (checked here, not assumed).
    """
    options = options or Options()
    data = source.encode("utf-8") if isinstance(source, str) else source
    result = _convert_once(data, options)
    if result.changed:
        _release_tree(result.info)
        result.output = format_changed(data, result.output, options.line_length)
        try:
            # A vanilla script's conversion goes through the same transforms again, which must
            # find nothing to do (a user's later run leaves any sdp_runtime script alone).
            again = _check_once(
                result.output, replace(options, recheck=result.info.origin == "vanilla")
            )
        except ConversionError as err:  # pragma: no cover - would be a bug in a transform
            raise ConversionError(f"internal error: converted code does not parse: {err}") from err
        if again.changed:
            # The transforms saw the program differently in their own output (a name they
            # resolve only after their edits: an unusual import alias, a star import). Half a
            # conversion is worse than none: the file stays as it was, and the report says why.
            return Result(data, data, result.info, [_unstable(data, again.changes)])
        _release_tree(again.info)  # the check's tree, kept by its parents map: not needed now
        broken = inserted.problems(data, result.output, dropped_names(result.changes),
                                   getattr(options.project, "collective_helpers", ()))
        if broken:
            # Inserted code that would break the program (a NameError, a deadlock): the file
            # stays as it was, and the report says where and why.
            return Result(data, data, result.info, [_breaks(line, why) for line, why in broken])
    return result


def _release_tree(info: FileInfo) -> None:
    """Drop what the file's detection kept of the first pass's tree (every node's parent, the
    calls by name): nothing reads them after the pass, and they would keep that whole tree
    alive while the second pass builds its own (peak memory of a long file)."""
    info.parents, info.calls, info.method_calls, info.call_order = {}, {}, {}, {}
    info.distributed_at = None


#: The comment that starts each cell of a notebook's program (``notebook.notebook_program``).
CELL_MARK = "# -- sdp-convert cell {} --"


def _starts_cell(stmt: cst.CSTNode) -> bool:
    """Whether ``stmt`` is the first statement of a notebook cell (its cell's marker above it)."""
    start = CELL_MARK.split("{")[0]
    return any(line.comment is not None and line.comment.value.startswith(start)
               for line in getattr(stmt, "leading_lines", ()))


def dropped_names(changes: Sequence[Change]) -> set[str]:
    """Names a migration drops on purpose (``join`` from ``from horovod.torch import join``),
    named in its manual note: the person fixes their uses, so the check of the inserted code
    does not hold them against the conversion. Only a migration's notes count: any other note
    naming ``tf`` (``tf.data``, ``tf.summary``) must not excuse a pinning that reads ``tf``
    before the file imports it (yolov3-tf2: NameError on every run, unreported)."""
    return {
        w
        for c in changes
        if c.manual and c.transform.startswith("migrate_")
        for w in re.findall(r"\w+", c.message)
    }


def _breaks(line: int, why: str) -> Change:
    return Change(
        1, 1, "sdp_convert",
        f"not converted: {why} (line {line} of the conversion, which is not written); "
        "please report it, and convert this file by hand meanwhile",
        manual=True,
    )


#: Methods that train: with the framework only behind a star import, the file may be a script.
_TRAINING_METHODS = ({"backward", "step"}, {"apply_gradients"}, {"compile", "fit"})


def _hidden_framework(info: FileInfo) -> list[Change]:
    """A note for a file that trains through names a star import brings (``from utils import
    *`` where ``utils`` imports torch): the converter cannot see what they are."""
    if info.framework is not None or not info.star_imports or not any(
        names <= info.method_calls.keys() for names in _TRAINING_METHODS
    ):
        return []
    star = ", ".join(f"from {m} import *" for m in info.star_imports)
    return [Change(
        1, 1, "sdp_convert",
        f"not converted: it seems to train, but its framework comes in through {star}, whose "
        "names the converter cannot see; import torch / tensorflow (and what the file uses) by "
        "name, then convert again",
        manual=True,
    )]


def _unstable(data: bytes, again: list[Change]) -> Change:
    star = b"import *" in data
    if star:
        why = (
            "names come in through a star import (from ... import *) that the converter cannot "
            "follow; import what the file uses by name, then convert again (or convert by hand)"
        )
    else:
        # What the second pass still wanted to do, by transform: the lines are those of the
        # converted text, which is not written, so they are not given.
        still = sorted({c.transform for c in again if not c.manual})
        why = (
            f"a second pass would still change it ({', '.join(still) or 'its notes'}): a "
            "converter bug; please report it with the file, and convert by hand meanwhile"
        )
    return Change(
        1, 1, "sdp_convert",
        f"not converted: converting the result again would change it, so the conversion is not "
        f"safe: {why}",
        manual=True,
    )


def _parse(data: bytes) -> cst.Module:
    if b"\0" in data[:8192]:
        raise ConversionError("binary file (contains NUL bytes)")
    try:
        return parse_module(data)  # libcst's parse, a piece at a time for a long file
    except cst.ParserSyntaxError as err:
        _check_syntax(data)  # CPython's message is clearer ("Missing parentheses in call...")
        message = err.message.split(": expected one of")[0]
        raise ConversionError(
            f"syntax error: {message}", err.raw_line, err.raw_column + 1
        ) from None
    except (UnicodeDecodeError, LookupError, SyntaxError) as err:
        raise ConversionError(f"cannot decode file: {err}") from err


class _Changed(Exception):
    """Raised by ``_Probe`` at the first hook that returns a node other than the one given."""


class _Probe:
    """The fixed-point check's walk: every transform's hooks in the order and on the nodes of
    ``_Traversal``, read-only (``program.syntax.walk``), each ``leave_*`` hook given the node
    itself as its updated node. A hook that returns anything else (a new node, a removal, a
    flattening) stops the walk: the check then runs the real traversal (``_check_once``)."""

    def __init__(self, traversal: _Traversal) -> None:
        self.visits = traversal.visits
        self.leaves = traversal.leaves

    def on_visit(self, node: cst.CSTNode) -> bool:
        for hook in self.visits.get(type(node).__name__, ()):
            hook(node)
        return True

    def on_leave(self, node: cst.CSTNode) -> None:
        for hook in self.leaves.get(type(node).__name__, ()):
            if hook(node, node) is not node:
                raise _Changed


def _check_once(data: bytes, options: Options) -> Result:
    """What ``_convert_once(data, options)`` says of ``data``, a conversion's output, for the
    fixed-point check: whether it would change it (``changed``) and what it would report (the
    transforms and kinds; the positions are not worked out, nothing reads them).

    It first runs the pass with a read-only walk instead of libcst's rebuilding traversal. That
    walk can answer "unchanged" only where the real pass's output is ``data`` byte for byte:
    every hook returned the node it was given (so the real traversal's tree is a copy of the
    parsed one, whose code is ``data``: libcst's round trip), no statement edit was planned, and
    libcst's import adder, asked of the parsed tree, adds nothing. Anything else, and the real
    pass runs and decides, as before (docs/how-it-works.md, "The fixed-point check")."""
    try:
        result = _convert_once(data, options, probe=True)
    except _Changed:
        return _convert_once(data, options)
    return result


def _convert_once(data: bytes, options: Options, *, probe: bool = False) -> Result:
    roles = options.project.roles if options.project is not None else frozenset()
    if not roles and not worth_parsing(data):
        # Cheap path: nothing here can be a training script, so it is left alone byte for byte;
        # CPython's own parser (many times faster than libcst's) still reports broken files.
        _check_syntax(data)
        return Result(data, data, FileInfo(reason="no training step"))
    module = _parse(data)
    wrapper, index, metadata, info = _read(
        module, options.framework, options.recheck,
        options.project.star_names if options.project is not None else (),
    )
    if options.project is not None:
        steps_in_wrapper(info, options.project.optimizer_wrappers)
        if info.framework is None and "repair:fetch" in roles:
            # A data module naming no framework (``torchvision`` alone): the program's.
            info.framework = next((r.framework for r in options.project.repairs
                                   if r.kind == "fetch" and r.framework), None)  # type: ignore[assignment]
        if "repair:init" in roles:
            # The entry point of a program that trains in other modules (a notebook driving
            # them, a module-level script): the whole-program contract says so.
            info.entry_point = True
            if info.framework is None:
                info.framework = next((r.framework for r in options.project.repairs
                                       if r.kind == "init" and r.framework), None)  # type: ignore[assignment]
        if "repair:keras_fit" in roles and info.framework in (None, "tensorflow") and (
            info.vanilla
        ):
            info.framework = "tensorflow"
            # Its model is compiled in another module (the whole-program contract followed it
            # there): a Keras training script all the same.
            info.training = info.uses_fit = True
            info.reason = info.reason or "fits a Keras model compiled in another module"
    if options.parallel_importer and info.origin == "vanilla":
        info.origin = "distributed"
        info.reason = (
            f"torch.multiprocessing workers of {options.parallel_importer}, which imports this "
            "module (Hogwild)"
        )

    # A module that builds another module's training data but trains nothing itself gets only
    # the edits that data needs (a sampler): no init(), no guards, nothing at import time. The
    # entry point that runs another module's training code gets init() (and GPU pinning).
    # (Converted already, it uses sdp_runtime: its loaders are then reported as sharded.)
    if roles and not info.training and not info.excluded and info.origin in ("vanilla", "sdp"):
        assert options.project is not None
        if info.framework is None and options.project.framework in ("torch", "tensorflow"):
            info.framework = options.project.framework  # type: ignore[assignment]
    else:
        roles = frozenset()
    selected = [
        cls
        for cls in PIPELINE
        if (
            cls.applies_to(info)
            or (roles & cls.PROJECT_ROLES and info.framework in cls.FRAMEWORKS)
        )
        and (not options.only or cls.NAME in options.only)
        and cls.NAME not in options.skip
    ]
    if not selected:
        return Result(data, data, info, _hidden_framework(info))

    context = CodemodContext(wrapper=wrapper)
    model = FileModel(module, info, index, project=options.project, skip=options.skip)
    state = FileState(model=model, options=options)
    state.runtime_alias = _runtime_alias(index, state.runtime_module)
    transforms = [cls(context, state) for cls in selected]
    for transform in transforms:
        transform.metadata = metadata  # type: ignore[assignment]  # one resolution for all
    refused = _not_data_parallel(model, module)
    if refused:
        return Result(data, data, info, refused)
    for transform in transforms:
        transform.prepare(module)

    skipped = _opted_out(wrapper, data)
    traversal = _Traversal(transforms, state, skipped)
    if probe:
        walk(module, _Probe(traversal))
        if state.edits or _add_imports(context, module, state.runtime_module) is not module:
            raise _Changed
        # Every hook kept its node, and the imports scheduled are there: the real pass's output
        # is the input. Its report is what was recorded (the transforms and kinds the real pass
        # gives; the lines are not needed).
        if skipped:
            inside = {id(n) for stmt in skipped for n in _subtree(stmt)}
            state.records = [r for r in state.records if id(r[0]) not in inside]
        changes = sorted({Change(1, 1, transform, message, manual)
                          for _node, transform, message, manual in state.records})
        return Result(data, data, info, changes)
    new_module = rebuild.visit(module, traversal)
    assert isinstance(new_module, cst.Module)
    new_module = _add_imports(context, new_module, state.runtime_module)

    if skipped:
        # What was said about code the user opted out of is dropped with the edits; when no
        # edit is left, imports scheduled for them must not be written either.
        inside = {id(n) for stmt in skipped for n in _subtree(stmt)}
        state.records = [r for r in state.records if id(r[0]) not in inside]
        if not any(not manual for *_, manual in state.records):
            new_module = module
    changes = _positions(module, state.records)
    exports = _exports(module, state)
    output = new_module.bytes if state.records or state.edits else data
    if new_module is module:
        output = data
    if output != data and not any(not c.manual for c in changes):
        # Edits without a report would be a silent change; refuse rather than hide it.
        raise ConversionError("internal error: a transform changed code without reporting it")
    return Result(data, output, info, changes, exports)


def _add_imports(context: CodemodContext, module: cst.Module, runtime_module: str) -> cst.Module:
    """``module`` with the imports the transforms scheduled; ``module`` itself when there are
    none, or all are there. libcst's own import scheduling, without transform_module's deep copy
    of the tree; its visit_Module walks the whole tree to read the leading imports only: it gets
    those. (What it decides depends on the statements' code, not on which node objects hold it:
    the fixed-point check asks it of the parsed tree in place of the real pass's copy.)"""
    if not context.scratch.get(AddImportsVisitor.CONTEXT_KEY):
        return module
    adder = _ImportAdder(context)
    leading = _leading_imports(module) + _runtime_imports(module, runtime_module)
    adder.visit_Module(module.with_changes(body=leading))
    return adder.leave_Module(module, module)


def _exports(module: cst.Module, state: FileState) -> list[Export]:
    """Where the loaders sharded for other modules are built (their lines, for the reports)."""
    if not state.facts.exports:
        return []
    where = _lines(module, [call for call, *_ in state.facts.exports])
    return [
        Export(function, index, where[i], shuffles, already)
        for i, (_call, function, index, shuffles, already) in enumerate(state.facts.exports)
    ]


def _lines(module: cst.Module, nodes: list[cst.CSTNode]) -> list[int]:
    """The line each of ``nodes`` starts on (1 where it has none), by ``_positions``."""
    found = _positions(module, [(node, "", str(i), False) for i, node in enumerate(nodes)])
    where = {int(c.message): c.line for c in found}
    return [where.get(i, 1) for i in range(len(nodes))]


def _not_data_parallel(fm: FileModel, module: cst.Module) -> list[Change]:
    """A note for a torch script whose optimizers train input tensors, not a model, on no data
    (``program.sharding.input_optimisation``: neural style transfer optimises an image): not
    data-parallel as written, so left as it is."""
    if fm.info.framework != "torch" or not fm.info.convertible:
        return []
    tensor = input_optimisation(fm)
    if tensor is None:
        return []
    name = module.code_for_node(tensor)
    return _positions(module, [(tensor, "sdp_convert", (
        f"not converted: the optimizer trains {name}, an input tensor, not a model's parameters "
        "(as style transfer does): there is no data to split between processes, every rank "
        "would compute the same thing; run it on one process"
    ), True)])


def _read(
    module: cst.Module, force: Literal["auto", "torch", "tensorflow"], recheck: bool,
    star_names: Sequence[tuple[str, str]] = (),
) -> tuple[MetadataWrapper, FileIndex, dict[Any, Mapping[cst.CSTNode, object]], FileInfo]:
    """One walk of ``module``: its binding index and qualified names, and what the file is
    (detection rides along that walk); the metadata the transforms read. ``star_names``: what
    names its star imports of project modules bring (``ModuleFacts.star_names``)."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    detector = Detector()
    index = index_module(module, detector)
    if star_names:
        assert index.names is not None
        index.names.star_names = dict(star_names)
    metadata = _resolve(wrapper, index)
    return wrapper, index, metadata, detect(module, metadata, force, recheck, detector)


def _resolve(wrapper: MetadataWrapper, index: FileIndex) -> dict[Any, Mapping[cst.CSTNode, object]]:
    """The metadata the transforms declare, resolved once. Qualified names are the index's
    (``program.names``: libcst's answers, without its scope analysis, about three parses a pass),
    worked out node by node when asked."""
    deps = {dep for cls in PIPELINE for dep in cls.get_inherited_dependencies()}
    deps.discard(QualifiedNameProvider)
    metadata: dict[Any, Mapping[cst.CSTNode, object]] = (
        dict(wrapper.resolve_many(deps)) if deps else {}
    )
    assert index.names is not None
    metadata[QualifiedNameProvider] = index.names
    return metadata


class _ImportAdder(AddImportsVisitor):
    """libcst's ``AddImportsVisitor``, of which the engine calls ``visit_Module`` and
    ``leave_Module`` once per converted file.

    Its matcher base class searches ``dir()`` of every new instance for ``@visit``/``@leave``
    decorated methods: some 3,300 attributes of a transformer, about 7 ms, as long as libcst
    takes to parse a 100-line file. The class has no such method, so an empty ``dir()`` gives
    the same (empty) answer at no cost; nothing else reads the instance's ``dir()``.
    """

    def __dir__(self) -> list[str]:
        return []

    # libcst finds where the imports go with its sequence matcher (``_skip_first``), which
    # recurses once per statement of the module after a docstring: a module of a few hundred
    # statements runs out of stack. These two methods give libcst's answers by iterating.

    def visit_Module(self, node: cst.Module) -> None:
        """libcst's: what is scheduled less what the imports at the top (after a docstring or
        ``__strict__`` flag) bring already. Its gatherer is given only those imports, so that
        its matcher never recurses, and is one without the ``dir()`` search (``_TopImports``)."""
        start = 1 if _docstring_first(node.body) else 0
        end = _import_run_end(node.body, start)
        gatherer = _TopImports(self.context)
        node.with_changes(body=node.body[start:end]).visit(gatherer)
        self.all_imports = gatherer.all_imports
        self.module_imports = self.module_imports - gatherer.module_imports
        for module, alias in gatherer.module_aliases.items():
            if self.module_aliases.get(module) == alias:
                del self.module_aliases[module]
        for module, aliases in gatherer.alias_mapping.items():
            for pair in aliases:
                if pair in self.alias_mapping.get(module, []):
                    self.alias_mapping[module].remove(pair)
                    if not self.alias_mapping[module]:
                        del self.alias_mapping[module]
        for module, imports in gatherer.object_mapping.items():
            if module not in self.module_mapping:
                continue
            if "*" in imports:
                del self.module_mapping[module]
                continue
            self.module_mapping[module] = self.module_mapping[module] - imports
            if not self.module_mapping[module]:
                del self.module_mapping[module]

    def _split_module(
        self, orig_module: cst.Module, updated_module: cst.Module
    ) -> tuple[list[Any], list[Any], list[Any]]:
        """What goes before the new imports (a docstring), the imports they follow, the rest."""
        start = 1 if _docstring_first(orig_module.body) else 0
        end = _import_run_end(orig_module.body, start)
        body = list(updated_module.body)
        return body[:start], body[start:end], body[end:]


class _TopImports(_GatherTopImportsBeforeStatements):
    """libcst's gatherer of the imports at the top of a module, without the ``dir()`` search
    for decorated methods its matcher base class makes per instance (it has none): that search
    cost about as much as the rest of a small file's import scheduling."""

    def __dir__(self) -> list[str]:
        return []


def _docstring_first(body: Sequence[cst.BaseStatement]) -> bool:
    """libcst's ``_skip_first``: the module starts with a docstring or a ``__strict__ = ...``
    line (one statement on the line), before which no import goes."""
    first = body[0] if body else None
    if not isinstance(first, cst.SimpleStatementLine) or len(first.body) != 1:
        return False
    small = first.body[0]
    if isinstance(small, cst.Expr):
        return isinstance(small.value, cst.SimpleString)
    return (
        isinstance(small, cst.Assign) and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
        and small.targets[0].target.value == "__strict__"
    )


def _import_run_end(body: Sequence[cst.BaseStatement], start: int) -> int:
    """The end of the run of lines holding one import each from ``start`` on."""
    end = start
    while (
        end < len(body) and isinstance(body[end], cst.SimpleStatementLine)
        and len(body[end].body) == 1  # type: ignore[attr-defined]
        and isinstance(body[end].body[0], (cst.Import, cst.ImportFrom))  # type: ignore[attr-defined]
    ):
        end += 1
    return end


def _leading_imports(module: cst.Module) -> list[cst.BaseStatement]:
    """The statements AddImportsVisitor reads: a docstring, then the imports before any code."""
    body = list(module.body)
    end = 0
    for i, stmt in enumerate(body):
        if not isinstance(stmt, cst.SimpleStatementLine):
            break
        small = stmt.body[0] if stmt.body else None
        if isinstance(small, (cst.Import, cst.ImportFrom)) or (
            i == 0 and isinstance(small, cst.Expr) and isinstance(small.value, cst.SimpleString)
        ) or (isinstance(small, cst.Assign) and "__strict__" in module.code_for_node(small)):
            end = i + 1
            continue
        break
    return body[:end]


def _runtime_imports(module: cst.Module, runtime_module: str) -> list[cst.BaseStatement]:
    """Top-level imports of the runtime after the leading imports (``add_runtime_init`` puts its
    import after the script's environment settings): the runtime is imported already."""
    found: list[cst.BaseStatement] = []
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine) and any(
            isinstance(small, cst.Import)
            and any(
                cst.helpers.get_full_name_for_node(a.name) == runtime_module for a in small.names
            )
            for small in stmt.body
        ):
            found.append(stmt)
    return found


def _runtime_alias(index: FileIndex, runtime_module: str) -> str:
    """The name the runtime is imported as: ``sdp`` unless the file uses that name already."""
    names = index.names
    assert names is not None
    bound = list(names.module_bindings())
    for name, _node, imported in bound:
        if imported and runtime_module in {q.name for q in names.module_names(name)}:
            return name
    taken = {name for name, _, _ in bound}
    for candidate in ("sdp", "sdp_rt", "sdp_runtime_"):
        if candidate not in taken:
            return candidate
    return "sdp_runtime_"  # pragma: no cover


#: ``# sdp-convert: skip`` on a statement's line (a compound statement's header line) leaves that
#: statement, with its body, as it is.
_OPT_OUT = re.compile(r"#\s*sdp-convert:\s*skip\b")


def _opted_out(wrapper: MetadataWrapper, data: bytes) -> set[cst.CSTNode]:
    """The statements a ``# sdp-convert: skip`` comment opts out of conversion."""
    if b"sdp-convert" not in data:  # positions cost about two parses: only when needed
        return set()
    positions = wrapper.resolve(PositionProvider)
    lines = {
        positions[node].start.line
        for node in positions
        if isinstance(node, cst.Comment) and _OPT_OUT.match(node.value)
    }
    skipped: set[cst.CSTNode] = set()
    for node, where in positions.items() if lines else ():
        if isinstance(node, cst.SimpleStatementLine):
            first, last = where.start.line, where.end.line
        elif isinstance(node, cst.BaseCompoundStatement):
            decorators = getattr(node, "decorators", ())
            first = positions[decorators[0]].start.line if decorators else where.start.line
            body = positions[node.body]
            last = body.start.line - 1 if isinstance(node.body, cst.IndentedBlock) else (
                body.end.line
            )
        else:
            continue
        if any(first <= line <= max(first, last) for line in lines):
            skipped.add(node)
    return skipped


def _subtree(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    yield node
    for child in node.children:
        yield from _subtree(child)


@functools.cache
def _hooks(cls: type[Transform]) -> dict[str, tuple[str | None, str | None]]:
    """``{node type: (visit method name, leave method name)}`` that ``cls`` overrides."""
    hooks: dict[str, tuple[str | None, str | None]] = {}
    for name in dir(cls):
        prefix, _, node_type = name.partition("_")
        if prefix not in ("visit", "leave") or not node_type or "_" in node_type:
            continue
        if getattr(cls, name) is getattr(cst.CSTTransformer, name, None):
            continue  # the base class's no-op
        if not isinstance(getattr(cst, node_type, None), type):
            continue
        visit, leave = hooks.get(node_type, (None, None))
        hooks[node_type] = (name, leave) if prefix == "visit" else (visit, name)
    return hooks


def _positions(
    module: cst.Module, records: list[tuple[cst.CSTNode, str, str, bool]]
) -> list[Change]:
    if not records:
        return []
    where = node_positions(module, {id(node) for node, *_ in records})
    changes = set()
    for node, transform, message, manual in records:
        line_no, column = where.get(id(node), (1, 0))
        changes.add(Change(line_no, column + 1, transform, message, manual))
    return sorted(changes)


class _Traversal(cst.CSTTransformer):
    """Runs every transform's hooks, in pipeline order, during one traversal.

    Only the ``visit_<Node>``/``leave_<Node>`` methods a transform defines are called (found once
    per class), so the cost of a node does not grow with transforms that don't care about it.
    Children are always visited: one transform must not hide them from another. (libcst's matcher
    decorators are therefore not available to transforms; use ``libcst.matchers.matches``.)
    """

    def __init__(
        self, transforms: Sequence[Transform], state: FileState,
        skipped: set[cst.CSTNode] | None = None,
    ) -> None:
        super().__init__()
        self.state = state
        self.skipped = skipped or set()
        self.visits: dict[str, list[Callable[[cst.CSTNode], object]]] = {}
        self.leaves: dict[str, list[Callable[[cst.CSTNode, cst.CSTNode], object]]] = {}
        for transform in transforms:
            for node_type, (visit, leave) in _hooks(type(transform)).items():
                if visit:
                    self.visits.setdefault(node_type, []).append(getattr(transform, visit))
                if leave:
                    self.leaves.setdefault(node_type, []).append(getattr(transform, leave))

    def on_visit(self, node: cst.CSTNode) -> bool:
        for hook in self.visits.get(type(node).__name__, ()):
            hook(node)
        return True

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave(  # type: ignore[override]
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]:
        result: cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]
        result = updated_node
        for hook in self.leaves.get(type(original_node).__name__, ()):
            if not isinstance(result, cst.CSTNode):
                break
            result = hook(original_node, result)  # type: ignore[assignment]
        if original_node in self.skipped:
            return original_node  # opted out (the hooks ran, so their own state stays whole)
        if self.state.edits and isinstance(result, (cst.Module, cst.IndentedBlock)):
            assert isinstance(original_node, (cst.Module, cst.IndentedBlock))
            result = result.with_changes(body=self._apply_edits(original_node.body, result.body))
        return result

    def _apply_edits(
        self, originals: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]
    ) -> list[cst.BaseStatement]:
        edits = self.state.edits
        if len(originals) != len(updated):  # a transform flattened statements itself
            return list(updated)
        body: list[cst.BaseStatement] = []
        guard_run: list[cst.BaseStatement] = []
        carried: list[cst.EmptyLine] = []
        first_run: list[cst.BaseStatement] = []

        def flush() -> None:
            if guard_run:
                body.append(self._rank0_if(guard_run))
                guard_run.clear()
            if first_run:
                body.append(self._rank0_first(first_run))
                first_run.clear()

        for original, new in zip(originals, updated, strict=True):
            if _starts_cell(original):
                flush()  # one guard never spans two notebook cells: each keeps its own code
            if original in self.skipped:
                flush()
                body.append(new)
                continue
            if original in edits.before:
                flush()
                for inserted in edits.before[original]:
                    if inserted in edits.rank0_first:  # a statement hoisted out of ``original``
                        first_run.append(inserted)
                    else:
                        flush()
                        body.append(inserted)
                flush()
            replacement = list(edits.replaced.get(original, [new]))
            removed_lines: Sequence[cst.EmptyLine] = getattr(new, "leading_lines", [])
            if not replacement and removed_lines:
                # A removed statement's blank lines before it stay, on the next statement (its
                # comments go with it: they describe it).
                for line in removed_lines:
                    if line.comment is not None:
                        break
                    carried.append(line)
            elif carried and hasattr(replacement[0], "leading_lines"):
                first = replacement[0]
                own = list(first.leading_lines)  # type: ignore[attr-defined]
                if own and all(line.comment is None for line in carried):
                    carried.clear()  # blank lines only, and the next statement has its own
                replacement[0] = first.with_changes(leading_lines=[*carried, *own])
                carried.clear()
            if original in edits.guarded:
                if first_run:
                    flush()
                guard_run.extend(replacement)
            elif original in edits.rank0_first:
                if guard_run:
                    flush()
                first_run.extend(replacement)
            else:
                flush()
                body.extend(replacement)
            if original in edits.after:
                flush()
                body.extend(edits.after[original])
        flush()
        return body

    def _rank0_first(self, stmts: list[cst.BaseStatement]) -> cst.With:
        first = stmts[0]
        leading = getattr(first, "leading_lines", ())
        stmts = [first.with_changes(leading_lines=()), *stmts[1:]]
        item = cst.WithItem(cst.parse_expression(f"{self.state.runtime_alias}.rank0_first()"))
        return cst.With(items=[item], body=cst.IndentedBlock(body=stmts), leading_lines=leading)

    def _rank0_if(self, stmts: list[cst.BaseStatement]) -> cst.If:
        # The first statement's comments and blank lines move above the ``if``.
        first = stmts[0]
        leading = getattr(first, "leading_lines", ())
        stmts = [first.with_changes(leading_lines=()), *stmts[1:]]
        test = rank0_test(self.state.runtime_alias)
        return cst.If(test=test, body=cst.IndentedBlock(body=stmts), leading_lines=leading)


@dataclass(frozen=True)
class ProjectCall:
    """A call of a function another module of the project defines, in a training script, whose
    result (at ``index`` of the tuple it returns; None: the whole value) feeds a training loop."""

    callee: str  # the qualified name this file spells it by (``data.get_loaders``)
    target: tuple[Path, str]  # what the project resolved it to: (file, function)
    index: int | None
    line: int


@dataclass(frozen=True)
class ModuleProbe:
    """What the project run needs to know of one module before converting any."""

    calls: tuple[ProjectCall, ...] = ()
    framework: str | None = None
    #: Single-process training code that nothing in the file runs (a ``Trainer`` module).
    library: bool = False
    #: A single-process training script (it trains, and runs its training code).
    script: bool = False
    #: A script's calls, by qualified name as it spells them.
    called: tuple[str, ...] = ()


def project_exports(source: bytes, options: Options) -> list[Export]:
    """What a module's conversion with ``options.project`` does for the other modules: the
    loaders and datasets it shards for them (one pass: the fixed-point check is the real
    conversion's)."""
    try:
        return _convert_once(source, options).exports
    except ConversionError:
        return []


def probe_module(
    source: bytes, options: Options, resolve: Callable[[str], tuple[Path, str] | None],
    stepping: Callable[[str], tuple[str, ...]] | None = None, entry: bool = False,
) -> ModuleProbe:
    """Classify a module, and find the calls of a training script into functions of
    other project modules (``resolve`` maps a qualified name to one, or None) whose results
    feed its training loops. ``entry``: the module is run as it is (a notebook): the names it
    calls are given even when it trains nothing itself."""
    if not worth_parsing(source):
        return ModuleProbe()
    try:
        module = _parse(source)
    except ConversionError:
        return ModuleProbe()
    wrapper, index, metadata, info = _read(module, options.framework, False)
    if stepping is not None:  # ``stepping(name)``: the methods of a project class that step
        steps_in_wrapper(info, [(q, "", m, False) for q in info.calls if (m := stepping(q))])
    if not info.convertible or options.parallel_importer:
        return ModuleProbe(framework=info.framework)
    if not info.entry_point:
        return ModuleProbe(framework=info.framework, library=True,
                           called=tuple(info.calls) if entry else ())
    model = FileModel(module, info, index, project=options.project, skip=options.skip)
    found: list[tuple[cst.Call, str, tuple[Path, str], int | None]] = []
    for qualified, calls in info.calls.items():
        target = resolve(qualified)
        if target is None:
            continue
        for call in calls:
            found += [(call, qualified, target, i) for i, _ in training_results(model, call)]
    where = _lines(module, [call for call, *_ in found])
    calls_found = tuple(
        ProjectCall(qualified, target, index, where[i])
        for i, (_call, qualified, target, index) in enumerate(found)
    )
    return ModuleProbe(calls_found, info.framework, script=True, called=tuple(info.calls))
