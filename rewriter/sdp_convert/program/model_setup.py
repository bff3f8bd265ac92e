"""Before a torch model trains: whether it trains at all, which helper calls only set its weights
up, and where its training may begin.

``not_trained`` says why a model gets no gradient, when that can be shown: every parameter is
frozen at its creation's level (``model.requires_grad_(False)``, or ``for p in
model.parameters(): p.requires_grad = False`` with nothing unfreezing anything in the file), or
the model is only ever run under ``torch.no_grad()``/``torch.inference_mode()`` and otherwise only
asked ``nn.Module`` questions (``.eval()``, ``.to(device)``, ``.parameters()``): a fixed feature
extractor. DistributedDataParallel refuses such a module, and it needs no gradient averaging;
its weights must still be rank 0's everywhere (``broadcast_already`` says whether the file
broadcasts them).

``sets_weights`` answers for ``initialize_weights(model)``: a call of this file's function that
changes the weights in place (``nn.init.*``, ``.apply``, ``.load_state_dict``, ``.copy_``) and
neither trains nor runs the model: a step of setting it up, like ``model.apply(init_fn)``.

``training_starts`` gives where training may begin after the model is made, at the level of the
model's block: a call of the model, a ``backward()``/``step()``, or a call of one of this file's
functions (it may train) other than the ones that only set weights.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator
from heapq import merge
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .index import Binding, Scope, file_index, nodes_of
from .models import (
    DATA_PARALLEL,
    MODULE_API,
    PARAMETER_METHODS,
    SETUP_METHODS,
    freezes,
    is_wrapper,
    makes_stepped_optimizer,
    without_grad,
)
from .scopes import callee, training_calls
from .syntax import findall

if TYPE_CHECKING:
    from .model import FileModel

#: Methods that change a module's weights in place.
_IN_PLACE = frozenset({
    "apply", "load_state_dict", "copy_", "fill_", "zero_", "normal_", "uniform_",
    "requires_grad_", "constant_", "xavier_uniform_", "xavier_normal_", "kaiming_normal_",
    "kaiming_uniform_", "orthogonal_", "trunc_normal_",
})


def not_trained(fm: FileModel, target: str, scope: Scope, creation: cst.CSTNode
                ) -> tuple[cst.CSTNode, str] | None:
    """``(where, why)`` when the model ``target`` (a name of ``scope``, created by the statement
    ``creation``) gets no gradient; None when it may (see the module docstring)."""
    index = file_index(fm)
    # Every read of the name, in nested functions too (a global model read in ``train()``).
    found = {id(r): r for b in index.bindings_of(target, scope) for r in index.uses(b)}
    loads = sorted(found.values(), key=lambda n: index.order.get(id(n), 0))
    frozen = _frozen_at(fm, target, loads, creation)
    if frozen is not None:
        return frozen, f"every parameter of {target} is frozen (requires_grad False)"
    calls = []
    for load in loads:
        parent = fm.parent(load)
        if isinstance(parent, cst.Call) and parent.func is load:
            calls.append(parent)
        elif not (
            isinstance(parent, cst.Attribute) and parent.value is load
            and parent.attr.value in MODULE_API - {"forward"}
        ):
            return None  # handed on, returned, or a method of its own: not followed
    if calls and all(without_grad(fm, c) for c in calls):
        return calls[0], f"{target} only runs under torch.no_grad() (a fixed feature extractor)"
    return None


#: The runtime's broadcast of a module's state (what a model that is not wrapped gets).
BROADCASTS = ("sdp_runtime.torch.broadcast_parameters",)


def broadcast_already(fm: FileModel, target: str) -> bool:
    """``sdp.broadcast_parameters(<target>.state_dict(), ...)`` is in the file."""
    return any(
        call.args and any(
            isinstance(n, cst.Name) and n.value == target
            for n in findall(call.args[0].value, m.Name())
        )
        for call in fm.calls_to(*BROADCASTS)
    )


def _frozen_at(fm: FileModel, target: str, loads: list[cst.Name], creation: cst.CSTNode
               ) -> cst.CSTNode | None:
    """The statement freezing every parameter of ``target`` in the block of ``creation``."""
    if _unfreezes(fm):
        return None
    made = fm.enclosing_statement(creation)
    block = fm.parent(made) if made is not None else None
    for i, load in enumerate(loads):
        stmt = fm.enclosing_statement(load)
        if stmt is None or fm.parent(stmt) is not block:
            continue
        if m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(m.Call(
            func=m.Attribute(value=m.Name(target), attr=m.Name("requires_grad_")),
            args=[m.Arg(m.Name("False"))],
        ))])) or (isinstance(stmt, cst.For) and m.matches(stmt.iter, m.Call(
            func=m.Attribute(value=m.Name(target), attr=PARAMETER_METHODS),
        )) and _freezes_each(stmt)):
            # ``model.fc = nn.Linear(...)`` after the freeze: a new, trainable head.
            return None if any(gets_module(fm, later) for later in loads[i + 1:]) else stmt
    return None


#: Calls that put a module into another (its parameters new, and trainable).
_ADDS_MODULE = frozenset({"add_module", "register_module", "append", "extend", "insert"})


def gets_module(fm: FileModel, load: cst.Name) -> bool:
    """``load`` is the model a submodule is assigned to (``model.fc = ...``,
    ``model.classifier[6] = ...``, ``model.add_module(...)``, ``setattr(model, ...)``)."""
    node: cst.CSTNode = load
    parent = fm.parent(node)
    while isinstance(parent, (cst.Attribute, cst.Subscript)) and parent.value is node:
        node, parent = parent, fm.parent(parent)
        if isinstance(node, cst.Attribute) and node.attr.value in _ADDS_MODULE and isinstance(
            parent, cst.Call
        ) and parent.func is node:
            return True
    if node is not load and isinstance(parent, cst.AssignTarget) and parent.target is node:
        return True
    return (isinstance(parent, cst.Arg) and isinstance(fm.parent(parent), cst.Call)
            and m.matches(fm.parent(parent).func, m.Name("setattr")))


def _freezes_each(loop: cst.For) -> bool:
    """``for p in m.parameters(): p.requires_grad = False`` (or ``requires_grad_(False)``), the
    freeze unconditional in the loop's body."""
    target: cst.BaseExpression = loop.target
    if isinstance(target, cst.Tuple) and len(target.elements) == 2:
        target = target.elements[1].value
    if not isinstance(target, cst.Name) or not isinstance(loop.body, cst.IndentedBlock):
        return False
    name = target.value
    assign = m.Assign(
        targets=[m.AssignTarget(m.Attribute(value=m.Name(name), attr=m.Name("requires_grad")))],
        value=m.Name("False"),
    )
    call = m.Expr(m.Call(func=m.Attribute(value=m.Name(name), attr=m.Name("requires_grad_")),
                         args=[m.Arg(m.Name("False"))]))
    return any(
        m.matches(stmt, m.SimpleStatementLine(body=[assign | call])) for stmt in loop.body.body
    )


def _unfreezes(fm: FileModel) -> bool:
    """Anything in the file may set ``requires_grad`` back on (asked once per file)."""
    if fm.facts.unfreezes is None:
        fm.facts.unfreezes = _finds_unfreeze(fm)
    return fm.facts.unfreezes


def _finds_unfreeze(fm: FileModel) -> bool:
    assigns_flag = m.Assign(targets=[m.AssignTarget(m.Attribute(attr=m.Name("requires_grad")))])
    for node in nodes_of(fm, cst.Assign):
        if m.matches(node, assigns_flag) and not m.matches(node.value, m.Name("False")):
            return True
    for call in fm.method_calls("requires_grad_"):
        if not (call.args and m.matches(call.args[0].value, m.Name("False"))):
            return True
    return False


def sets_weights(fm: FileModel, call: cst.Call) -> bool:
    """``call`` calls a function of this file that only changes weights in place (see the
    module docstring)."""
    function = callee(fm, call)
    if function is None or call in training_calls(fm):
        return False
    params = {p.name.value for p in function.params.params}
    changes = False
    for inner in findall(function.body, m.Call()):
        assert isinstance(inner, cst.Call)
        func = inner.func
        if isinstance(func, cst.Name) and func.value in params:
            return False  # runs the model
        if isinstance(func, cst.Attribute) and func.attr.value == "forward":
            return False
        if callee(fm, inner) is not None:
            return False  # another function of the file: not followed
        if fm.refers_to(func, "torch.nn.init", prefix=True) or (
            isinstance(func, cst.Attribute) and func.attr.value in _IN_PLACE
        ):
            changes = True
    return changes


def training_starts(
    fm: FileModel,
    uses: list[cst.CSTNode],
    level: Callable[[cst.CSTNode], cst.BaseStatement | None],
    order: Callable[[cst.CSTNode], int],
    start: int,
) -> Iterator[int]:
    """Where training may begin first after ``start`` (see the module docstring), as the order
    of a statement at the model's block level (``level``, which gives a node or an ancestor of
    it); nothing where it never does.

    The first trigger after ``start`` in walk order that ``level`` places after ``start`` is
    the earliest of all: a statement of the model's blocks after ``start`` that holds a later
    trigger cannot come before one that holds an earlier trigger. So the file's triggers are
    listed once, in walk order, and each model reads them from ``start`` on, not all of them."""
    orders, triggers = _training_triggers(fm)
    own = sorted(
        (order(parent), id(parent), parent) for use in uses
        if isinstance(parent := fm.parent(use), cst.Call) and parent.func is use
        and order(parent) > start
    )
    later = zip(orders[bisect_right(orders, start):], triggers[bisect_right(orders, start):],
                strict=True)
    for _, node in merge(((o, n) for o, _, n in own), later, key=lambda pair: pair[0]):
        stmt = level(node)
        if stmt is not None and order(stmt) > start:
            yield order(stmt)
            return


def _training_triggers(fm: FileModel) -> tuple[list[int], list[cst.CSTNode]]:
    """``backward()``/``step()`` calls and calls of this file's functions that lead to them
    (``scopes.training_calls``) and do not only set weights up (``sets_weights``), with their
    orders, in walk order (once per file). A helper that only reads the model
    (``count_parameters(model)``, an evaluation) starts no training: the wrap may come after
    it, after the model's last move (``model = model.to(device)`` cells later)."""
    if fm.facts.training_triggers is None:
        index = file_index(fm)
        triggers: list[cst.CSTNode] = [*fm.method_calls("backward"), *fm.method_calls("step")]
        trains = training_calls(fm)
        for name in index.functions:
            triggers.extend(
                c for c in index.calls_by_name.get(name, ())
                if c in trains and not sets_weights(fm, c)
            )
        found = sorted({id(t): (index.order.get(id(t), -1), t) for t in triggers}.values(),
                       key=lambda pair: pair[0])
        fm.facts.training_triggers = ([o for o, _ in found], [t for _, t in found])
    return fm.facts.training_triggers


def wrap_anchor(fm: FileModel, first: cst.BaseStatement, same: list[Binding],
                uses: list[cst.CSTNode]) -> cst.BaseStatement:
    """The statement a model's DDP wrap goes after: the last that makes, moves, freezes or sets
    up its weights (``first``: the statement that creates it; ``same``: every binding of its
    name; ``uses``: its reads), before its training may begin (``model_setup.training_starts``)."""
    index = file_index(fm)
    bodies = {id(p) for p in fm.ancestors(first) if isinstance(p, (cst.Module, cst.IndentedBlock))}

    def level(node: cst.CSTNode) -> cst.BaseStatement | None:
        child = node
        for parent in fm.ancestors(node):
            if id(parent) in bodies and isinstance(child, cst.BaseStatement):
                if isinstance(child, (cst.FunctionDef, cst.ClassDef)):
                    return None  # defining a function runs nothing
                return child
            child = parent
        return None

    def order(node: cst.CSTNode) -> int:
        return index.order.get(id(node), -1)

    start = order(first)
    def moves_itself(value: cst.BaseExpression, name: str) -> bool:
        """``model = model.to(device)``: the same model, moved (set up, not replaced)."""
        return (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
                and value.func.attr.value in SETUP_METHODS
                and isinstance(value.func.value, cst.Name) and value.func.value.value == name)

    later = [
        order(stmt) for b in same
        if b.value is not None and not is_wrapper(fm, b.value)
        and not moves_itself(b.value, b.name)
        and (stmt := level(b.stmt)) is not None and order(stmt) > start
    ]
    end = min([*later, *training_starts(fm, uses, level, order, start)], default=1 << 62)
    setup: list[cst.BaseStatement] = [first]
    for b in same:  # ``model = nn.DataParallel(model)`` and the like, where they stand
        if b.value is not None and is_wrapper(fm, b.value, DATA_PARALLEL):
            setup.extend(filter(None, [level(b.stmt)]))
    for use in uses:
        parent = fm.parent(use)
        call = fm.parent(parent) if parent is not None else None
        if (
            isinstance(parent, cst.Attribute) and parent.value is use
            and parent.attr.value in SETUP_METHODS
            and isinstance(call, cst.Call) and call.func is parent
        ) or (isinstance(call, cst.Call) and isinstance(parent, cst.Arg)
              and sets_weights(fm, call)) or (  # ``initialize_weights(model)``
            isinstance(parent, cst.Attribute) and parent.value is use
            and isinstance(call, cst.Call) and call.func is parent
            and makes_stepped_optimizer(fm, call)
        ):  # ``self.optimizer = model.configure_optimizers(config)``: the plain model's method
            setup.extend(filter(None, [level(call)]))
        else:
            stmt = level(use)
            if stmt is not None and start < order(stmt) < end and (
                freezes(stmt) or (isinstance(use, cst.Name) and gets_module(fm, use))
            ):  # ``model.fc = nn.Linear(...)``: DDP must see the new head's parameters
                setup.append(stmt)
    candidates = [s for s in setup if start <= order(s) < end]
    return max(candidates, key=order) if candidates else first

