"""Qualified names of a file's nodes, as libcst's ``QualifiedNameProvider`` gives them, from the
index's one walk.

libcst's provider stands on its scope analysis (``ScopeProvider``, itself on
``ExpressionContextProvider``): two more walks of the tree and an object per node, about three
times the parse, on every pass. The converter asks for the names of a few hundred nodes. Here the
scopes, bindings and reads are collected during ``program.index``'s walk (``Collector``, fed by
``_Indexer``), and a node's names are worked out when it is asked about (``QualifiedNames``, the
mapping the engine hands the transforms as ``QualifiedNameProvider``'s metadata), by libcst's
rules, so every answer is the one libcst gives (``tests/program/test_names.py`` compares them
on every fixture):

- Scopes: the module (its parent: the builtins), a function or lambda (qualified names
  ``f.<locals>.x``; a lambda's ``<locals>.x``), a class (``A.x``; not visible from the functions
  and comprehensions inside it), a comprehension (``<comprehension>.x``; its first iterable is
  read outside it). Decorators, return annotations, parameter defaults and annotations, class
  bases and keywords are read in the enclosing scope.
- Bindings: assignment, annotated and augmented assignment, walrus, ``for`` and comprehension
  targets, ``as`` names (``with``, ``except``), parameters, ``def``, ``class`` and imports;
  ``global``/``nonlocal`` move a name's bindings to the module or the enclosing function.
  ``import a.b`` binds ``a.b`` and ``a``; ``import a.b as c`` binds ``c``; ``from .m import y``
  gives ``.m.y``. A star import binds nothing.
- A read (a ``Name`` that is not stored to) sees the bindings of the scope that binds the name:
  in its own scope those before it (by statement, libcst's count), from an inner scope all of
  them; none before it: the enclosing scope's. Its names are those of what it sees (an import's
  ``torch.optim`` for ``optim``, ``builtins.print``, ``f.<locals>.x``). A read heading a dotted
  name that a dotted import binds (``a.b`` of ``import a.b``) is a read of that attribute.
- Any other node with a dotted name (``Attribute``, ``Call`` by its callee, ``Subscript`` by its
  value, a definition, a ``Decorator``): every binding in its scope of its longest bound prefix,
  wherever it is (flow-insensitive), with the rest of the name appended; a binding's own node
  (a stored-to ``Name``, the ``def``) answers by that binding alone.

Not reproduced (the converter does not ask): libcst parses string annotations (``x: "Tensor"``)
and answers for the string node, here a string has no names; PEP 695 type parameters.
"""

from __future__ import annotations

import builtins
from bisect import bisect_left
from collections.abc import Iterator, Mapping

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import QualifiedName, QualifiedNameSource

__all__ = ["Collector", "QualifiedNames"]

_IMPORT, _LOCAL, _BUILTIN = "import", "local", "builtin"
_LOAD, _STORE, _SKIP = 0, 1, 2  # what a Name is: a read, a binding, or neither (a def's name)

#: Nodes whose end moves their scope's count (libcst's ``_ASSIGNMENT_LIKE_NODES``, less PEP 695).
#: Sets of exact types: ``isinstance`` on libcst's ABCs costs more than the rest of a node's visit.
_COUNTED = frozenset({
    cst.AnnAssign, cst.AsName, cst.Assign, cst.AugAssign, cst.ClassDef, cst.CompFor,
    cst.FunctionDef, cst.Global, cst.Import, cst.ImportFrom, cst.NamedExpr, cst.Nonlocal,
    cst.Parameters, cst.WithItem,
})
_COMPREHENSIONS = frozenset({cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp})


class _Binding:
    """One binding of a name in a scope; ``index``: the scope's count when it was made."""

    __slots__ = ("name", "scope", "node", "index", "kind")

    def __init__(
        self, name: str, scope: _Scope, node: cst.CSTNode | None, index: int, kind: str
    ) -> None:
        self.name, self.scope, self.node, self.index, self.kind = name, scope, node, index, kind

    def qualified_names(self, full_name: str) -> set[QualifiedName]:
        if self.kind == _BUILTIN:
            return {QualifiedName(f"builtins.{self.name}", QualifiedNameSource.BUILTIN)}
        if self.kind == _LOCAL:
            prefix = self.scope.prefix
            return {QualifiedName(
                f"{prefix}.{full_name}" if prefix else full_name, QualifiedNameSource.LOCAL
            )}
        return _import_names(self.node, full_name)  # type: ignore[arg-type]


def _import_names(stmt: cst.Import | cst.ImportFrom, full_name: str) -> set[QualifiedName]:
    """What ``full_name`` is, spelled through the names ``stmt`` imports (libcst's
    ``ImportAssignment.get_qualified_names_for``): the longest imported dotted name that it
    starts with, under the module it is imported from."""
    module = ""
    if isinstance(stmt, cst.ImportFrom):
        if stmt.module is not None:
            module = get_full_name_for_node(stmt.module) or ""
        if stmt.relative:
            module = "." * len(stmt.relative) + module
    found: set[QualifiedName] = set()
    if isinstance(stmt.names, cst.ImportStar):
        return found
    for alias in stmt.names:
        imported = get_full_name_for_node(alias.name)
        if not imported:
            continue
        parts = imported.split(".")
        for real in (".".join(parts[:i]) for i in range(len(parts), 0, -1)):
            as_name = real
            if module.endswith("."):
                real = f"{module}{real}"  # from . import a: ".a"
            elif module:
                real = f"{module}.{real}"
            if alias.asname is not None and alias.evaluated_alias is not None:
                as_name = alias.evaluated_alias
            if full_name.startswith(as_name):
                rest = full_name.split(as_name, 1)[1]
                if rest and not rest.startswith("."):
                    continue
                rest = rest.lstrip(".")
                found.add(QualifiedName(
                    f"{real}.{rest}" if rest else real, QualifiedNameSource.IMPORT
                ))
                break
    return found


class _Scope:
    """A module, function (or lambda), class or comprehension scope, or the builtins."""

    __slots__ = (
        "kind", "parent", "prefix", "bindings", "count", "moved", "deferring",
        "pending", "elt_count", "_builtins",
    )

    def __init__(self, kind: str, parent: _Scope | None, name: str | None = None) -> None:
        self.kind = kind
        self.parent: _Scope = parent if parent is not None else self
        self.bindings: dict[str, list[_Binding]] = {}
        self.count = 0
        #: ``global``/``nonlocal`` names -> the scope named (the module, the parent).
        self.moved: dict[str, _Scope] = {}
        #: A comprehension's element is walked before its ``for``, but comes after it: the
        #: bindings and reads made while ``deferring`` get the ``for``'s count at the end.
        self.deferring = False
        self.pending: list[_Binding | _Read] = []
        self.elt_count = 0
        self._builtins: dict[str, list[_Binding]] = {}
        up: str = self.parent.prefix if parent is not None else ""
        self.prefix: str
        if kind == "function":
            self.prefix = ".".join(p for p in (up, name, "<locals>") if p)
        elif kind == "class":
            self.prefix = ".".join(p for p in (up, name) if p)
        elif kind == "comprehension":
            self.prefix = ".".join(p for p in (up, "<comprehension>") if p)
        else:
            self.prefix = ""

    def _visible_parent(self, first: _Scope | None = None) -> _Scope:
        """The scope whose names this one sees next: class scopes are skipped."""
        parent = first if first is not None else self.parent
        while parent.kind == "class":
            parent = parent.parent
        return parent

    def contains(self, name: str) -> bool:
        """Whether ``name`` is bound here or in a scope visible from here."""
        if self.kind == "builtins":
            return hasattr(builtins, name)
        if self.kind == "module":
            return name in self.bindings or self.parent.contains(name)
        if name in self.moved:
            return self.moved[name].contains(name)
        return name in self.bindings or self._visible_parent().contains(name)

    def resolve(self, name: str) -> list[_Binding]:
        """Every binding of ``name`` a read here may see, in the scope that binds it."""
        if self.kind == "builtins":
            if not hasattr(builtins, name):
                return []
            if name not in self._builtins:
                self._builtins[name] = [_Binding(name, self, None, -1, _BUILTIN)]
            return self._builtins[name]
        if self.kind != "module" and name in self.moved:
            return self._visible_parent(self.moved[name]).resolve(name)
        if name in self.bindings:
            return self.bindings[name]
        return self._visible_parent().resolve(name)

    def target(self, name: str) -> _Scope:
        """The scope a binding of ``name`` made here goes to."""
        if self.kind != "module" and name in self.moved:
            return self._visible_parent(self.moved[name]).target(name)
        return self

    def bind(self, name: str, node: cst.CSTNode, kind: str = _LOCAL) -> None:
        scope = self.target(name)
        binding = _Binding(name, scope, node, scope.count, kind)
        scope.bindings.setdefault(name, []).append(binding)
        if scope.deferring:
            scope.pending.append(binding)


class _Read:
    """A ``Name`` read in ``scope``; ``enclosing``: the outermost attribute chain around it."""

    __slots__ = ("node", "name", "scope", "index", "enclosing", "_seen")

    def __init__(self, node: cst.Name, scope: _Scope, enclosing: cst.Attribute | None) -> None:
        self.node: cst.Name | cst.Attribute = node
        self.name = node.value
        self.scope = scope
        self.index = scope.count
        self.enclosing = enclosing
        self._seen: list[_Binding] | None = None

    def referents(self) -> list[_Binding]:
        """The bindings this read sees (libcst's ``Access.record_assignments``)."""
        if self._seen is None:
            scope = self.scope
            bound = scope.resolve(self.name)
            seen = [b for b in bound if b.scope is not scope or b.index < self.index]
            if not seen and bound:
                seen = scope.parent.resolve(self.name)
            self._seen = seen
        return self._seen


def _dotted_names(node: cst.Attribute | cst.Name) -> Iterator[tuple[str, cst.CSTNode]]:
    """``a.b.c`` -> ``("a.b.c", a.b.c), ("a.b", a.b), ("a", a)`` (libcst's
    ``_gen_dotted_names``, whose quirk with a call in the chain is kept)."""
    if isinstance(node, cst.Name):
        yield node.value, node
        return
    value = node.value
    if isinstance(value, cst.Call):
        if isinstance(value.func, (cst.Attribute, cst.Name)):
            yield from _dotted_names(value.func)
    elif isinstance(value, (cst.Attribute, cst.Name)):
        inner = _dotted_names(value)
        first = next(inner, None)
        if first is not None:
            yield f"{first[0]}.{node.attr.value}", node
            yield first
            yield from inner


class Collector:
    """Scopes, bindings and reads, collected node by node in a walk of the whole module.

    ``visit(node, parent)`` on entering each node, ``leave(node)`` on leaving it; the walk must
    not enter ``Import``/``ImportFrom`` (their names are bound here, on entry).
    """

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.globals = _Scope("module", _Scope("builtins", None))
        #: id(node) -> the scope it is in (libcst's ``ScopeProvider`` answer); nodes libcst
        #: leaves without one (an attribute's name, a keyword) are not here.
        self.scope_of: dict[int, _Scope] = {}
        self.reads: list[_Read] = []
        self.dotted = False  # whether a dotted import binds a dotted name
        #: Per node being visited: (its scope, what a Name there is, the scope it opens,
        #: the scope whose count moves when it is left).
        self.frames: list[tuple[_Scope | None, int, _Scope | None, _Scope | None]] = []
        self.attributes: list[cst.Attribute | None] = [None]

    # -- the walk -----------------------------------------------------------------------------

    def visit(self, node: cst.CSTNode, parent: cst.CSTNode | None, key: int) -> None:
        """Enter ``node`` (``key``: its id, the index's own key object, shared)."""
        if parent is None:
            scope: _Scope | None = self.globals
            role, opened, bump = _LOAD, None, None
        else:
            scope, role, opened, bump = self._context(node, parent)
        if scope is None:
            self.frames.append((None, role, None, None))
            return
        self.scope_of[key] = scope
        kind = type(node)
        if kind is cst.Name:
            if role == _LOAD:
                read = _Read(node, scope, self.attributes[-1])  # type: ignore[arg-type]
                self.reads.append(read)
                if scope.deferring:
                    scope.pending.append(read)
            elif role == _STORE:
                scope.bind(node.value, node)  # type: ignore[attr-defined]
        elif kind is cst.Attribute:
            if self.attributes[-1] is None:
                self.attributes[-1] = node  # type: ignore[call-overload]
        elif kind is cst.Call:
            self.attributes.append(None)
        elif kind is cst.FunctionDef or kind is cst.ClassDef:
            name = node.name.value  # type: ignore[attr-defined]
            scope.bind(name, node)
            opened = _Scope("function" if kind is cst.FunctionDef else "class", scope, name)
        elif kind is cst.Lambda:
            opened = _Scope("function", scope)
        elif kind in _COMPREHENSIONS:
            opened = _Scope("comprehension", scope)
            opened.deferring = True
        elif kind is cst.Param:
            scope.bind(node.name.value, node)  # type: ignore[attr-defined]
        elif kind is cst.Import or kind is cst.ImportFrom:
            self._import(node, scope)  # type: ignore[arg-type]
        elif (kind is cst.Global or kind is cst.Nonlocal) and scope.kind != "module":
            moved = self.globals if kind is cst.Global else scope.parent
            for item in node.names:  # type: ignore[attr-defined]
                scope.moved[item.name.value] = moved
        self.frames.append((scope, role, opened, bump))

    def leave(self, node: cst.CSTNode) -> None:
        scope, _role, opened, bump = self.frames.pop()
        if scope is None:
            return
        kind = type(node)
        if kind is cst.Attribute:
            if self.attributes[-1] is node:
                self.attributes[-1] = None
        elif kind is cst.Call:
            self.attributes.pop()
        elif kind in _COMPREHENSIONS:
            assert opened is not None
            for later in opened.pending:
                later.index += opened.count
            opened.count += opened.elt_count
        if kind in _COUNTED and not (kind is cst.CompFor and opened is not None):
            scope.count += 1  # (not by a comprehension's first ``for``: libcst never leaves it)
        if bump is not None:
            bump.count += 1

    def _context(
        self, node: cst.CSTNode, parent: cst.CSTNode
    ) -> tuple[_Scope | None, int, _Scope | None, _Scope | None]:
        """The scope ``node`` is in, what a Name there is, and the count it moves when left."""
        scope, role, opened, _ = self.frames[-1]
        if scope is None:
            return None, _LOAD, None, None
        kind = type(parent)
        if kind not in _PARENTS:
            return scope, role, None, None
        if kind is cst.Attribute:
            return (None if node is parent.attr else scope), _LOAD, None, None  # type: ignore[attr-defined]
        if kind is cst.Subscript:
            return scope, _LOAD, None, None
        if kind is cst.Arg:
            return (None if node is parent.keyword else scope), role, None, None  # type: ignore[attr-defined]
        if kind is cst.Global or kind is cst.Nonlocal:
            return None, _LOAD, None, None
        if kind in _TARGETED:
            if node is getattr(parent, _TARGETED[kind]):
                return scope, _STORE, None, None
            return scope, role, None, None
        if kind is cst.For:
            if node is parent.target:  # type: ignore[attr-defined]
                return scope, _STORE, None, scope  # the loop's body comes after its target
            return scope, role, None, None
        if kind is cst.CompFor:
            if opened is None:  # an inner ``for`` of a comprehension: all in its scope
                return scope, (_STORE if node is parent.target else role), None, None  # type: ignore[attr-defined]
            if node is parent.target:  # type: ignore[attr-defined]
                opened.deferring = False
                opened.elt_count, opened.count = opened.count, 0
                return opened, _STORE, None, opened
            if node is parent.iter:  # type: ignore[attr-defined]
                return scope, _LOAD, None, None
            return opened, _LOAD, None, None
        if kind in _COMPREHENSIONS:
            if node is parent.for_in:  # type: ignore[attr-defined]
                return scope, _LOAD, opened, None  # the first ``for``: its parts pick their scope
            return opened, _LOAD, None, None
        if kind is cst.FunctionDef or kind is cst.ClassDef:
            if node is parent.name:  # type: ignore[attr-defined]
                return scope, _SKIP, None, None
            if node is parent.body or (  # type: ignore[attr-defined]
                kind is cst.FunctionDef and node is parent.params  # type: ignore[attr-defined]
            ):
                return opened, _LOAD, None, None
            return scope, _LOAD, None, None  # decorators, bases, keywords, the return annotation
        if kind is cst.Lambda:
            if node is parent.params or node is parent.body:  # type: ignore[attr-defined]
                return opened, _LOAD, None, None
            return scope, _LOAD, None, None
        if kind is cst.Param:
            if node is parent.name:  # type: ignore[attr-defined]
                return scope, _SKIP, None, None
            if node is parent.default or node is parent.annotation:  # type: ignore[attr-defined]
                return scope.parent, _LOAD, None, None
            return scope, role, None, None
        return scope, role, None, None

    def _import(self, stmt: cst.Import | cst.ImportFrom, scope: _Scope) -> None:
        if isinstance(stmt.names, cst.ImportStar):
            return
        for alias in stmt.names:
            named = alias.asname.name if alias.asname is not None else alias.name
            if not isinstance(named, (cst.Name, cst.Attribute)):
                continue
            for name, _ in _dotted_names(named):
                self.dotted = self.dotted or "." in name
                scope.bind(name, stmt, _IMPORT)

    def finish(self) -> QualifiedNames:
        return QualifiedNames(self)


#: Parents whose one field is stored to (libcst's ``ExpressionContextProvider``'s STORE).
_TARGETED: dict[type, str] = {
    cst.AssignTarget: "target", cst.AnnAssign: "target", cst.AugAssign: "target",
    cst.NamedExpr: "target", cst.AsName: "name",
}


#: The parents that give a child another scope or role than their own.
_PARENTS = frozenset({
    cst.Attribute, cst.Subscript, cst.Arg, cst.Global, cst.Nonlocal, cst.For, cst.CompFor,
    cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Param, *_TARGETED, *_COMPREHENSIONS,
})


def _is_binding_node(node: cst.CSTNode, binding: _Binding) -> bool:
    """``node`` is the binding's own node (libcst's ``_is_assignment``)."""
    if node is binding.node:
        return True
    stmt = binding.node
    if isinstance(stmt, (cst.Import, cst.ImportFrom)) and not isinstance(
        stmt.names, cst.ImportStar
    ):
        for alias in stmt.names:
            if alias.name is node or (alias.asname is not None and alias.asname.name is node):
                return True
    return False


class QualifiedNames(Mapping[cst.CSTNode, object]):
    """node -> the set of ``QualifiedName`` libcst's ``QualifiedNameProvider`` gives it, worked
    out on first use. A node the walk gave no scope (an attribute's own name, a keyword, a
    node outside the tree) has none."""

    def __init__(self, collected: Collector) -> None:
        self._collected = collected
        self._scope_of = collected.scope_of
        self._found: dict[int, set[QualifiedName]] = {}
        #: id(a scope's list of bindings of a name) -> its ``_Seen``.
        self._seen: dict[int, _Seen] = {}
        #: (id(scope), dotted name) -> the bindings of its longest bound prefix, their qualified
        #: names, and the ids of the nodes that answer by their own binding alone.
        self._dotted: dict[tuple[int, str], tuple[list[_Binding], set[QualifiedName], set[int]]]
        self._dotted = {}
        #: id(node) -> the reads that are reads of it (a Name; or the attribute of a dotted
        #: import that a read heads).
        self._reads: dict[int, list[_Read]] = {}
        for read in collected.reads:
            if read.enclosing is not None and collected.dotted:
                for dotted, node in _dotted_names(read.enclosing):
                    if read.scope.contains(dotted):
                        read.node, read.name = node, dotted  # type: ignore[assignment]
                        break
            self._reads.setdefault(id(read.node), []).append(read)
        #: Names a ``from <project module> import *`` brings, with what they are there
        #: (``ModelCheckpoint`` -> ``keras.callbacks.ModelCheckpoint``): the project run's
        #: answer (``ModuleFacts.star_names``), given to a name the file itself never binds.
        #: Empty on its own, as libcst (which sees nothing through a star import).
        self.star_names: Mapping[str, str] = {}

    def __getitem__(self, node: cst.CSTNode) -> set[QualifiedName]:
        found = self._found.get(id(node))
        if found is None:
            found = self._found[id(node)] = self._names(node) or self._star_names(node)
        return found

    def _star_names(self, node: cst.CSTNode) -> set[QualifiedName]:
        if not self.star_names or not isinstance(node, (cst.Name, cst.Attribute)):
            return set()
        scope = self._scope_of.get(id(node))
        full_name = get_full_name_for_node(node)
        if scope is None or full_name is None:
            return set()
        head, _, rest = full_name.partition(".")
        source = self.star_names.get(head)
        if source is None or scope.resolve(head):
            return set()
        return {QualifiedName(f"{source}.{rest}" if rest else source,
                              QualifiedNameSource.IMPORT)}

    def _names(self, node: cst.CSTNode) -> set[QualifiedName]:
        scope = self._scope_of.get(id(node))
        if scope is None:
            return set()
        reads = self._reads.get(id(node))
        if reads:
            return {q for read in reads for q in self._read_names(read)}
        full_name = get_full_name_for_node(node)
        if full_name is None:
            return set()
        key = (id(scope), full_name)
        found = self._dotted.get(key)
        if found is None:
            bound = _longest_bound(scope, full_name)
            own = {
                id(n) for b in bound if b.kind != _BUILTIN for n in _binding_nodes(b)
            }
            found = self._dotted[key] = (
                bound, {q for b in bound for q in b.qualified_names(full_name)}, own
            )
        bound, names, own = found
        if id(node) in own:
            return _names_in(scope, full_name, node)
        return set(names)

    def _read_names(self, read: _Read) -> set[QualifiedName]:
        """The qualified names of what ``read`` sees: those of ``read.referents()``, without
        listing them (a name bound in every block of a long file is seen by each later read
        in all its bindings, which share their few names)."""
        scope = read.scope
        bound = scope.resolve(read.name)
        if not bound:
            return set()
        count = len(bound)
        if bound[0].scope is scope:
            seen = self._seen_of(bound)
            if seen is None:
                return {q for b in read.referents() for q in b.qualified_names(b.name)}
            count = seen.before(read.index)
            if not count:
                bound = scope.parent.resolve(read.name)
                count = len(bound)
                if not bound:
                    return set()
        seen = self._seen_of(bound)
        if seen is None:
            return {q for b in bound[:count] for q in b.qualified_names(b.name)}
        return seen.names(count)

    def _seen_of(self, bound: list[_Binding]) -> _Seen | None:
        """``bound``'s ``_Seen`` (None where its counts are not in order)."""
        key = id(bound)
        if key not in self._seen:
            self._seen[key] = _Seen.of(bound)
        return self._seen[key]

    def module_names(self, name: str) -> set[QualifiedName]:
        """What ``name`` is at module level (libcst's ``get_qualified_names_for(name)``)."""
        return _names_in(self._collected.globals, name, None)

    def module_bindings(self) -> Iterator[tuple[str, cst.CSTNode | None, bool]]:
        """Every module-level binding: ``(name, its node, whether an import made it)``, by name
        in the order names are first bound (a dotted import's ``a.b`` included)."""
        for name, bound in self._collected.globals.bindings.items():
            for binding in bound:
                yield name, binding.node, binding.kind == _IMPORT

    def __iter__(self) -> Iterator[cst.CSTNode]:
        scope_of = self._scope_of
        stack: list[cst.CSTNode] = [self._collected.module]
        while stack:
            node = stack.pop()
            if id(node) in scope_of:
                yield node
            stack.extend(node.children)

    def __len__(self) -> int:
        return len(self._scope_of)


class _Seen:
    """One scope's bindings of a name, in the order they were made, as the reads in that scope
    see them: a read sees those made before it (a prefix of the list, by count), whose qualified
    names are the first appearances of each in the list before that point."""

    __slots__ = ("counts", "firsts", "positions")

    def __init__(self, counts: list[int], firsts: list[tuple[int, QualifiedName]]) -> None:
        self.counts = counts
        self.firsts = firsts
        self.positions = [position for position, _ in firsts]

    @classmethod
    def of(cls, bound: list[_Binding]) -> _Seen | None:
        counts = [b.index for b in bound]
        if any(a > b for a, b in zip(counts, counts[1:], strict=False)):
            return None  # (a comprehension's deferred counts): the reads list them
        firsts: list[tuple[int, QualifiedName]] = []
        known: set[QualifiedName] = set()
        for position, binding in enumerate(bound):
            for q in binding.qualified_names(binding.name):
                if q not in known:
                    known.add(q)
                    firsts.append((position, q))
        return cls(counts, firsts)

    def before(self, count: int) -> int:
        """How many of the bindings were made before the scope's count was ``count``."""
        return bisect_left(self.counts, count)

    def names(self, seen: int) -> set[QualifiedName]:
        """The qualified names of the first ``seen`` bindings."""
        return {q for _, q in self.firsts[: bisect_left(self.positions, seen)]}


def _binding_nodes(binding: _Binding) -> Iterator[cst.CSTNode]:
    """The nodes ``_is_binding_node`` says are the binding's own."""
    if binding.node is not None:
        yield binding.node
    stmt = binding.node
    if isinstance(stmt, (cst.Import, cst.ImportFrom)) and not isinstance(
        stmt.names, cst.ImportStar
    ):
        for alias in stmt.names:
            yield alias.name
            if alias.asname is not None:
                yield alias.asname.name


def _longest_bound(scope: _Scope, full_name: str) -> list[_Binding]:
    """The bindings of the longest prefix of the dotted ``full_name`` bound where it is read."""
    prefix: str | None = full_name
    while prefix:
        if scope.contains(prefix):
            return scope.resolve(prefix)
        dot = prefix.rfind(".")
        prefix = None if dot == -1 else prefix[:dot]
    return []


def _names_in(scope: _Scope, full_name: str, node: cst.CSTNode | None) -> set[QualifiedName]:
    """A dotted name's qualified names where it is written: every binding of its longest bound
    prefix; the binding's own node, by that binding alone."""
    bound = _longest_bound(scope, full_name)
    if node is not None:
        for binding in bound:
            if binding.kind != _BUILTIN and _is_binding_node(node, binding):
                return binding.qualified_names(full_name)
    return {q for binding in bound for q in binding.qualified_names(full_name)}
