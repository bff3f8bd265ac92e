"""One walk of the file: where every name is bound and used (``FileIndex``), for all transforms."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import libcst as cst

from ..base import Transform
from .syntax import code

Scope = cst.FunctionDef | cst.ClassDef | None


@dataclass(eq=False)
class Binding:
    """One place a name gets a value. ``value`` is the whole assigned expression (None for loop
    targets, parameters, imports, definitions); ``unpacked`` when the target was a tuple."""

    name: str
    scope: Scope
    kind: str  # assign | for | with | param | def | import
    stmt: cst.CSTNode
    value: cst.BaseExpression | None = None
    unpacked: bool = False
    order: int = 0
    target: cst.BaseExpression | None = None


@dataclass
class FileIndex:
    """Where every name of the file is bound and used, in one walk of the original tree.

    Flow-insensitive but ordered: the binding that reaches a use is the last one before it in its
    scope (then in the enclosing scopes), which is what straight-line training scripts need.
    """

    order: dict[int, int] = field(default_factory=dict)
    scope_of: dict[int, Scope] = field(default_factory=dict)
    parent_scope: dict[int, Scope] = field(default_factory=dict)
    bindings: dict[tuple[int, str], list[Binding]] = field(default_factory=dict)
    #: ``self.model = ...`` and other attribute targets, by their code, file-wide.
    attribute_bindings: dict[str, list[Binding]] = field(default_factory=dict)
    #: Loads of each name, by (scope, name).
    loads: dict[tuple[int, str], list[cst.Name]] = field(default_factory=dict)
    #: Calls by the callee's last name: ``train_step`` for ``train_step(x)`` and
    #: ``self.train_step(x)``.
    calls_by_name: dict[str, list[cst.Call]] = field(default_factory=dict)
    functions: dict[str, list[cst.FunctionDef]] = field(default_factory=dict)
    classes: dict[str, cst.ClassDef] = field(default_factory=dict)
    loops: list[cst.For | cst.While] = field(default_factory=list)
    withs: list[cst.With] = field(default_factory=list)
    returns: dict[int, list[cst.Return]] = field(default_factory=dict)

    def scope(self, node: cst.CSTNode) -> Scope:
        return self.scope_of.get(id(node))

    def reaching(self, name: str, at: cst.CSTNode) -> Binding | None:
        """The binding of ``name`` that a use at ``at`` (original) sees."""
        scope = self.scope_of.get(id(at))
        position = self.order.get(id(at), 0)
        while True:
            found = self.bindings.get((id(scope), name), [])
            if found:
                before = [b for b in found if b.order <= position]
                # None before: bound later in a loop, or after the function that uses it.
                return before[-1] if before else found[-1]
            if scope is None:
                return None
            scope = self.parent_scope.get(id(scope))
            while isinstance(scope, cst.ClassDef):  # methods don't see class-level names
                scope = self.parent_scope.get(id(scope))

    def bindings_of(self, name: str, scope: Scope) -> list[Binding]:
        return self.bindings.get((id(scope), name), [])

    def loads_of(self, name: str, scope: Scope) -> list[cst.Name]:
        return self.loads.get((id(scope), name), [])

    def is_before(self, a: cst.CSTNode, b: cst.CSTNode) -> bool:
        return self.order.get(id(a), 0) < self.order.get(id(b), 0)


class _Indexer(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.index = FileIndex()
        self.stack: list[Scope] = [None]
        self.not_loads: set[int] = set()
        self.pending: list[tuple[Binding, cst.CSTNode, str]] = []  # (binding, anchor, start|end)
        self.end: dict[int, int] = {}

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.index.order[id(node)] = len(self.index.order)
        self.index.scope_of[id(node)] = self.stack[-1]
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        self.end[id(original_node)] = len(self.index.order)

    def bind(self, name: str, kind: str, stmt: cst.CSTNode, anchor: cst.CSTNode, when: str,
             value: cst.BaseExpression | None = None, unpacked: bool = False) -> None:
        binding = Binding(name, self.stack[-1], kind, stmt, value, unpacked)
        self.pending.append((binding, anchor, when))
        self.index.bindings.setdefault((id(self.stack[-1]), name), []).append(binding)

    def bind_target(self, target: cst.BaseExpression, kind: str, stmt: cst.CSTNode,
                    anchor: cst.CSTNode, when: str, value: cst.BaseExpression | None,
                    unpacked: bool = False) -> None:
        if isinstance(target, cst.Name):
            self.not_loads.add(id(target))
            self.bind(target.value, kind, stmt, anchor, when, value, unpacked)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self.bind_target(element.value, kind, stmt, anchor, when, value, True)
        elif isinstance(target, cst.StarredElement):
            self.bind_target(target.value, kind, stmt, anchor, when, value, True)
        elif isinstance(target, cst.Attribute) and not unpacked:
            binding = Binding(code(target), self.stack[-1], kind, stmt, value, target=target)
            self.pending.append((binding, anchor, when))
            self.index.attribute_bindings.setdefault(code(target), []).append(binding)

    # scopes
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.not_loads.add(id(node.name))
        self.index.functions.setdefault(node.name.value, []).append(node)
        self.bind(node.name.value, "def", node, node, "end")
        self.index.parent_scope[id(node)] = self.stack[-1]
        self.stack.append(node)
        params = node.params
        for param in (*params.posonly_params, *params.params, *params.kwonly_params,
                      params.star_arg, params.star_kwarg):
            if isinstance(param, cst.Param):
                self.not_loads.add(id(param.name))
                self.bind(param.name.value, "param", node, node.body, "start")

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.stack.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.not_loads.add(id(node.name))
        self.index.classes.setdefault(node.name.value, node)
        self.bind(node.name.value, "def", node, node, "end")
        self.index.parent_scope[id(node)] = self.stack[-1]
        self.stack.append(node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.stack.pop()

    # bindings
    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            name = alias.evaluated_alias or alias.evaluated_name.split(".")[0]
            self.bind(name, "import", node, node, "end")
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                name = alias.evaluated_alias or alias.evaluated_name
                self.bind(name, "import", node, node, "end")
        return False

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self.bind_target(target.target, "assign", node, node, "end", node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self.bind_target(node.target, "assign", node, node, "end", node.value)

    def visit_For(self, node: cst.For) -> None:
        self.index.loops.append(node)
        self.bind_target(node.target, "for", node, node.body, "start", None)

    def visit_While(self, node: cst.While) -> None:
        self.index.loops.append(node)

    def visit_With(self, node: cst.With) -> None:
        self.index.withs.append(node)
        for item in node.items:
            if item.asname is not None:
                self.bind_target(item.asname.name, "with", node, node.body, "start", item.item)

    def visit_Return(self, node: cst.Return) -> None:
        scope = self.stack[-1]
        if isinstance(scope, cst.FunctionDef):
            self.index.returns.setdefault(id(scope), []).append(node)

    # uses
    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.not_loads.add(id(node.attr))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self.not_loads.add(id(node.keyword))

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        name = func.value if isinstance(func, cst.Name) else (
            func.attr.value if isinstance(func, cst.Attribute) else None
        )
        if name:
            self.index.calls_by_name.setdefault(name, []).append(node)

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) not in self.not_loads:
            self.index.loads.setdefault((id(self.stack[-1]), node.value), []).append(node)

    def finish(self) -> FileIndex:
        for binding, anchor, when in self.pending:
            binding.order = (
                self.index.order[id(anchor)] if when == "start" else self.end[id(anchor)]
            )
        for found in (*self.index.bindings.values(), *self.index.attribute_bindings.values()):
            found.sort(key=lambda b: b.order)
        return self.index


def file_index(transform: Transform) -> FileIndex:
    """The file's ``FileIndex``, built once and shared by the transforms."""
    facts = transform.state.facts
    if facts.index is None:
        indexer = _Indexer()
        transform.module.visit(indexer)
        facts.index = indexer.finish()
    return facts.index


def assigned_values(
    index: FileIndex, expr: cst.BaseExpression, at: cst.CSTNode | None = None, depth: int = 0
) -> Iterator[cst.BaseExpression]:
    """``expr`` followed through plain name bindings: ``opt`` -> ``Adam(0.1)``."""
    yield expr
    if depth > 8:
        return
    if isinstance(expr, cst.Name):
        binding = index.reaching(expr.value, at if at is not None else expr)
        if binding is not None and binding.value is not None and not binding.unpacked:
            yield from assigned_values(index, binding.value, binding.stmt, depth + 1)
    elif isinstance(expr, cst.Attribute):
        found = index.attribute_bindings.get(code(expr), [])
        for binding in found[-1:]:
            if binding.value is not None:
                yield from assigned_values(index, binding.value, binding.stmt, depth + 1)
