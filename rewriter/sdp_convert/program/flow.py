"""Where a value goes: from the call that makes it (a DataLoader, say) forward through
assignments, ``self.<attr>``, arguments into parameters, returns (tuples too) and ``iter()``, to the
loops that iterate it, and the epoch loop around those.

Policy: at most 4 calls deep; a parameter is followed into the function's body (every use); a
returned value is followed to every caller; nothing is guessed when a call's target is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from ..base import Transform
from .index import file_index
from .scopes import (
    Binding,
    _method_class,
    assigned_binding,
    binding_of,
    callee,
    callers,
    param_for_arg,
    uses,
)


@dataclass
class Site:
    """A loop that iterates the loader (``for x in loader``, ``next(it)`` in a loop)."""

    loop: cst.For | cst.While
    use: cst.CSTNode  # the expression holding the loader there
    binding: Binding | None  # the binding ``use`` reads; None for the DataLoader call itself
    # (call, use, binding) through which the loader was passed down to the loop's function.
    trail: tuple[tuple[cst.Call, cst.CSTNode, Binding | None], ...] = ()


def unpacked_target(t: Transform, value: cst.CSTNode, index: int, size: int) -> cst.CSTNode | None:
    """In ``a, b = value``, the ``index``-th target (when there are ``size``, none starred)."""
    assign = t.parent(value)
    if not (isinstance(assign, cst.Assign) and assign.value is value and len(assign.targets) == 1):
        return None
    target = assign.targets[0].target
    if not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) != size:
        return None
    if any(isinstance(e, cst.StarredElement) for e in target.elements):
        return None
    return target.elements[index].value


def range_loop_around(t: Transform, node: cst.CSTNode) -> cst.For | None:
    """The nearest ``for <name> in range(...)`` (or ``trange``/``tqdm(range(...))``) around node."""
    child = node
    for parent in t.ancestors(node):
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
        if (
            isinstance(parent, cst.For)
            and child is parent.body
            and isinstance(parent.target, cst.Name)
        ):
            it = parent.iter
            if isinstance(it, cst.Call) and (
                t.refers_to(it.func, "builtins.range")
                or any(q.endswith(".trange") for q in t.qualified_names(it.func))
                or (
                    it.args
                    and isinstance(it.args[0].value, cst.Call)
                    and t.refers_to(it.args[0].value.func, "builtins.range")
                )
            ):
                return parent
        child = parent
    return None


def loader_sites(t: Transform, call: cst.Call) -> tuple[list[Site], set[int]]:
    """The loops iterating the loader, and every node its value was followed through."""
    sites: list[Site] = []
    seen: set[int] = set()
    follow(t, call, None, (), 0, sites, seen)
    return sites, seen


def follow(
    t: Transform,
    node: cst.CSTNode,
    binding: Binding | None,
    trail: tuple[tuple[cst.Call, cst.CSTNode, Binding | None], ...],
    depth: int,
    sites: list[Site],
    seen: set[int],
) -> None:
    """Follow the value of ``node`` to the loops that iterate it."""
    if id(node) in seen or depth > 4:
        return
    seen.add(id(node))
    loop = iterated_by(t, node)
    if loop is not None:
        sites.append(Site(loop, node, binding, trail))
        return
    target = assigned_binding(t, node)
    if target is not None:
        for use in uses(t, target):
            follow(t, use, target, trail, depth, sites, seen)
        return
    parent = t.parent(node)
    if isinstance(parent, cst.Arg) and parent.value is node:
        call = t.parent(parent)
        if not isinstance(call, cst.Call):
            return
        if t.refers_to(call.func, "builtins.iter"):
            _follow_iterator(t, call, binding, trail, depth, sites, seen)
            return
        function = callee(t, call)
        param = param_for_arg(function, call, parent) if function is not None else None
        if param is not None:
            param_binding = binding_of(t, param)
            if param_binding is not None:
                for use in uses(t, param_binding):
                    follow(
                        t,
                        use,
                        param_binding,
                        (*trail, (call, node, binding)),
                        depth + 1,
                        sites,
                        seen,
                    )
        return
    if isinstance(parent, cst.Return) and parent.value is node:
        function = t.enclosing_function(node)
        for caller in callers(t, function) if function is not None else ():
            follow(t, caller, None, (), depth + 1, sites, seen)
        return
    # ``return train, val`` ... ``train_loader, val_loader = get_loaders()``
    tuple_node = t.parent(parent) if isinstance(parent, cst.Element) else None
    returned = t.parent(tuple_node) if isinstance(tuple_node, cst.Tuple) else None
    if isinstance(returned, cst.Return) and returned.value is tuple_node:
        assert isinstance(tuple_node, cst.Tuple)
        index = next(i for i, e in enumerate(tuple_node.elements) if e is parent)
        function = t.enclosing_function(node)
        for caller in callers(t, function) if function is not None else ():
            element = unpacked_target(t, caller, index, len(tuple_node.elements))
            unpacked = binding_of(t, element) if element is not None else None
            if unpacked is not None:
                for use in uses(t, unpacked):
                    follow(t, use, unpacked, (), depth + 1, sites, seen)


def _follow_iterator(
    t: Transform,
    iter_call: cst.Call,
    binding: Binding | None,
    trail: tuple[tuple[cst.Call, cst.CSTNode, Binding | None], ...],
    depth: int,
    sites: list[Site],
    seen: set[int],
) -> None:
    """``it = iter(loader)`` ... ``next(it)`` inside a loop: that loop iterates the loader."""
    target = assigned_binding(t, iter_call)
    if target is None:
        return
    for use in uses(t, target):
        arg = t.parent(use)
        call = t.parent(arg) if isinstance(arg, cst.Arg) else None
        if isinstance(call, cst.Call) and t.refers_to(call.func, "builtins.next"):
            loop = enclosing_loop(t, call)
            if loop is not None:
                sites.append(Site(loop, iter_call.args[0].value, binding, trail))


def iterated_by(t: Transform, node: cst.CSTNode) -> cst.For | None:
    """The ``for`` whose iterable is ``node``, possibly wrapped (``enumerate(node)``)."""
    for _ in range(4):
        parent = t.parent(node)
        if isinstance(parent, cst.For) and parent.iter is node:
            return parent
        if not (isinstance(parent, cst.Arg) and parent.value is node):
            return None
        call = t.parent(parent)
        if not isinstance(call, cst.Call) or t.refers_to(
            call.func, "builtins.iter", "builtins.len"
        ):
            return None
        node = call
    return None


def enclosing_loop(t: Transform, node: cst.CSTNode) -> cst.For | cst.While | None:
    for parent in t.ancestors(node):
        if isinstance(parent, (cst.For, cst.While)):
            return parent
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
    return None


def holds_only(t: Transform, holder: Binding, flow: set[int]) -> bool:
    """A parameter: whether every call of its function passes this loader to it."""
    param = getattr(holder.assignment, "node", None)
    if not isinstance(param, cst.Param):
        return True
    function = t.enclosing_function(param)
    if function is None:
        return False
    calls = callers(t, function)
    for call in calls:
        arg = next((a for a in call.args if param_for_arg(function, call, a) is param), None)
        if arg is None or id(arg.value) not in flow:
            return False
    return bool(calls)


def _epoch_loop_of_callers(t: Transform, root: Binding, start: cst.CSTNode) -> cst.For | None:
    frontier = [t.enclosing_function(start)]
    for _ in range(3):
        next_frontier: list[cst.FunctionDef | None] = []
        for function in frontier:
            for caller in callers(t, function) if function is not None else ():
                loop = range_loop_around(t, caller)
                if loop is not None and (
                    root.cls is None or _method_class(t, caller) is root.cls
                ):
                    return loop
                next_frontier.append(t.enclosing_function(caller))
        frontier = next_frontier
    return None


def epoch_loop(t: Transform, site: Site) -> tuple[cst.For, Binding | None] | None:
    """The ``for epoch in range(...)`` around a training loop, and what holds the loader."""
    loop = range_loop_around(t, site.loop)
    if loop is not None:
        return loop, site.binding
    for call, _use, binding in reversed(site.trail):
        loop = range_loop_around(t, call)
        if loop is not None:
            return loop, binding
    # A loader in a global or ``self.<attr>``: look where the function using it is called. The
    # holder at the loop (``self.train_data``, filled in ``__init__`` from a parameter) comes
    # first, then the first variable on the way (a global handed to a function).
    starts: list[tuple[Binding, cst.CSTNode]] = []
    if site.binding is not None and site.binding.is_shared:
        starts.append((site.binding, site.loop))
    if site.trail and site.trail[0][2] is not None and site.trail[0][2].is_shared:
        starts.append((site.trail[0][2], site.trail[0][0]))
    for root, start in starts:
        found = _epoch_loop_of_callers(t, root, start)
        if found is not None:
            return found, root
    return None


# -- values that may differ between workers ------------------------------------------------------

#: Calls whose result is the same on every worker when their arguments are.
_SAME_CALLS = (
    "builtins.len", "builtins.int", "builtins.float", "builtins.bool", "builtins.min",
    "builtins.max", "builtins.abs", "builtins.round", "builtins.range", "math.ceil", "math.floor",
)
#: Loops whose target counts, the same on every worker (each runs as many steps).
_COUNTING = (
    "builtins.range", "builtins.enumerate", "tqdm.trange", "tqdm.auto.trange", "tqdm.tqdm",
    "tqdm.auto.tqdm",
)


def decided_per_rank(t: Transform, expr: cst.BaseExpression) -> bool:
    """Whether ``expr`` (original; a loop's exit condition, say) may have a different value on
    each worker: it reads a value computed from the data, the model or an environment (a loss, a
    metric, a reward), through assignments (``+=`` too) or under a condition that does. Loop
    counters, constants, parameters and configuration are the same everywhere."""
    return _differs(t, expr, set(), 0)


def _differs(t: Transform, expr: cst.CSTNode, seen: set[tuple[str, int]], depth: int) -> bool:
    if depth > 12:
        return True
    if isinstance(expr, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString,
                         cst.ConcatenatedString, cst.FormattedString)):
        return False
    if isinstance(expr, cst.Name):
        return _name_differs(t, expr, seen, depth)
    if isinstance(expr, cst.Attribute):
        return _differs(t, expr.value, seen, depth + 1)
    if isinstance(expr, cst.Call):
        if not t.refers_to(expr.func, *_SAME_CALLS):
            return True
        return any(_differs(t, a.value, seen, depth + 1) for a in expr.args)
    if isinstance(expr, (cst.BinaryOperation, cst.BooleanOperation)):
        return _differs(t, expr.left, seen, depth + 1) or _differs(t, expr.right, seen, depth + 1)
    if isinstance(expr, cst.UnaryOperation):
        return _differs(t, expr.expression, seen, depth + 1)
    if isinstance(expr, cst.Comparison):
        return _differs(t, expr.left, seen, depth + 1) or any(
            _differs(t, c.comparator, seen, depth + 1) for c in expr.comparisons
        )
    if isinstance(expr, cst.Subscript):
        return _differs(t, expr.value, seen, depth + 1) or any(
            isinstance(e.slice, cst.Index) and _differs(t, e.slice.value, seen, depth + 1)
            for e in expr.slice
        )
    if isinstance(expr, (cst.Tuple, cst.List)):
        return any(_differs(t, e.value, seen, depth + 1) for e in expr.elements)
    return True


def _name_differs(t: Transform, name: cst.Name, seen: set[tuple[str, int]], depth: int) -> bool:
    if name.value in ("True", "False", "None"):
        return False
    index = file_index(t)
    reaching = index.reaching(name.value, name)
    if reaching is None:
        return False  # a builtin, or a global of another module: configuration
    key = (name.value, id(reaching.scope))
    if key in seen:
        return False  # being decided further up
    seen.add(key)
    scope_node = _scope_node(t, reaching.stmt)
    for binding in index.bindings_of(name.value, reaching.scope):
        if binding.kind in ("param", "import", "def"):
            continue
        if binding.kind == "for" and isinstance(binding.stmt, cst.For):
            loop = binding.stmt
            if not (
                isinstance(loop.iter, cst.Call) and t.refers_to(loop.iter.func, *_COUNTING)
                and not (binding.unpacked and _not_the_count(loop, name.value))
            ):
                return True
            if _differs(t, loop.iter.args[0].value, seen, depth + 1) if (
                t.refers_to(loop.iter.func, "builtins.range") and loop.iter.args
            ) else False:
                return True
            continue
        if binding.kind != "assign" or binding.value is None:
            return True
        if _differs(t, binding.value, seen, depth + 1):
            return True
        if _under_differing_test(t, binding.stmt, scope_node, seen, depth):
            return True
    for aug in _aug_assigns(scope_node, name.value):
        if _differs(t, aug.value, seen, depth + 1) or _under_differing_test(
            t, aug, scope_node, seen, depth
        ):
            return True
    return False


def _not_the_count(loop: cst.For, name: str) -> bool:
    """``for step, batch in enumerate(ds)``: ``batch`` is data, ``step`` counts."""
    target = loop.target
    if isinstance(target, cst.Tuple) and target.elements:
        first = target.elements[0].value
        return not (isinstance(first, cst.Name) and first.value == name)
    return False


def _scope_node(t: Transform, node: cst.CSTNode) -> cst.CSTNode:
    function = t.enclosing_function(node)
    return function if function is not None else t.module


def _aug_assigns(scope: cst.CSTNode, name: str) -> list[cst.AugAssign]:
    return [
        n for n in m.findall(scope, m.AugAssign(target=m.Name(name)))
        if isinstance(n, cst.AugAssign)
    ]


def _under_differing_test(
    t: Transform, node: cst.CSTNode, scope: cst.CSTNode, seen: set[tuple[str, int]], depth: int
) -> bool:
    """Whether ``node`` runs only when an ``if`` or ``while`` test that may differ holds."""
    for parent in t.ancestors(node):
        if parent is scope:
            return False
        if isinstance(parent, (cst.If, cst.While)) and _differs(t, parent.test, seen, depth + 1):
            return True
    return False
