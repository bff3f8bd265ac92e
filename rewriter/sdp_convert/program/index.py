"""The one binding index of a file: where every name is bound and read, built in one walk.

Every question the transforms ask about names goes through ``FileIndex``; two policies sit on the
same data, and the caller picks the one its question needs:

- ``reaching(name, at)``: the binding a use sees in straight-line code, the last one before it in
  its scope (then in the enclosing scopes). Training scripts are mostly straight-line, so this is
  what "which optimizer is this" wants.
- ``referents(load)`` / ``uses(binding)``: every binding a read may see and every read a binding
  may reach, ignoring order (Python's own scoping: a name assigned anywhere in a function is local
  to all of it; ``global``/``nonlocal`` move it). This is what "is X bound only once", "who calls
  this function" want.

Scopes are functions, classes and the module (``None``). Comprehension and lambda variables shadow
the names they bind inside their expression; they are bindings of their own, never in the scope's
lists. The same walk collects libcst's view of the scopes (``program.names``), from which the
qualified names the transforms match on are answered (``FileIndex.names``, ``imported_names``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import libcst as cst

from ..analysis import Visitor
from .names import Collector, QualifiedNames
from .syntax import LAYOUT, code, walk_code

if TYPE_CHECKING:
    from .model import FileModel

Scope = cst.FunctionDef | cst.ClassDef | None
N = TypeVar("N", bound=cst.CSTNode)

#: Kinds of ``Binding``: where a name gets a value.
KINDS = (
    "assign", "augassign", "for", "with", "param", "def", "import", "except", "walrus",
    "comp", "lambda", "attribute",
)
# ("attribute": ``self.<attr>`` of a class as a whole, made by ``program.scopes.binding_of``; the
# entries of ``FileIndex.attribute_bindings`` keep the kind of the statement that assigns them.)


@dataclass(eq=False)
class Binding:
    """One place a name gets a value.

    ``value`` is the whole assigned expression (None for loop targets, parameters, imports,
    definitions); ``unpacked`` when the target was part of a tuple; ``target`` the node stored to
    (the Name, the ``Param``, the ``self.x`` Attribute). ``cls``/``attr`` describe ``self.<attr>``
    of one class, seen from all its methods (``binding_of`` in ``program.scopes``).
    """

    name: str
    scope: Scope
    kind: str
    stmt: cst.CSTNode
    value: cst.BaseExpression | None = None
    unpacked: bool = False
    order: int = 0
    target: cst.CSTNode | None = None
    cls: cst.ClassDef | None = None
    attr: str = ""
    #: The blocks around the binding inside its scope (ids, outermost first).
    blocks: tuple[int, ...] = ()

    @property
    def node(self) -> cst.CSTNode | None:
        """The defining node: the ``def``/``class``/import statement, the ``Param``, or the
        target stored to."""
        return self.stmt if self.kind in ("def", "import") else self.target

    @property
    def code(self) -> str:
        return f"self.{self.attr}" if self.cls is not None else self.name

    @property
    def is_shared(self) -> bool:
        """Visible from other functions: a module-level variable or ``self.<attr>``."""
        return self.cls is not None or (self.scope is None and self.kind not in ("comp", "lambda"))

    def same_as(self, other: Binding) -> bool:
        if self.cls is not None:
            return other.cls is self.cls and other.attr == self.attr
        return self is other


@dataclass
class FileIndex:
    """Where every name of the file is bound and read, in one walk of the original tree."""

    order: dict[int, int] = field(default_factory=dict)
    #: The function or class each node is in, by id; a module-level node is not here (its
    #: scope is None, what ``scope_of.get`` answers): most nodes of a long script.
    scope_of: dict[int, Scope] = field(default_factory=dict)
    parent_scope: dict[int, Scope] = field(default_factory=dict)
    #: Bindings by (id(scope), name), in file order (augmented assignments apart, in ``augmented``).
    bindings: dict[tuple[int, str], list[Binding]] = field(default_factory=dict)
    augmented: dict[tuple[int, str], list[Binding]] = field(default_factory=dict)
    #: ``self.model = ...`` and other attribute targets, by their code, file-wide.
    attribute_bindings: dict[str, list[Binding]] = field(default_factory=dict)
    #: Reads of each name, by (id(scope the read is in), name); comprehension and lambda
    #: variables are not here (``shadowed``).
    loads: dict[tuple[int, str], list[cst.Name]] = field(default_factory=dict)
    #: Reads of comprehension/lambda variables (by id) -> their binding, and the read itself.
    shadowed: dict[int, Binding] = field(default_factory=dict)
    shadowed_reads: dict[int, cst.Name] = field(default_factory=dict)
    #: The binding a store target (Name, Param, its name) creates, by id of that node.
    by_target: dict[int, Binding] = field(default_factory=dict)
    #: ``global``/``nonlocal`` declarations: id(function) -> {name: "global" | "nonlocal"}.
    declared: dict[int, dict[str, str]] = field(default_factory=dict)
    #: Calls by the callee's last name: ``train_step`` for ``train_step(x)`` and
    #: ``self.train_step(x)``.
    calls_by_name: dict[str, list[cst.Call]] = field(default_factory=dict)
    functions: dict[str, list[cst.FunctionDef]] = field(default_factory=dict)
    classes: dict[str, cst.ClassDef] = field(default_factory=dict)
    loops: list[cst.For | cst.While] = field(default_factory=list)
    #: (first, last) walk positions of each loop and the names its ``for`` target binds.
    loop_spans: list[tuple[int, int, frozenset[str]]] = field(default_factory=list)
    withs: list[cst.With] = field(default_factory=list)
    returns: dict[int, list[cst.Return]] = field(default_factory=dict)
    _references: dict[tuple[int, str], list[cst.Name]] | None = None
    _load_ids: set[int] = field(default_factory=set)
    #: id(read) -> the blocks around it inside its scope.
    read_blocks: dict[int, tuple[int, ...]] = field(default_factory=dict)
    #: Every node of the tree but the layout ones (``syntax.LAYOUT``: whitespace, punctuation)
    #: by its type, in walk order (``nodes_of``): a file-wide search for
    #: one kind of node without another walk (``m.findall`` over a module costs about a parse).
    by_type: dict[type, list[cst.CSTNode]] = field(default_factory=dict)
    #: The qualified names of the file's nodes (what ``QualifiedNameProvider`` would give).
    names: QualifiedNames | None = None

    def scope(self, node: cst.CSTNode) -> Scope:
        return self.scope_of.get(id(node))

    def is_before(self, a: cst.CSTNode, b: cst.CSTNode) -> bool:
        return self.order.get(id(a), 0) < self.order.get(id(b), 0)

    def bindings_of(self, name: str, scope: Scope) -> list[Binding]:
        return self.bindings.get((id(scope), name), [])

    def loads_of(self, name: str, scope: Scope) -> list[cst.Name]:
        """Reads of ``name`` written directly in ``scope`` (not in nested functions)."""
        return self.loads.get((id(scope), name), [])

    def resolve(self, name: str, scope: Scope) -> tuple[bool, Scope]:
        """The scope whose binding of ``name`` a read in ``scope`` sees: ``(found, scope)``.
        Methods do not see class-level names; ``global``/``nonlocal`` are followed."""
        current = scope
        while True:
            declared = self.declared.get(id(current), {}).get(name)
            if declared == "global":
                current = None
            if (id(current), name) in self.bindings or (id(current), name) in self.augmented:
                return True, current
            if current is None:
                return False, None
            current = self.parent_scope.get(id(current))
            while isinstance(current, cst.ClassDef):
                current = self.parent_scope.get(id(current))

    def reaching(self, name: str, at: cst.CSTNode) -> Binding | None:
        """The binding of ``name`` that a use at ``at`` sees: the last one before it in the
        scope that binds the name (an augmented assignment changes the value in place and is not
        one); the last one of all when none comes before (bound later in a loop, or after the
        function that reads it)."""
        shadow = self.shadowed.get(id(at))
        if shadow is not None:
            return shadow
        found, scope = self.resolve(name, self.scope_of.get(id(at)))
        bound = self.bindings.get((id(scope), name), []) if found else []
        if not bound:
            return None
        position = self.order.get(id(at), 0)
        before = [b for b in bound if b.order <= position]
        return before[-1] if before else bound[-1]

    def referents(self, name: cst.Name) -> list[Binding]:
        """Every binding a read may see ([] for a node that is not a read).

        A read in the scope that binds the name sees the bindings before it, from the last one
        that runs whenever the read does (in a block that holds the read; an augmented assignment
        changes the value, it does not replace it) on, and those later in
        a loop around both (the next iteration sees them); a read from a nested function sees
        all of them (it may run at any time)."""
        shadow = self.shadowed.get(id(name))
        if shadow is not None:
            return [shadow]
        if id(name) not in self._load_ids:
            return []
        here = self.scope_of.get(id(name))
        found, scope = self.resolve(name.value, here)
        if not found:
            return []
        key = (id(scope), name.value)
        bound = [*self.bindings.get(key, []), *self.augmented.get(key, [])]
        if scope is not here:
            return bound
        position = self.order.get(id(name), 0)
        blocks = self.read_blocks.get(id(name), ())
        before = [b for b in bound if b.order <= position]
        # A binding in a block that also holds the read replaces the ones before it there.
        replacing = [
            b for b in before if b.kind != "augassign" and blocks[: len(b.blocks)] == b.blocks
        ]
        if replacing:
            last = replacing[-1].order
            before = [b for b in before if b.order >= last]
        later = [b for b in bound if b.order > position]
        if not later:
            return before
        # Only the loops around the read matter below: found once for the read, not once for
        # each later binding (a name rebound in each of a file's thousand blocks).
        around = [span for span in self.loop_spans if span[0] <= position <= span[1]]
        return [*before, *(b for b in later if self._in_one_loop(name.value, b.order, around))]

    @staticmethod
    def _in_one_loop(
        name: str, binding: int, around: list[tuple[int, int, frozenset[str]]]
    ) -> bool:
        """A later binding reaches a read through a loop around both (the next iteration), unless
        a ``for`` on the way rebinds the name first: the innermost common loop, or a loop around
        the read that the path enters through its header. ``around``: the loops around the
        read."""
        common = [start for start, end, _ in around if start <= binding <= end]
        if not common:
            return False
        innermost = max(common)
        return not any(
            start >= innermost and name in rebinds for start, _end, rebinds in around
        )

    def uses(self, binding: Binding) -> list[cst.Name]:
        """Every read that may see ``binding`` (see ``referents``), in file order."""
        if binding.kind in ("comp", "lambda"):
            return [self.shadowed_reads[i] for i, b in self.shadowed.items() if b is binding]
        if self._references is None:
            self._references = {}
            for (_, name), reads in self.loads.items():
                if not reads:
                    continue
                found, scope = self.resolve(name, self.scope_of.get(id(reads[0])))
                if found:
                    self._references.setdefault((id(scope), name), []).extend(reads)
            for reads in self._references.values():
                reads.sort(key=lambda n: self.order.get(id(n), 0))
        reads = self._references.get((id(binding.scope), binding.name), [])
        return [r for r in reads if any(b is binding for b in self.referents(r))]

    def class_named(self, name: cst.Name) -> cst.ClassDef | None:
        """The class of this file a name (a read) refers to where it is read: the reaching
        ``class`` statement (a class redefined under the same name is the later one there)."""
        binding = self.reaching(name.value, name)
        stmt = binding.stmt if binding is not None else None
        return stmt if isinstance(stmt, cst.ClassDef) else None

    def names_bound(self, scope: Scope) -> set[str]:
        """Every name bound in ``scope`` (not counting enclosing ones)."""
        return {name for (scope_id, name) in self.bindings if scope_id == id(scope)}


class _Indexer(Visitor):
    def __init__(self, module: cst.Module, riders: Sequence[cst.CSTVisitor] = ()) -> None:
        super().__init__()
        #: Read-only visitors walked along (``index_module``): they see every node.
        self.riders = riders
        self.index = FileIndex()
        self.names = Collector(module)
        self.stack: list[Scope] = [None]
        self.not_loads: set[int] = set()
        self.pending: list[tuple[Binding, cst.CSTNode, str]] = []  # (binding, anchor, start|end)
        #: Where the walk left the nodes in ``ends`` (the anchors of bindings made at the end of
        #: a node, the loops): the position of the next node.
        self.end: dict[int, int] = {}
        self.ends: set[int] = set()
        #: Names bound by the comprehensions/lambdas being visited, innermost last.
        self.shadows: list[dict[str, Binding]] = []
        #: Blocks open inside each scope being visited (a new list per function/class).
        self.blocks: list[list[int]] = [[]]
        #: ``tuple(self.blocks[-1])`` as last made: the reads in the same blocks share it.
        self.around: tuple[int, ...] | None = None
        self.path: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        index = self.index
        order = index.order
        key = id(node)
        order[key] = len(order)
        scope = self.stack[-1]
        if scope is not None:
            index.scope_of[key] = scope
        cls = type(node)
        same = index.by_type.get(cls)
        if same is None:
            index.by_type[cls] = [node]
        else:
            same.append(node)
        path = self.path
        self.names.visit(node, path[-1] if path else None, key)
        path.append(node)
        for rider in self.riders:
            rider.on_visit(node)
        if super().on_visit(node):
            return True
        for rider in self.riders:  # an import's names: the index skips them, the riders do not
            for child in node.children:
                if type(child) not in LAYOUT:
                    walk_code(child, rider)
        return False

    def on_leave(self, original_node: cst.CSTNode) -> None:
        for rider in self.riders:
            rider.on_leave(original_node)
        super().on_leave(original_node)
        self.names.leave(original_node)
        self.path.pop()
        if id(original_node) in self.ends:
            self.end[id(original_node)] = len(self.index.order)

    def _binding_scope(self, name: str) -> Scope:
        scope = self.stack[-1]
        declared = self.index.declared.get(id(scope), {}).get(name)
        if declared == "global":
            return None
        if declared == "nonlocal":
            outer = self.index.parent_scope.get(id(scope))
            while isinstance(outer, cst.ClassDef):
                outer = self.index.parent_scope.get(id(outer))
            return outer
        return scope

    def _pend(self, binding: Binding, anchor: cst.CSTNode, when: str) -> None:
        """``binding``'s order: where the walk enters (``start``) or leaves (``end``) ``anchor``,
        set once the walk is over (``finish``)."""
        self.pending.append((binding, anchor, when))
        if when == "end":
            self.ends.add(id(anchor))

    def bind(self, name: str, kind: str, stmt: cst.CSTNode, anchor: cst.CSTNode, when: str,
             value: cst.BaseExpression | None = None, unpacked: bool = False,
             target: cst.CSTNode | None = None) -> Binding:
        scope = self._binding_scope(name)
        binding = Binding(name, scope, kind, stmt, value, unpacked, target=target)
        binding.blocks = tuple(self.blocks[-1]) if scope is self.stack[-1] else ()
        self._pend(binding, anchor, when)
        table = self.index.augmented if kind == "augassign" else self.index.bindings
        table.setdefault((id(scope), name), []).append(binding)
        if target is not None:
            self.index.by_target[id(target)] = binding
        return binding

    def bind_target(self, target: cst.BaseExpression, kind: str, stmt: cst.CSTNode,
                    anchor: cst.CSTNode, when: str, value: cst.BaseExpression | None,
                    unpacked: bool = False) -> None:
        if isinstance(target, cst.Name):
            self.not_loads.add(id(target))
            self.bind(target.value, kind, stmt, anchor, when, value, unpacked, target)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self.bind_target(element.value, kind, stmt, anchor, when, value, True)
        elif isinstance(target, cst.StarredElement):
            self.bind_target(target.value, kind, stmt, anchor, when, value, True)
        elif isinstance(target, cst.Attribute) and not unpacked:
            binding = Binding(code(target), self.stack[-1], kind, stmt, value, target=target)
            self._pend(binding, anchor, when)
            self.index.attribute_bindings.setdefault(code(target), []).append(binding)

    # scopes
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.not_loads.add(id(node.name))
        self.index.functions.setdefault(node.name.value, []).append(node)
        self.bind(node.name.value, "def", node, node, "end", target=node)
        self.index.parent_scope[id(node)] = self.stack[-1]
        self.stack.append(node)
        self.blocks.append([])
        params = node.params
        for param in (*params.posonly_params, *params.params, *params.kwonly_params,
                      params.star_arg, params.star_kwarg):
            if isinstance(param, cst.Param):
                self.not_loads.add(id(param.name))
                binding = self.bind(param.name.value, "param", node, node.body, "start",
                                    target=param)
                self.index.by_target[id(param.name)] = binding

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.stack.pop()
        self.blocks.pop()

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._open_block(node)

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
        self._close_block(original_node)

    def visit_SimpleStatementSuite(self, node: cst.SimpleStatementSuite) -> None:
        self._open_block(node)

    def leave_SimpleStatementSuite(self, original_node: cst.SimpleStatementSuite) -> None:
        self._close_block(original_node)

    def _open_block(self, node: cst.CSTNode) -> None:
        # The body of a def/class is the scope itself; a with body always runs.
        parent = self.path[-2] if len(self.path) > 1 else None
        if not isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.With)):
            self.blocks[-1].append(id(node))

    def _close_block(self, node: cst.CSTNode) -> None:
        if self.blocks[-1] and self.blocks[-1][-1] == id(node):
            self.blocks[-1].pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.not_loads.add(id(node.name))
        self.index.classes.setdefault(node.name.value, node)
        self.bind(node.name.value, "def", node, node, "end", target=node)
        self.index.parent_scope[id(node)] = self.stack[-1]
        self.stack.append(node)
        self.blocks.append([])

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.stack.pop()
        self.blocks.pop()

    def visit_Global(self, node: cst.Global) -> None:
        for item in node.names:
            self.not_loads.add(id(item.name))
            self.index.declared.setdefault(id(self.stack[-1]), {})[item.name.value] = "global"

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        for item in node.names:
            self.not_loads.add(id(item.name))
            self.index.declared.setdefault(id(self.stack[-1]), {})[item.name.value] = "nonlocal"

    # comprehensions and lambdas: their variables shadow, inside them only
    def _shadow(self, names: list[tuple[cst.Name, cst.CSTNode, str, cst.CSTNode]]) -> None:
        """Bind comprehension targets (``target`` the Name) or lambda parameters (the Param)."""
        bound: dict[str, Binding] = {}
        for name, owner, kind, target in names:
            self.not_loads.add(id(name))
            binding = Binding(name.value, self.stack[-1], kind, owner, target=target)
            binding.order = len(self.index.order)
            bound[name.value] = binding
            self.index.by_target[id(name)] = binding
            self.index.by_target[id(target)] = binding
        self.shadows.append(bound)

    def _comprehension(self, node: cst.BaseComp) -> None:
        names: list[tuple[cst.Name, cst.CSTNode, str, cst.CSTNode]] = []
        clause: cst.CompFor | None = node.for_in
        while clause is not None:
            names += [(n, node, "comp", n) for n in _target_names(clause.target)]
            clause = clause.inner_for_in
        self._shadow(names)

    def visit_ListComp(self, node: cst.ListComp) -> None:
        self._comprehension(node)

    def visit_SetComp(self, node: cst.SetComp) -> None:
        self._comprehension(node)

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> None:
        self._comprehension(node)

    def visit_DictComp(self, node: cst.DictComp) -> None:
        self._comprehension(node)

    def leave_ListComp(self, original_node: cst.ListComp) -> None:
        self.shadows.pop()

    def leave_SetComp(self, original_node: cst.SetComp) -> None:
        self.shadows.pop()

    def leave_GeneratorExp(self, original_node: cst.GeneratorExp) -> None:
        self.shadows.pop()

    def leave_DictComp(self, original_node: cst.DictComp) -> None:
        self.shadows.pop()

    def visit_Lambda(self, node: cst.Lambda) -> None:
        params = node.params
        self._shadow([
            (p.name, node, "lambda", p)
            for p in (*params.posonly_params, *params.params, *params.kwonly_params,
                      params.star_arg, params.star_kwarg)
            if isinstance(p, cst.Param)
        ])

    def leave_Lambda(self, original_node: cst.Lambda) -> None:
        self.shadows.pop()

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

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.target, cst.Name):
            # Read and written: the read is a load like any other, the write an "augassign".
            self.bind(node.target.value, "augassign", node, node, "end", node.value,
                      target=node.target)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        if isinstance(node.target, cst.Name):
            self.not_loads.add(id(node.target))
            self.bind(node.target.value, "walrus", node, node, "end", node.value,
                      target=node.target)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if node.name is not None and isinstance(node.name.name, cst.Name):
            self.not_loads.add(id(node.name.name))
            self.bind(node.name.name.value, "except", node, node.body, "start",
                      target=node.name.name)

    def visit_For(self, node: cst.For) -> None:
        self.index.loops.append(node)
        self.ends.add(id(node))
        self.bind_target(node.target, "for", node, node.body, "start", None)

    def visit_While(self, node: cst.While) -> None:
        self.index.loops.append(node)
        self.ends.add(id(node))

    def visit_With(self, node: cst.With) -> None:
        self.index.withs.append(node)
        for item in node.items:
            if item.asname is not None:
                self.bind_target(item.asname.name, "with", node, node.body, "start", item.item)

    def visit_Return(self, node: cst.Return) -> None:
        scope = self.stack[-1]
        if isinstance(scope, cst.FunctionDef):
            self.index.returns.setdefault(id(scope), []).append(node)

    # reads
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
        if id(node) in self.not_loads:
            return
        for bound in reversed(self.shadows):
            binding = bound.get(node.value)
            if binding is not None:
                self.index.shadowed[id(node)] = binding
                self.index.shadowed_reads[id(node)] = node
                return
        self.index._load_ids.add(id(node))
        blocks = self.blocks[-1]
        if self.around is None or len(self.around) != len(blocks) or (
            blocks and self.around[-1] != blocks[-1]
        ):
            self.around = tuple(blocks)
        self.index.read_blocks[id(node)] = self.around
        self.index.loads.setdefault((id(self.stack[-1]), node.value), []).append(node)

    def finish(self) -> FileIndex:
        for binding, anchor, when in self.pending:
            binding.order = (
                self.index.order[id(anchor)] if when == "start" else self.end[id(anchor)]
            )
        self.index.loop_spans = [
            (
                self.index.order[id(loop)],
                self.end[id(loop)],
                frozenset(
                    n.value for n in _target_names(loop.target)
                ) if isinstance(loop, cst.For) else frozenset(),
            )
            for loop in self.index.loops
        ]
        for table in (self.index.bindings, self.index.augmented, self.index.attribute_bindings):
            for found in table.values():
                found.sort(key=lambda b: b.order)
        self.index.names = self.names.finish()
        return self.index


def _target_names(target: cst.BaseExpression) -> Iterator[cst.Name]:
    if isinstance(target, cst.Name):
        yield target
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from _target_names(element.value)
    elif isinstance(target, cst.StarredElement):
        yield from _target_names(target.value)


def index_module(module: cst.Module, *riders: cst.CSTVisitor) -> FileIndex:
    """Walk ``module`` once: its ``FileIndex``, qualified names included. ``riders``: read-only
    visitors that walk along (``analysis.Detector``), each seeing every node in walk order, as
    its own ``module.visit`` would (their ``on_visit`` must not prune: the walk is shared).
    Layout nodes (whitespace, comments, punctuation: ``syntax.LAYOUT``) are not walked: the index
    knows nothing of them (no order, scope, type list), nor do the names or the riders."""
    indexer = _Indexer(module, riders)
    walk_code(module, indexer)
    return indexer.finish()


def file_index(fm: FileModel) -> FileIndex:
    """The file's ``FileIndex``, built once and shared by the transforms (the engine builds it
    before detection, which needs the qualified names)."""
    facts = fm.facts
    if facts.index is None:
        facts.index = index_module(fm.module)
    return facts.index


def nodes_of(fm: FileModel, kind: type[N]) -> list[N]:
    """Every ``kind`` node of the file, in file order: ``findall(module, kind())`` without a
    walk of its own (the file's index is built once and shared)."""
    return file_index(fm).by_type.get(kind, [])  # type: ignore[return-value]


def reaching_values(
    index: FileIndex, expr: cst.BaseExpression, at: cst.CSTNode | None = None, depth: int = 0
) -> Iterator[cst.BaseExpression]:
    """``expr``, then what it was assigned from, following reaching bindings of plain names and
    the last assignment of an attribute: ``opt`` -> ``Adam(0.1)``. Depth-limited (8)."""
    yield expr
    if depth > 8:
        return
    if isinstance(expr, cst.Name):
        binding = index.reaching(expr.value, at if at is not None else expr)
        if binding is not None and binding.value is not None and not binding.unpacked:
            yield from reaching_values(index, binding.value, binding.stmt, depth + 1)
    elif isinstance(expr, cst.Attribute):
        found = index.attribute_bindings.get(code(expr), [])
        for binding in found[-1:]:
            if binding.value is not None:
                yield from reaching_values(index, binding.value, binding.stmt, depth + 1)


def imported_names(fm: FileModel) -> list[tuple[str, set[str], cst.CSTNode]]:
    """Module-level names bound by imports: ``(name, qualified names, import statement)``.

    The qualified names are the ones ``Transform.qualified_names`` reads (``program.names``,
    libcst's rules), so ``import torch.nn as nn`` and ``from tensorflow import keras`` resolve
    as Python would."""
    names = file_index(fm).names
    assert names is not None
    return [
        (name, {q.name for q in names.module_names(name)}, node)
        for name, node, imported in names.module_bindings()
        if imported and node is not None
    ]
