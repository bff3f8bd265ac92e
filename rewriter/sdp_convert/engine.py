"""Convert one file: parse, classify, run the pipeline in one traversal, verify, return.

The pipeline's transforms share one metadata resolution of the original tree and run together in
one traversal (``_Traversal``): each ``leave_*`` hook of each transform sees the original node
(whose metadata and position are known) and the node as rewritten by the transforms before it.
Statement edits go through the shared ``EditPlan``, applied here once per statement body, so edits
of different transforms compose. Positions are computed only when something is reported.
"""

from __future__ import annotations

import ast

from collections.abc import Sequence
from dataclasses import dataclass, field

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import MetadataWrapper, PositionProvider

from .analysis import FRAMEWORK_MARKERS, FileInfo, detect
from .base import FileState, Options, Transform
from .changes import Change, ConversionError
from .pipeline import PIPELINE

__all__ = ["Options", "Result", "convert"]


@dataclass
class Result:
    """The outcome of converting one source."""

    source: bytes
    output: bytes
    info: FileInfo
    changes: list[Change] = field(default_factory=list)

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
        try:
            again = _convert_once(result.output, options)
        except ConversionError as err:  # pragma: no cover - would be a bug in a transform
            raise ConversionError(f"internal error: converted code does not parse: {err}") from err
        if again.changed:
            raise ConversionError(
                "internal error: converting the result again would change it (please report)"
            )
    return result


def _parse(data: bytes) -> cst.Module:
    if b"\0" in data[:8192]:
        raise ConversionError("binary file (contains NUL bytes)")
    try:
        return cst.parse_module(data)
    except cst.ParserSyntaxError as err:
        _check_syntax(data)  # CPython's message is clearer ("Missing parentheses in call...")
        message = err.message.split(": expected one of")[0]
        raise ConversionError(f"syntax error: {message}", err.raw_line, err.raw_column + 1) from None
    except (UnicodeDecodeError, LookupError, SyntaxError) as err:
        raise ConversionError(f"cannot decode file: {err}") from err


def _check_syntax(data: bytes) -> None:
    if b"\0" in data[:8192]:
        raise ConversionError("binary file (contains NUL bytes)")
    try:
        ast.parse(data)
    except SyntaxError as err:
        if not err.lineno:  # the coding cookie itself is wrong: there is no position
            raise ConversionError(f"cannot decode file: {err.msg}") from None
        raise ConversionError(f"syntax error: {err.msg}", err.lineno, max(err.offset or 1, 1)) from None
    except (UnicodeDecodeError, LookupError, ValueError) as err:
        raise ConversionError(f"cannot decode file: {err}") from None


def _convert_once(data: bytes, options: Options) -> Result:
    if not any(marker in data for marker in FRAMEWORK_MARKERS):
        # Cheap path: nothing here can import a framework we know, so it is left alone byte for
        # byte; CPython's own parser (many times faster than libcst's) still reports broken files.
        _check_syntax(data)
        return Result(data, data, FileInfo(reason="imports no deep-learning framework"))
    module = _parse(data)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    transforms_deps = {dep for cls in PIPELINE for dep in cls.get_inherited_dependencies()}
    metadata = wrapper.resolve_many(transforms_deps)
    info = detect(module, metadata, options.framework)

    selected = [
        cls
        for cls in PIPELINE
        if cls.applies_to(info)
        and (not options.only or cls.NAME in options.only)
        and cls.NAME not in options.skip
    ]
    if not selected:
        return Result(data, data, info)

    context = CodemodContext(wrapper=wrapper)
    state = FileState(info=info, options=options, module=module)
    state.runtime_alias = _runtime_alias(module, metadata, state.runtime_module)
    transforms = [cls(context, state) for cls in selected]
    for transform in transforms:
        transform.metadata = metadata  # type: ignore[assignment]  # one resolution for all
    for transform in transforms:
        transform.prepare(module)

    new_module = module.visit(_Traversal(transforms, state))
    assert isinstance(new_module, cst.Module)
    if AddImportsVisitor.CONTEXT_KEY in context.scratch and new_module is not module:
        new_module = AddImportsVisitor(context).transform_module(new_module)

    changes = _positions(wrapper, state.records)
    output = new_module.bytes if state.records or state.edits else data
    if output != data and not any(not c.manual for c in changes):
        # Edits without a report would be a silent change; refuse rather than hide it.
        raise ConversionError("internal error: a transform changed code without reporting it")
    return Result(data, output, info, changes)


def _runtime_alias(module: cst.Module, metadata: object, runtime_module: str) -> str:
    """``sdp`` unless the file already binds that name to something else."""
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Import):
                    for alias in small.names:
                        full = cst.helpers.get_full_name_for_node(alias.name)
                        if full == runtime_module and alias.asname is not None:
                            name = alias.asname.name
                            if isinstance(name, cst.Name):
                                return name.value
    taken = {n.value for n in _bound_names(module)}
    for candidate in ("sdp", "sdp_rt", "sdp_runtime_"):
        if candidate not in taken:
            return candidate
    return "sdp_runtime_"  # pragma: no cover


def _bound_names(module: cst.Module) -> list[cst.Name]:
    names: list[cst.Name] = []

    class _Collect(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            if node.value.startswith("sdp"):
                names.append(node)

    module.visit(_Collect())
    return names


def _positions(
    wrapper: MetadataWrapper, records: list[tuple[cst.CSTNode, str, str, bool]]
) -> list[Change]:
    if not records:
        return []
    positions = wrapper.resolve(PositionProvider)
    changes = set()
    for node, transform, message, manual in records:
        pos = positions[node].start
        changes.add(Change(pos.line, pos.column + 1, transform, message, manual))
    return sorted(changes)


class _Traversal(cst.CSTTransformer):
    """Runs every transform's hooks, in pipeline order, during one traversal."""

    def __init__(self, transforms: Sequence[Transform], state: FileState) -> None:
        super().__init__()
        self.transforms = transforms
        self.state = state

    def on_visit(self, node: cst.CSTNode) -> bool:
        # Children are always visited: one transform must not hide them from another.
        for transform in self.transforms:
            transform.on_visit(node)
        return True

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        for transform in self.transforms:
            transform.on_visit_attribute(node, attribute)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        for transform in self.transforms:
            transform.on_leave_attribute(original_node, attribute)

    def on_leave(  # type: ignore[override]
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]:
        result: cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]
        result = updated_node
        for transform in self.transforms:
            if not isinstance(result, cst.CSTNode):
                break
            result = transform.on_leave(original_node, result)
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

        def flush() -> None:
            if guard_run:
                body.append(self._rank0_if(guard_run))
                guard_run.clear()

        for original, new in zip(originals, updated):
            if original in edits.before:
                flush()
                body.extend(edits.before[original])
            replacement = list(edits.replaced.get(original, [new]))
            if original in edits.guarded:
                guard_run.extend(replacement)
            else:
                flush()
                body.extend(replacement)
            if original in edits.after:
                flush()
                body.extend(edits.after[original])
        flush()
        return body

    def _rank0_if(self, stmts: list[cst.BaseStatement]) -> cst.If:
        # The first statement's comments and blank lines move above the ``if``.
        first = stmts[0]
        leading = getattr(first, "leading_lines", ())
        stmts = [first.with_changes(leading_lines=()), *stmts[1:]]
        test = cst.parse_expression(f"{self.state.runtime_alias}.rank() == 0")
        return cst.If(test=test, body=cst.IndentedBlock(body=stmts), leading_lines=leading)
