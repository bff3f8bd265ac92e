"""Questions on the file's one binding index (``program.index``): the binding a target creates,
its uses, callers and callees, which parameter an argument binds, the training calls and loops of
a file, and file order."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .index import Binding, file_index
from .syntax import findall

if TYPE_CHECKING:
    from .model import FileModel


def binding_of(fm: FileModel, target: cst.CSTNode) -> Binding | None:
    """The binding a store target (Name, Param, ``self.<attr>``) of the original tree creates."""
    if isinstance(target, cst.Attribute):
        if m.matches(target.value, m.Name("self")):
            cls = _method_class(fm, target)
            if cls is not None:
                attr = target.attr.value
                return Binding(attr, None, "attribute", target, target=target, cls=cls, attr=attr)
        return None
    if isinstance(target, (cst.Param, cst.Name)):
        return file_index(fm).by_target.get(id(target))
    return None


def assigned_binding(fm: FileModel, value: cst.CSTNode) -> Binding | None:
    """The binding of ``target = value`` / ``target: T = value`` (one plain target)."""
    parent = fm.parent(value)
    if isinstance(parent, cst.Assign) and parent.value is value and len(parent.targets) == 1:
        return binding_of(fm, parent.targets[0].target)
    if isinstance(parent, cst.AnnAssign) and parent.value is value:
        return binding_of(fm, parent.target)
    return None


def uses(fm: FileModel, binding: Binding) -> list[cst.CSTNode]:
    """Where the binding is read, in file order (Names, or ``self.<attr>`` Attributes)."""
    if binding.cls is not None:
        found = [
            node
            for node in findall(
                binding.cls, m.Attribute(value=m.Name("self"), attr=m.Name(binding.attr))
            )
            if not _is_store(fm, node)
        ]
        return found
    return list(file_index(fm).uses(binding))


def _is_store(fm: FileModel, node: cst.CSTNode) -> bool:
    parent = fm.parent(node)
    if isinstance(parent, (cst.AssignTarget, cst.AugAssign)):
        return True
    return isinstance(parent, cst.AnnAssign) and parent.target is node


def runs_whenever(fm: FileModel, first: cst.CSTNode, then: cst.CSTNode) -> bool:
    """Whether ``first`` (a statement) has run whenever ``then`` runs: in one scope, ``first``
    earlier and every block holding ``first`` (an ``if`` branch, a loop or ``try`` body) holding
    ``then`` too; in another scope (``self.x`` set in ``__init__`` and read in ``fit``, a
    module-level name read in a function), ``first`` in no block of its own scope (whether that
    scope has run first is not this question). A name bound at ``first`` is then bound on
    every path to ``then``; one bound in a branch of an ``if``/``elif`` is not (the bodies of
    ``with`` and of the scope itself always run, as in ``program.index``)."""
    index = file_index(fm)
    blocks = _blocks(fm, first)
    if index.scope(first) is not index.scope(then):
        return not blocks
    if not index.is_before(first, then):
        return False
    return blocks == _blocks(fm, then)[: len(blocks)] or _after_its_guard(fm, first, then)


#: Nodes through which a name read in a loop's header is read whenever the header is.
_ALWAYS_READ = (cst.Attribute, cst.Call, cst.Arg, cst.Subscript, cst.SubscriptElement, cst.Index,
                cst.BinaryOperation, cst.UnaryOperation, cst.Tuple, cst.List, cst.Element)


def _after_its_guard(fm: FileModel, first: cst.CSTNode, then: cst.CSTNode) -> bool:
    """``then``, a loop at module level, runs only after ``first``, a statement of the body of
    an ``if`` before it (``if __name__ == "__main__":`` that binds ``args`` and the loaders, then
    ``for epoch in range(args.epochs):`` past it): the loop's header reads a name bound only in
    that body (not a builtin, no star import), so where the body has not run the loop raises
    NameError before its first pass; where it ran, it ran whole (an exception at module level
    ends the program), ``first`` included."""
    import builtins

    body = next((a for a in fm.ancestors(first) if isinstance(a, cst.IndentedBlock)), None)
    guard = fm.parent(body) if body is not None else None
    if not (isinstance(guard, cst.If) and _blocks(fm, first) == [id(guard.body)]
            and not _blocks(fm, guard) and not _blocks(fm, then)
            and isinstance(fm.parent(guard), cst.Module)):
        return False
    header = then.iter if isinstance(then, cst.For) else (
        then.test if isinstance(then, cst.While) else None)
    if header is None or findall(fm.module, m.ImportStar()):
        return False
    index = file_index(fm)
    for name in findall(header, m.Name()):
        assert isinstance(name, cst.Name)
        if name.value in dir(builtins) or not _always_read(fm, name, header):
            continue
        bindings = index.referents(name)
        if bindings and all(any(a is guard.body for a in fm.ancestors(b.stmt))
                            for b in bindings):
            return True
    return False


def _always_read(fm: FileModel, name: cst.Name, header: cst.CSTNode) -> bool:
    """Whether evaluating ``header`` always reads ``name`` (not under ``and``/``or``, a
    conditional expression, a lambda or a comprehension; not an attribute's name)."""
    child: cst.CSTNode = name
    for parent in fm.ancestors(name):
        if child is header:
            return True
        if not isinstance(parent, _ALWAYS_READ) or (
            isinstance(parent, cst.Attribute) and parent.attr is child
        ):
            return False
        child = parent
    return child is header


def _blocks(fm: FileModel, node: cst.CSTNode) -> list[int]:
    """The blocks around ``node`` inside its scope, outermost first (``program.index``'s)."""
    found: list[int] = []
    child = node
    for parent in fm.ancestors(node):
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            break
        if isinstance(child, (cst.IndentedBlock, cst.SimpleStatementSuite)) and not isinstance(
            parent, cst.With
        ):
            found.append(id(child))
        child = parent
    return found[::-1]


def referents(fm: FileModel, name: cst.Name) -> list[Binding]:
    """The bindings an original Name (a read) may refer to, whatever the order."""
    return file_index(fm).referents(name)


def assigned_values(fm: FileModel, name: cst.Name) -> list[cst.BaseExpression]:
    """The values assigned (``name = value``, not unpacked) to what a Name reads."""
    return [
        b.value
        for b in referents(fm, name)
        if b.kind == "assign" and not b.unpacked and b.value is not None
    ]


def _self_attribute_values(fm: FileModel, attribute: cst.Attribute) -> list[cst.BaseExpression]:
    cls = _method_class(fm, attribute)
    if cls is None:
        return []
    values: list[cst.BaseExpression] = []
    pattern = m.Assign(
        targets=[m.AssignTarget(m.Attribute(m.Name("self"), m.Name(attribute.attr.value)))]
    )
    for assign in findall(cls, pattern):
        assert isinstance(assign, cst.Assign)
        values.append(assign.value)
    return values


def callee(fm: FileModel, call: cst.Call) -> cst.FunctionDef | None:
    """The function of this file that ``call`` calls, or None when that is not known.

    ``f(...)``; ``self.method(...)`` inside the class; ``Cls(...)`` (its ``__init__``);
    ``Cls(...).method(...)`` and ``obj.method(...)`` where ``obj`` is bound once to ``Cls(...)``,
    ``Cls`` a class of this file.
    """
    func = call.func
    if isinstance(func, cst.Name):
        for assignment in referents(fm, func):
            node = getattr(assignment, "node", None)
            if isinstance(node, cst.FunctionDef):
                return node
            if isinstance(node, cst.ClassDef):
                return method_of(node, "__init__")
        return None
    if not isinstance(func, cst.Attribute):
        return None
    if m.matches(func.value, m.Name("self")):
        cls = _method_class(fm, call)
        return method_of(cls, func.attr.value) if cls is not None else None
    cls = _instance_class(fm, func.value)
    return method_of(cls, func.attr.value) if cls is not None else None


def is_dead_definition(fm: FileModel, function: cst.FunctionDef) -> bool:
    """A function nothing can reach: never read, and replaced by a later binding of its name
    that always runs (so importing the module does not reach it either)."""
    index = file_index(fm)
    binding = index.by_target.get(id(function))
    if binding is None or class_of(fm, function) is not None or index.uses(binding):
        return False
    return any(
        other.order > binding.order and other.kind != "augassign" and other.blocks == binding.blocks
        for other in index.bindings_of(binding.name, binding.scope)
    )


def callers(fm: FileModel, function: cst.FunctionDef) -> list[cst.Call]:
    """The calls of ``function`` in this file: by name; for a method, ``self.<name>`` in its
    class and ``obj.<name>`` on an instance of it (see ``callee``); ``Cls(...)`` for
    ``__init__``."""
    cls = class_of(fm, function)
    if cls is not None:
        found = [
            call for call in fm.method_calls(function.name.value) if callee(fm, call) is function
        ]
        if function.name.value == "__init__":
            found += [
                parent
                for ref in _class_references(fm, cls)
                if isinstance(parent := fm.parent(ref), cst.Call) and parent.func is ref
            ]
        order = node_order(fm)
        return sorted(found, key=lambda n: order.get(id(n), -1))
    found = []
    for ref in function_references(fm, function):
        parent = fm.parent(ref)
        if isinstance(parent, cst.Call) and parent.func is ref:
            found.append(parent)
    return found


def arguments_for(
    fm: FileModel, function: cst.FunctionDef, name: str
) -> list[tuple[cst.BaseExpression, cst.Call]]:
    """What the callers of ``function`` pass for its parameter ``name``: ``(value, call)``."""
    found = []
    for call in callers(fm, function):
        for arg in call.args:
            param = param_for_arg(function, call, arg)
            if param is not None and param.name.value == name:
                found.append((arg.value, call))
    return found


def method_of(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    """The method ``name`` defined in the body of ``cls`` itself, or None."""
    if isinstance(cls.body, cst.IndentedBlock):
        for stmt in cls.body.body:
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
                return stmt
    return None


def _instance_class(fm: FileModel, expr: cst.BaseExpression) -> cst.ClassDef | None:
    """The class of this file that ``expr`` is an instance of: ``Cls(...)``, or a name bound
    only to ``Cls(...)``."""
    values: list[cst.BaseExpression] = [expr]
    if isinstance(expr, cst.Name):
        values = assigned_values(fm, expr)
        if not values:
            return None
    classes = set()
    for value in values:
        if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
            return None
        found = [
            node for a in referents(fm, value.func)
            if isinstance(node := getattr(a, "node", None), cst.ClassDef)
        ]
        if len(found) != 1:
            return None
        classes.add(found[0])
    return classes.pop() if len(classes) == 1 else None


def _class_references(fm: FileModel, cls: cst.ClassDef) -> list[cst.CSTNode]:
    binding = file_index(fm).by_target.get(id(cls))
    return list(uses(fm, binding)) if binding is not None else []


def function_references(fm: FileModel, function: cst.FunctionDef) -> list[cst.CSTNode]:
    """Where a function's name is read (calls, callbacks), in file order; [] for methods."""
    binding = file_index(fm).by_target.get(id(function))
    if binding is None or class_of(fm, function) is not None:
        return []
    return list(uses(fm, binding))


def param_for_arg(function: cst.FunctionDef, call: cst.Call, arg: cst.Arg) -> cst.Param | None:
    """The parameter of ``function`` that ``arg`` of ``call`` binds."""
    params = [*function.params.posonly_params, *function.params.params]
    if arg.keyword is not None:
        for param in (*params, *function.params.kwonly_params):
            if param.name.value == arg.keyword.value:
                return param
        return None
    if arg.star:
        return None
    index = 0
    for other in call.args:
        if other is arg:
            break
        if other.star:
            return None
        if other.keyword is None:
            index += 1
    if params and params[0].name.value in ("self", "cls"):
        index += 1  # bound by the call: ``obj.method(x)``, ``Cls(x)``
    return params[index] if index < len(params) else None


def class_of(fm: FileModel, function: cst.FunctionDef) -> cst.ClassDef | None:
    block = fm.parent(function)
    cls = fm.parent(block) if isinstance(block, cst.IndentedBlock) else None
    return cls if isinstance(cls, cst.ClassDef) else None


def _method_class(fm: FileModel, node: cst.CSTNode) -> cst.ClassDef | None:
    """The class of the method ``node`` is in (through nested functions)."""
    for parent in fm.ancestors(node):
        if isinstance(parent, cst.FunctionDef):
            cls = class_of(fm, parent)
            if cls is not None:
                return cls
    return None


def training_calls(fm: FileModel) -> set[cst.CSTNode]:
    """``.backward()``/``.step()`` calls, and calls of this file's functions that make them."""
    facts = fm.facts
    if facts.training_calls is not None:
        return facts.training_calls
    sites: set[cst.CSTNode] = {*fm.method_calls("backward"), *fm.method_calls("step")}
    functions: set[cst.FunctionDef] = set()
    frontier = [f for f in (fm.enclosing_function(s) for s in sites) if f is not None]
    while frontier:
        function = frontier.pop()
        if function in functions:
            continue
        functions.add(function)
        for call in callers(fm, function):
            sites.add(call)
            outer = fm.enclosing_function(call)
            if outer is not None:
                frontier.append(outer)
    facts.training_calls = sites
    return sites


def training_loops(fm: FileModel) -> set[cst.CSTNode]:
    """Loops whose body calls ``.backward()``/``.step()``, directly or via this file's functions."""
    facts = fm.facts
    if facts.training_loops is not None:
        return facts.training_loops
    loops: set[cst.CSTNode] = set()
    for site in training_calls(fm):
        for parent in fm.ancestors(site):
            if isinstance(parent, (cst.For, cst.While)):
                loops.add(parent)
    facts.training_loops = loops
    return loops


def node_order(fm: FileModel) -> dict[int, int]:
    """Position of every original node in a pre-order walk (to sort nodes in file order)."""
    return file_index(fm).order


def names_in(fm: FileModel, scope: cst.CSTNode) -> set[str]:
    """Every identifier (variables, attributes, parameters) used inside ``scope``, a function,
    class or the module: a new name must avoid them. Built once per file from the parent map."""
    cached = fm.facts.names
    if cached is None:
        cached = {id(fm.module): set[str]()}
        owner: dict[int, cst.CSTNode] = {}  # node -> nearest enclosing def/class
        for node, parent in fm.info.parents.items():
            holder: cst.CSTNode | None = (
                parent if isinstance(parent, (cst.FunctionDef, cst.ClassDef)) else None
            )
            holder = holder or owner.get(id(parent))
            if holder is not None:
                owner[id(node)] = holder
            if type(node) is cst.Name:
                cached[id(fm.module)].add(node.value)
                while holder is not None:
                    cached.setdefault(id(holder), set()).add(node.value)
                    holder = owner.get(id(holder))
        fm.facts.names = cached
    return set(cached.get(id(scope), ()))
