"""Value flow, both ways, on the file's binding index.

Forward (``forward``, ``follow``): from the call that makes a value (a DataLoader, say) through
assignments, ``self.<attr>``, tuples packed and unpacked, dict/list/tuple literals and the
subscripts that pick from them, arguments into parameters and returns (tuples too), to the loops
that iterate it (``iter()``/``next()`` included), and the epoch loop around those.
Policy: every read is followed; at most ``MAX_CALLS`` calls crossed; a returned value goes to every
caller; nothing is guessed when a call's target is unknown.

Backward (``origin``): from a use to the expression that made it, one step at a time, through the
same constructs; ``program.datasets`` walks it to a ``tf.data`` source. Policy: the binding that
reaches the use; one caller for a parameter, one return for a function; anything ambiguous stops
the trace with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .index import FileIndex, file_index
from .scopes import (
    Binding,
    _method_class,
    arguments_for,
    assigned_binding,
    binding_of,
    callee,
    callers,
    param_for_arg,
    uses,
)
from .syntax import code, findall

if TYPE_CHECKING:
    from .model import FileModel


@dataclass
class Site:
    """A loop that iterates the loader (``for x in loader``, ``next(it)`` in a loop)."""

    loop: cst.For | cst.While
    use: cst.CSTNode  # the expression holding the loader there
    binding: Binding | None  # the binding ``use`` reads; None for the DataLoader call itself
    # (call, use, binding) through which the loader was passed down to the loop's function.
    trail: tuple[tuple[cst.Call, cst.CSTNode, Binding | None], ...] = ()


def unpacked_target(fm: FileModel, value: cst.CSTNode, index: int, size: int) -> cst.CSTNode | None:
    """In ``a, b = value``, the ``index``-th target (when there are ``size``, none starred)."""
    assign = fm.parent(value)
    if not (isinstance(assign, cst.Assign) and assign.value is value and len(assign.targets) == 1):
        return None
    target = assign.targets[0].target
    if not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) != size:
        return None
    if any(isinstance(e, cst.StarredElement) for e in target.elements):
        return None
    return target.elements[index].value


def range_loop_around(fm: FileModel, node: cst.CSTNode) -> cst.For | None:
    """The nearest ``for <name> in range(...)`` (or ``trange``/``tqdm(range(...))``) around node."""
    child = node
    for parent in fm.ancestors(node):
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
        if (
            isinstance(parent, cst.For)
            and child is parent.body
            and isinstance(parent.target, cst.Name)
        ):
            it = parent.iter
            if isinstance(it, cst.Call) and (
                fm.refers_to(it.func, "builtins.range")
                or any(q.endswith(".trange") for q in fm.qualified_names(it.func))
                or (
                    it.args
                    and isinstance(it.args[0].value, cst.Call)
                    and fm.refers_to(it.args[0].value.func, "builtins.range")
                )
            ):
                return parent
        child = parent
    return None


@dataclass
class Step:
    """One step forward: ``node`` holds the value now; ``binding`` is what it was read from;
    ``trail`` the calls crossed into parameters; ``calls`` how many calls this step crossed."""

    node: cst.CSTNode
    binding: Binding | None
    trail: tuple[tuple[cst.Call, cst.CSTNode, Binding | None], ...]
    calls: int = 0


def forward(
    fm: FileModel,
    node: cst.CSTNode,
    binding: Binding | None,
    trail: tuple[tuple[cst.Call, cst.CSTNode, Binding | None], ...] = (),
) -> list[Step]:
    """Where the value of ``node`` goes next: every read of what it is assigned to (a tuple of
    values unpacked in place: the matching target), the subscripts that pick it out of a dict,
    list or tuple literal (``loaders["train"]``), the parameter a call passes it to (every read in
    the function), the callers of a function returning it (a tuple: the matching unpacked
    target). An unknown callee ends the flow: nothing is guessed."""
    parent = fm.parent(node)
    target = assigned_binding(fm, node)
    if target is not None:
        return [Step(use, target, trail) for use in uses(fm, target)]
    if isinstance(parent, cst.Element | cst.DictElement) and parent.value is node:
        container = fm.parent(parent)
        key = _literal_key(container, parent)
        # ``a, b = x, y``: the value goes to the matching target.
        if isinstance(container, cst.Tuple) and key is not None:
            element = unpacked_target(fm, container, key, len(container.elements))  # type: ignore[arg-type]
            unpacked = binding_of(fm, element) if element is not None else None
            if unpacked is not None:
                return [Step(use, unpacked, trail) for use in uses(fm, unpacked)]
        holder = assigned_binding(fm, container) if container is not None else None
        if holder is not None and key is not None:
            return [
                Step(pick, holder, trail)
                for use in uses(fm, holder)
                if (pick := fm.parent(use)) is not None and _subscript_key(pick, use) == key
            ]
        returned = fm.parent(container) if isinstance(container, cst.Tuple) else None
        if isinstance(returned, cst.Return) and returned.value is container and key is not None:
            assert isinstance(container, cst.Tuple)
            function = fm.enclosing_function(node)
            steps = []
            for caller in callers(fm, function) if function is not None else ():
                element = unpacked_target(fm, caller, key, len(container.elements))  # type: ignore[arg-type]
                unpacked = binding_of(fm, element) if element is not None else None
                if unpacked is not None:
                    steps += [Step(use, unpacked, (), 1) for use in uses(fm, unpacked)]
            return steps
        return []
    if isinstance(parent, cst.Arg) and parent.value is node:
        call = fm.parent(parent)
        function = callee(fm, call) if isinstance(call, cst.Call) else None
        param = param_for_arg(function, call, parent) if function is not None else None  # type: ignore[arg-type]
        param_binding = binding_of(fm, param) if param is not None else None
        if param_binding is None:
            return []
        crossed = (*trail, (call, node, binding))
        return [Step(use, param_binding, crossed, 1) for use in uses(fm, param_binding)]  # type: ignore[arg-type]
    if isinstance(parent, cst.Return) and parent.value is node:
        function = fm.enclosing_function(node)
        return [
            Step(caller, None, (), 1) for caller in (callers(fm, function) if function else ())
        ]
    return []


def _literal_key(container: cst.CSTNode | None, element: cst.CSTNode) -> object:
    """The key of an element of a dict/list/tuple literal: the string key, or the position."""
    if isinstance(container, cst.Dict) and isinstance(element, cst.DictElement):
        key = element.key
        return key.evaluated_value if isinstance(key, cst.SimpleString) else None
    if isinstance(container, (cst.List, cst.Tuple)):
        if any(isinstance(e, cst.StarredElement) for e in container.elements):
            return None
        return next(i for i, e in enumerate(container.elements) if e is element)
    return None


def _subscript_key(node: cst.CSTNode, value: cst.CSTNode) -> object:
    """``value["train"]`` -> "train", ``value[0]`` -> 0; None for anything else."""
    if not (isinstance(node, cst.Subscript) and node.value is value and len(node.slice) == 1):
        return None
    index = node.slice[0].slice
    if not isinstance(index, cst.Index):
        return None
    if isinstance(index.value, cst.SimpleString):
        return index.value.evaluated_value
    if isinstance(index.value, cst.Integer):
        return int(index.value.value)
    return None


@dataclass
class Origin:
    """One step back: ``value`` (at ``at``) is what the expression was computed from; or a
    ``problem`` saying why that cannot be told (``unpacked``: the call a tuple came from)."""

    value: cst.BaseExpression | None = None
    at: cst.CSTNode | None = None
    problem: str | None = None
    unpacked: cst.BaseExpression | None = None


#: How a name got its value, where the trace cannot follow it further (in notes).
_HOW_BOUND = {
    "import": "is imported",
    "for": "is a loop variable",
    "with": "comes from a with statement",
    "except": "is an exception",
    "augassign": "is updated in place (+=)",
    "walrus": "is assigned inside an expression (:=)",
    "def": "is a function or class of this file",
    "param": "is a parameter",
}


def origin(
    fm: FileModel, index: FileIndex, expr: cst.BaseExpression, at: cst.CSTNode
) -> Origin | None:
    """Where the value of a name, attribute, literal subscript or call of this file's function
    comes from, one step back (None for other expressions: the caller knows them).

    Policy: the binding that reaches the use (``FileIndex.reaching``); a parameter is traced to
    the argument of its one caller, a function to its one return; several callers or returns are
    ambiguous and stop the trace with the reason."""
    if isinstance(expr, cst.Name):
        binding = index.reaching(expr.value, at)
        if binding is None:
            return Origin(problem=f"{expr.value} is not assigned in this file")
        if binding.kind == "assign" and binding.value is not None:
            if not binding.unpacked:
                return Origin(binding.value, binding.stmt)
            element = _unpacked_element(fm, index, binding.stmt, expr.value, binding.value)
            if element is not None:
                return Origin(*element)
            return Origin(
                problem=f"{expr.value} is unpacked from {code(binding.value)}",
                unpacked=binding.value,
            )
        if binding.kind == "param" and isinstance(binding.stmt, cst.FunctionDef):
            return _through_parameter(fm, binding.stmt, expr.value)
        return Origin(problem=f"{expr.value} {_HOW_BOUND.get(binding.kind, 'is bound')}")
    if isinstance(expr, cst.Attribute):
        found = index.attribute_bindings.get(code(expr), [])
        if found and found[-1].value is not None:
            return Origin(found[-1].value, found[-1].stmt)
        return None
    if isinstance(expr, cst.Subscript):
        key = _subscript_key(expr, expr.value)
        container: cst.BaseExpression | None = expr.value
        where = at
        for _ in range(4):  # through plain names to the literal
            if container is None or isinstance(container, (cst.Dict, cst.List, cst.Tuple)):
                break
            back = origin(fm, index, container, where)
            if back is None or back.value is None:
                return None
            container, where = back.value, back.at or where
        picked = _element_for(container, key)
        return Origin(picked, where) if picked is not None else None
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name):
        binding = index.reaching(expr.func.value, expr)
        if binding is not None and isinstance(binding.stmt, cst.FunctionDef):
            return _through_function(fm, index, binding.stmt)
    return None


def _element_for(container: cst.CSTNode | None, key: object) -> cst.BaseExpression | None:
    if key is None:
        return None
    if isinstance(container, cst.Dict):
        for element in container.elements:
            if isinstance(element, cst.DictElement) and _literal_key(container, element) == key:
                return element.value
        return None
    if isinstance(container, (cst.List, cst.Tuple)) and isinstance(key, int):
        if any(isinstance(e, cst.StarredElement) for e in container.elements):
            return None
        return container.elements[key].value if 0 <= key < len(container.elements) else None
    return None


def _unpacked_element(
    fm: FileModel, index: FileIndex, stmt: cst.CSTNode, name: str, value: cst.BaseExpression
) -> tuple[cst.BaseExpression, cst.CSTNode] | None:
    """``a, b = x, y`` -> ``x``; ``train, test = make()`` with ``make`` returning one ``a, b``
    and called once -> ``a`` (and its return statement)."""
    if not (isinstance(stmt, cst.Assign) and len(stmt.targets) == 1):
        return None
    target = stmt.targets[0].target
    if not isinstance(target, (cst.Tuple, cst.List)):
        return None
    names = [e.value.value if isinstance(e.value, cst.Name) else None for e in target.elements]
    if names.count(name) != 1:
        return None
    position = names.index(name)
    if isinstance(value, (cst.Tuple, cst.List)):
        element = _element_for(value, position) if len(value.elements) == len(names) else None
        return (element, stmt) if element is not None else None
    returned = returned_element(index, value, position, len(names))
    if returned is None or len(callers(fm, returned[0])) > 1:
        return None
    return returned[1], returned[2]


def returned_element(
    index: FileIndex, value: cst.BaseExpression, position: int, size: int
) -> tuple[cst.FunctionDef, cst.BaseExpression, cst.Return] | None:
    """``a, b = make()`` with ``make`` a function of this file returning one tuple of ``size``
    values: the function, the element at ``position`` and its return statement (whoever else
    calls it)."""
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
        return None
    binding = index.reaching(value.func.value, value)
    function = binding.stmt if binding is not None else None
    if not isinstance(function, cst.FunctionDef):
        return None
    returns = [r for r in index.returns.get(id(function), []) if r.value is not None]
    if len(returns) != 1 or not isinstance(returns[0].value, (cst.Tuple, cst.List)):
        return None
    elements = returns[0].value.elements
    if len(elements) != size or any(isinstance(e, cst.StarredElement) for e in elements):
        return None
    return function, elements[position].value, returns[0]


def _through_function(fm: FileModel, index: FileIndex, function: cst.FunctionDef) -> Origin:
    returns = [r for r in index.returns.get(id(function), []) if r.value is not None]
    calls = callers(fm, function)
    if len(returns) != 1:
        return Origin(problem=f"{function.name.value}() has {len(returns)} return statements")
    if len(calls) > 1:
        return Origin(
            problem=f"{function.name.value}() builds several datasets (it is called "
            f"{len(calls)} times)"
        )
    return Origin(returns[0].value, returns[0])


def _through_parameter(fm: FileModel, function: cst.FunctionDef, name: str) -> Origin:
    passed = [
        (value, call)
        for value, call in arguments_for(fm, function, name)
        if function not in fm.ancestors(call)
    ]
    calls = [c for c in callers(fm, function) if function not in fm.ancestors(c)]
    if not calls:
        # Its callers, if any, are in other modules: not followed from here.
        return Origin(problem=f"parameter {name!r} of {function.name.value}(), not called in "
                      "this file")
    if len(calls) > 1:
        return Origin(problem=f"parameter {name!r} of {function.name.value}(), called "
                      f"{len(calls)} times")
    if not passed:
        return Origin(problem=f"parameter {name!r} of {function.name.value}() is not passed")
    return Origin(passed[0][0], passed[0][1])


def loader_sites(fm: FileModel, call: cst.Call) -> tuple[list[Site], set[int]]:
    """The loops iterating the loader, and every node its value was followed through."""
    sites: list[Site] = []
    seen: set[int] = set()
    follow(fm, call, None, (), 0, sites, seen)
    return sites, seen


#: How many calls a forward flow crosses (into parameters, out of returns).
MAX_CALLS = 4


def follow(
    fm: FileModel,
    node: cst.CSTNode,
    binding: Binding | None,
    trail: tuple[tuple[cst.Call, cst.CSTNode, Binding | None], ...],
    depth: int,
    sites: list[Site],
    seen: set[int],
) -> None:
    """Follow the value of ``node`` to the loops that iterate it."""
    if id(node) in seen or depth > MAX_CALLS:
        return
    seen.add(id(node))
    loop = iterated_by(fm, node)
    if loop is not None:
        sites.append(Site(loop, node, binding, trail))
        return
    parent = fm.parent(node)
    if isinstance(parent, cst.Arg) and parent.value is node:
        call = fm.parent(parent)
        if isinstance(call, cst.Call) and fm.refers_to(call.func, "builtins.iter"):
            _follow_iterator(fm, call, binding, trail, depth, sites, seen)
            return
    for step in forward(fm, node, binding, trail):
        follow(fm, step.node, step.binding, step.trail, depth + step.calls, sites, seen)


def _follow_iterator(
    fm: FileModel,
    iter_call: cst.Call,
    binding: Binding | None,
    trail: tuple[tuple[cst.Call, cst.CSTNode, Binding | None], ...],
    depth: int,
    sites: list[Site],
    seen: set[int],
) -> None:
    """``it = iter(loader)`` ... ``next(it)`` inside a loop: that loop iterates the loader."""
    target = assigned_binding(fm, iter_call)
    if target is None:
        return
    for use in uses(fm, target):
        arg = fm.parent(use)
        call = fm.parent(arg) if isinstance(arg, cst.Arg) else None
        if isinstance(call, cst.Call) and fm.refers_to(call.func, "builtins.next"):
            loop = enclosing_loop(fm, call)
            if loop is not None:
                sites.append(Site(loop, iter_call.args[0].value, binding, trail))


def iterated_by(fm: FileModel, node: cst.CSTNode) -> cst.For | None:
    """The ``for`` whose iterable is ``node``, possibly wrapped (``enumerate(node)``)."""
    for _ in range(4):
        parent = fm.parent(node)
        if isinstance(parent, cst.For) and parent.iter is node:
            return parent
        if not (isinstance(parent, cst.Arg) and parent.value is node) or parent.keyword:
            return None  # ``tqdm(loader, total=steps)``: steps is not what is iterated
        call = fm.parent(parent)
        if not isinstance(call, cst.Call) or fm.refers_to(
            call.func, "builtins.iter", "builtins.len"
        ):
            return None
        node = call
    return None


def enclosing_loop(fm: FileModel, node: cst.CSTNode) -> cst.For | cst.While | None:
    for parent in fm.ancestors(node):
        if isinstance(parent, (cst.For, cst.While)):
            return parent
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
    return None


def holds_only(fm: FileModel, holder: Binding, flow: set[int]) -> bool:
    """A parameter: whether every call of its function passes this loader to it."""
    param = holder.node
    if not isinstance(param, cst.Param):
        return True
    function = fm.enclosing_function(param)
    if function is None:
        return False
    calls = callers(fm, function)
    for call in calls:
        arg = next((a for a in call.args if param_for_arg(function, call, a) is param), None)
        if arg is None or id(arg.value) not in flow:
            return False
    return bool(calls)


def _epoch_loop_of_callers(fm: FileModel, root: Binding, start: cst.CSTNode) -> cst.For | None:
    frontier = [fm.enclosing_function(start)]
    for _ in range(3):
        next_frontier: list[cst.FunctionDef | None] = []
        for function in frontier:
            for caller in callers(fm, function) if function is not None else ():
                loop = range_loop_around(fm, caller)
                if loop is not None and (
                    root.cls is None or _method_class(fm, caller) is root.cls
                ):
                    return loop
                next_frontier.append(fm.enclosing_function(caller))
        frontier = next_frontier
    return None


def epoch_loop(fm: FileModel, site: Site) -> tuple[cst.For, Binding | None] | None:
    """The ``for epoch in range(...)`` around a training loop, and what holds the loader."""
    loop = range_loop_around(fm, site.loop)
    if loop is not None:
        return loop, site.binding
    for call, _use, binding in reversed(site.trail):
        loop = range_loop_around(fm, call)
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
        found = _epoch_loop_of_callers(fm, root, start)
        if found is not None:
            return found, root
    return None


@dataclass(frozen=True)
class CountedPass:
    """A pass over the training loader inside an outer loop that is no ``for epoch in
    range(...)`` but counts its passes itself (``while True: cur_epochs += 1; for x in loader``)."""

    loop: cst.For | cst.While  # the outer loop
    before: cst.BaseStatement  # the statement of its body that holds the pass
    counter: str  # the name it adds 1 to once per iteration
    holder: Binding | None  # what holds the loader there (as ``epoch_loop``'s)


def counted_pass(fm: FileModel, site: Site) -> CountedPass | None:
    """The outer loop around a pass over the loader (``for x in loader``, or the call that leads
    to it) that keeps an epoch counter: one statement of its body (not under an ``if``, a ``try``
    or an inner loop) adds 1 to a name, the only store to it inside the loop, bound before the
    loop in the same function and the same on every rank (``decided_per_rank``). None otherwise:
    a pass read through ``next()``, an inner loop between the two (several passes per count), no
    counter (or one another function may change through ``global``)."""
    loop = site.loop
    if not isinstance(loop, cst.For) or not any(
        a is loop.iter for a in (site.use, *fm.ancestors(site.use))
    ):
        return None
    for node, holder in ((loop, site.binding), *((c, b) for c, _, b in reversed(site.trail))):
        chain = [node, *fm.ancestors(node)]
        for i in range(2, len(chain)):
            outer = chain[i]
            if isinstance(outer, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.BaseComp)):
                break
            if not isinstance(outer, (cst.For, cst.While)) or chain[i - 1] is not outer.body:
                continue
            if isinstance(outer.body, cst.IndentedBlock):
                counter = _pass_counter(fm, outer)
                if counter is not None:
                    return CountedPass(outer, chain[i - 2], counter, holder)  # type: ignore[arg-type]
            break
    return None


def _pass_counter(fm: FileModel, loop: cst.For | cst.While) -> str | None:
    assert isinstance(loop.body, cst.IndentedBlock)
    index = file_index(fm)
    function = fm.enclosing_function(loop)
    for stmt in loop.body.body:
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
            continue
        small = stmt.body[0]
        target = small.target if isinstance(small, cst.AugAssign) else None
        if not (
            isinstance(small, cst.AugAssign) and isinstance(target, cst.Name)
            and isinstance(small.operator, cst.AddAssign)
            and isinstance(small.value, cst.Integer) and small.value.evaluated_value == 1
        ):
            continue
        found, scope = index.resolve(target.value, index.scope(target))
        stores = [*index.bindings_of(target.value, scope),
                  *index.augmented.get((id(scope), target.value), [])]
        inside = [b for b in stores if any(a is loop for a in fm.ancestors(b.stmt))]
        if (
            found and len(inside) == 1 and inside[0].stmt is small and len(stores) > 1
            and all(fm.enclosing_function(b.stmt) is function for b in stores)
            and not decided_per_rank(fm, target)
        ):
            return target.value
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


def decided_per_rank(fm: FileModel, expr: cst.BaseExpression) -> bool:
    """Whether ``expr`` (original; a loop's exit condition, say) may have a different value on
    each worker: it reads a value computed from the data, the model or an environment (a loss, a
    metric, a reward), through assignments (``+=`` too) or under a condition that does. Loop
    counters, constants, parameters and configuration are the same everywhere."""
    return _differs(fm, expr, set(), 0)


def _differs(fm: FileModel, expr: cst.CSTNode, seen: set[tuple[str, int]], depth: int) -> bool:
    if depth > 12:
        return True
    if isinstance(expr, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString,
                         cst.ConcatenatedString, cst.FormattedString)):
        return False
    if isinstance(expr, cst.Name):
        return _name_differs(fm, expr, seen, depth)
    if isinstance(expr, cst.Attribute):
        return _differs(fm, expr.value, seen, depth + 1)
    if isinstance(expr, cst.Call):
        if not fm.refers_to(expr.func, *_SAME_CALLS):
            return True
        return any(_differs(fm, a.value, seen, depth + 1) for a in expr.args)
    if isinstance(expr, (cst.BinaryOperation, cst.BooleanOperation)):
        return _differs(fm, expr.left, seen, depth + 1) or _differs(fm, expr.right, seen, depth + 1)
    if isinstance(expr, cst.UnaryOperation):
        return _differs(fm, expr.expression, seen, depth + 1)
    if isinstance(expr, cst.Comparison):
        return _differs(fm, expr.left, seen, depth + 1) or any(
            _differs(fm, c.comparator, seen, depth + 1) for c in expr.comparisons
        )
    if isinstance(expr, cst.Subscript):
        return _differs(fm, expr.value, seen, depth + 1) or any(
            isinstance(e.slice, cst.Index) and _differs(fm, e.slice.value, seen, depth + 1)
            for e in expr.slice
        )
    if isinstance(expr, (cst.Tuple, cst.List)):
        return any(_differs(fm, e.value, seen, depth + 1) for e in expr.elements)
    return True


def _name_differs(fm: FileModel, name: cst.Name, seen: set[tuple[str, int]], depth: int) -> bool:
    if name.value in ("True", "False", "None"):
        return False
    index = file_index(fm)
    reaching = index.reaching(name.value, name)
    if reaching is None:
        return False  # a builtin, or a global of another module: configuration
    key = (name.value, id(reaching.scope))
    if key in seen:
        return False  # being decided further up
    seen.add(key)
    scope_node = _scope_node(fm, reaching.stmt)
    for binding in index.bindings_of(name.value, reaching.scope):
        if binding.kind in ("param", "import", "def"):
            continue
        if binding.kind == "for" and isinstance(binding.stmt, cst.For):
            loop = binding.stmt
            if not (
                isinstance(loop.iter, cst.Call) and fm.refers_to(loop.iter.func, *_COUNTING)
                and not (binding.unpacked and _not_the_count(loop, name.value))
            ):
                return True
            if _differs(fm, loop.iter.args[0].value, seen, depth + 1) if (
                fm.refers_to(loop.iter.func, "builtins.range") and loop.iter.args
            ) else False:
                return True
            continue
        if binding.kind != "assign" or binding.value is None:
            return True
        value = binding.value
        if binding.unpacked:
            # ``loss, acc, step = train_step(x)``: the element of the one return of the
            # file's function it names (``optimizer.iterations``: the same everywhere).
            element = _unpacked_element(fm, index, binding.stmt, name.value, value)
            value = element[0] if element is not None else value
        if _differs(fm, value, seen, depth + 1):
            return True
        if _under_differing_test(fm, binding.stmt, scope_node, seen, depth):
            return True
    for aug in _aug_assigns(scope_node, name.value):
        if _differs(fm, aug.value, seen, depth + 1) or _under_differing_test(
            fm, aug, scope_node, seen, depth
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


def _scope_node(fm: FileModel, node: cst.CSTNode) -> cst.CSTNode:
    function = fm.enclosing_function(node)
    return function if function is not None else fm.module


def _aug_assigns(scope: cst.CSTNode, name: str) -> list[cst.AugAssign]:
    return [
        n for n in findall(scope, m.AugAssign(target=m.Name(name)))
        if isinstance(n, cst.AugAssign)
    ]


def _under_differing_test(
    fm: FileModel, node: cst.CSTNode, scope: cst.CSTNode, seen: set[tuple[str, int]], depth: int
) -> bool:
    """Whether ``node`` runs only when an ``if`` or ``while`` test that may differ holds."""
    for parent in fm.ancestors(node):
        if parent is scope:
            return False
        if isinstance(parent, (cst.If, cst.While)) and _differs(fm, parent.test, seen, depth + 1):
            return True
    return False


def reaches(fm: FileModel, value: cst.CSTNode, statements: list[cst.BaseStatement]) -> bool:
    """Whether the value of ``value`` (``next(test_iter)``, say) may reach one of
    ``statements`` (the steps of a training loop): held in one of them, or assigned to names
    some read of which in them may see (through further plain assignments; the binding index
    decides which reads see which binding, so ``A, B = next(it)`` after the step of a ``for A, B
    in data`` loop reaches nothing there: the ``for`` rebinds them first). Policy: True wherever
    the value goes somewhere not followed (stored into an attribute, subscript or another
    object's method, returned, yielded, iterated, read in a nested function)."""
    inside = {id(s) for s in statements}

    def held(node: cst.CSTNode) -> bool:
        return id(node) in inside or any(id(a) in inside for a in fm.ancestors(node))

    index = file_index(fm)
    seen: set[int] = set()

    def flows(node: cst.CSTNode, depth: int) -> bool:
        if held(node) or depth > 12:
            return True
        small = next((a for a in fm.ancestors(node)
                      if isinstance(a, (cst.BaseSmallStatement, cst.BaseCompoundStatement))), None)
        if isinstance(small, (cst.If, cst.While)):
            return False  # read in a test: decides, carries nothing
        if isinstance(small, cst.Expr):  # a value thrown away, unless an object keeps it
            return isinstance(small.value, (cst.Yield, cst.Await)) or any(
                isinstance(a, cst.Call) and isinstance(a.func, cst.Attribute)
                and isinstance(a.func.value, cst.Name) and any(
                    b.kind != "import" for b in index.referents(a.func.value))
                for a in fm.ancestors(node) if a is not small and small in fm.ancestors(a)
            )
        if not isinstance(small, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            return True
        targets = ([t.target for t in small.targets] if isinstance(small, cst.Assign)
                   else [small.target])
        names: list[cst.Name] = []
        for target in targets:
            parts = ([e.value for e in target.elements]
                     if isinstance(target, (cst.Tuple, cst.List)) else [target])
            for part in parts:
                if isinstance(part, cst.StarredElement):
                    part = part.value
                if not isinstance(part, cst.Name):
                    return True  # ``self.x = ...``, ``buf[i] = ...``
                names.append(part)
        for name in names:
            binding = binding_of(fm, name)
            if binding is None:
                return True
            if id(binding) in seen:
                continue
            seen.add(id(binding))
            for read in index.uses(binding):
                if index.scope_of.get(id(read)) is not binding.scope or flows(read, depth + 1):
                    return True
        return False

    return flows(value, 0)
