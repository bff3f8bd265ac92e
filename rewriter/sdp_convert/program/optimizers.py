"""torch.optim names as data, and the questions about optimizer calls."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .index import file_index
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
