"""torch.optim names as data, and the questions about optimizer calls."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .index import file_index, nodes_of, reaching_values
from .syntax import arg_named, findall

if TYPE_CHECKING:
    from .model import FileModel

_SCHEDULER_MODULES = ("torch.optim.lr_scheduler", "torch.optim.swa_utils")


def optimizer_class(fm: FileModel, call: cst.Call) -> str | None:
    """``SGD`` when ``call`` (original) constructs a ``torch.optim`` optimizer, however imported
    (``torch.optim.SGD``, ``optim.SGD``, ``from torch.optim.sgd import SGD``)."""
    for qname in fm.qualified_names(call.func):
        parts = qname.split(".")
        if parts[:2] != ["torch", "optim"] or len(parts) not in (3, 4):
            continue
        if len(parts) == 4 and ".".join(parts[:3]) in _SCHEDULER_MODULES:
            continue
        name = parts[-1]
        if name[:1].isupper() and name != "Optimizer":
            return name
    return None


def params_argument(call: cst.Call) -> cst.Arg | None:
    """The ``params`` argument of an optimizer constructor."""
    return arg_named(call, "params", 0)


def lr_set_by_wrapper(fm: FileModel, call: cst.Call) -> str | None:
    """``ScheduledOptim(torch.optim.Adam(...), ...)``: the class that holds the optimizer made
    by ``call`` and writes its learning rate into the parameter groups itself (every step), as
    ``"ScheduledOptim (optim.py)"``; None when no such wrapper receives it. The wrapper is a
    class of this file, or one another module of the project defines
    (``ModuleFacts.optimizer_wrappers``)."""
    arg = fm.parent(call)
    outer = fm.parent(arg) if isinstance(arg, cst.Arg) else None
    if not isinstance(outer, cst.Call) or arg not in outer.args:
        return None
    if isinstance(outer.func, cst.Name):
        cls = file_index(fm).class_named(outer.func)
        if cls is not None and any(
            isinstance(t.target, cst.Subscript) and len(t.target.slice) == 1
            and isinstance(index := t.target.slice[0].slice, cst.Index)
            and isinstance(index.value, cst.SimpleString) and index.value.evaluated_value == "lr"
            for a in findall(cls, m.Assign()) if isinstance(a, cst.Assign) for t in a.targets
        ):
            return cls.name.value
    project = fm.project
    for qname, where, _, sets_lr in project.optimizer_wrappers if project is not None else ():
        if sets_lr and fm.refers_to(outer.func, qname):
            return f"{qname.rsplit('.', 1)[-1]} ({where})"
    return None


_LR_ATTRIBUTES = ("lr", "learning_rate")


def lr_set_while_training(fm: FileModel, call: cst.Call) -> str | None:
    """Where the learning rate of the optimizer ``call`` makes is set anew while it trains, so
    that the rate given to the constructor is not the one to scale: a wrapper class that writes
    it into the parameter groups (``lr_set_by_wrapper``), ``opt.lr.assign(lr)``,
    ``opt.learning_rate = lr``, ``K.set_value(opt.lr, lr)``, ``group["lr"] = lr`` for a group
    of ``opt.param_groups``; as the text a note quotes (`` `opt.lr.assign(lr)` in
    train_step()``). None when nothing of the file sets it."""
    wrapper = lr_set_by_wrapper(fm, call)
    if wrapper is not None:
        return f"{wrapper} writes it into the parameter groups on every step"
    index = file_index(fm)

    def is_this(expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
        return any(v is call for v in reaching_values(index, expr, at))

    def rate_of_this(expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
        return (isinstance(expr, cst.Attribute) and expr.attr.value in _LR_ATTRIBUTES
                and is_this(expr.value, at))

    def group_of_this(expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """``opt.param_groups[0]``, or ``group`` of ``for group in opt.param_groups:``."""
        if isinstance(expr, cst.Subscript):
            expr = expr.value
        elif isinstance(expr, cst.Name):
            binding = index.reaching(expr.value, at)
            loop = binding.stmt if binding is not None else None
            if not (isinstance(loop, cst.For) and loop.target is binding.target):
                return False
            expr = loop.iter
        return (isinstance(expr, cst.Attribute) and expr.attr.value == "param_groups"
                and is_this(expr.value, at))

    # The calls and assignments in file order, from the file's index (``nodes_of``), not a walk
    # asking libcst's ``Call() | Assign()`` matcher of every node.
    order = index.order
    nodes = sorted([*nodes_of(fm, cst.Call), *nodes_of(fm, cst.Assign)],
                   key=lambda node: order[id(node)])
    for node in nodes:
        if isinstance(node, cst.Call):
            func = node.func
            found = (
                isinstance(func, cst.Attribute) and func.attr.value == "assign"
                and rate_of_this(func.value, node)
            ) or (
                any(q.endswith("backend.set_value") for q in fm.qualified_names(func))
                and bool(node.args) and rate_of_this(node.args[0].value, node)
            )
        else:
            assert isinstance(node, cst.Assign)
            found = any(
                rate_of_this(t.target, node) or (
                    isinstance(t.target, cst.Subscript) and len(t.target.slice) == 1
                    and isinstance(key := t.target.slice[0].slice, cst.Index)
                    and isinstance(key.value, cst.SimpleString)
                    and key.value.evaluated_value in _LR_ATTRIBUTES
                    and group_of_this(t.target.value, node))
                for t in node.targets)
        if found:
            function = fm.enclosing_function(node)
            where = f" in {function.name.value}()" if function is not None else ""
            text = " ".join(fm.code(node).split())
            return f"`{text if len(text) <= 60 else text[:57] + '...'}`{where}"
    return None
