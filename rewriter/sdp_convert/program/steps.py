"""Which loops step a torch optimizer: the optimizer object followed from where it is made to its
``.step()`` calls, and those out to the loops that run them.

``stepping_loops(t, call)`` follows the value of the optimizer made by ``call`` through names,
``self.<attr>`` and parameters of this file's functions (``train(model, loader, optimizer)``) to
``<optimizer>.step()`` (and ``scaler.step(optimizer)``), then out of each step's function through
its callers to every ``for``/``while`` around it. None when the optimizer goes somewhere not
followed (a container, a return, another library's object other than a scheduler or scaler, a
method of an object): then only the file as a whole can answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from .index import Binding
from .scopes import assigned_binding, binding_of, callee, callers, param_for_arg, uses

if TYPE_CHECKING:
    from .model import FileModel

#: How many assignments and calls the optimizer is followed through.
_DEPTH = 5

#: ``<optimizer>.<method>`` uses that neither step it nor hand it on.
_QUIET = frozenset({
    "zero_grad", "state_dict", "load_state_dict", "param_groups", "add_param_group", "state",
    "defaults", "__class__",
})


def stepping_loops(fm: FileModel, call: cst.Call) -> set[cst.CSTNode] | None:
    """The loops that run a ``step()`` of the optimizer ``call`` makes (see the docstring)."""
    binding = assigned_binding(fm, call)
    if binding is None:
        return None
    steps: list[cst.Call] = []
    if not _steps(fm, binding, steps, 0, set()):
        return None
    loops: set[cst.CSTNode] = set()
    for step in steps:
        _loops_around(fm, step, loops, 0, set())
    return loops or None


def _steps(fm: FileModel, binding: Binding, found: list[cst.Call], depth: int, seen: set[int]
           ) -> bool:
    """Add the ``step()`` calls of ``binding``'s value to ``found``; False: not followed."""
    if depth > _DEPTH:
        return False
    key = id(binding.target) if binding.target is not None else id(binding)
    if key in seen:
        return True
    seen.add(key)
    for use in uses(fm, binding):
        parent = fm.parent(use)
        if isinstance(parent, cst.Attribute) and parent.value is use:
            outer = fm.parent(parent)
            if parent.attr.value == "step" and isinstance(outer, cst.Call):
                found.append(outer)
            elif parent.attr.value not in _QUIET:
                return False
            continue
        if isinstance(parent, cst.Arg) and parent.value is use:
            call = fm.parent(parent)
            assert isinstance(call, cst.Call)
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "step":
                found.append(call)  # ``scaler.step(optimizer)``
                continue
            function = callee(fm, call)
            if function is None:
                if _is_scheduler(fm, call):
                    continue
                return False
            param = param_for_arg(function, call, parent)
            inner = binding_of(fm, param) if param is not None else None
            if inner is None or not _steps(fm, inner, found, depth + 1, seen):
                return False
            continue
        if isinstance(parent, cst.Assign) and parent.value is use and len(parent.targets) == 1:
            inner = binding_of(fm, parent.targets[0].target)
            if inner is None or not _steps(fm, inner, found, depth + 1, seen):
                return False
            continue
        return False
    return True


def _is_scheduler(fm: FileModel, call: cst.Call) -> bool:
    return fm.refers_to(call.func, "torch.optim.lr_scheduler", prefix=True)


def _loops_around(fm: FileModel, node: cst.CSTNode, loops: set[cst.CSTNode], depth: int,
                  seen: set[int]) -> None:
    """Every loop around ``node``, and around the calls of its function, out to the top."""
    for parent in fm.ancestors(node):
        if isinstance(parent, (cst.For, cst.While)):
            loops.add(parent)
        if isinstance(parent, cst.FunctionDef):
            if depth >= _DEPTH or id(parent) in seen:
                return
            seen.add(id(parent))
            for call in callers(fm, parent):
                _loops_around(fm, call, loops, depth + 1, seen)
            return
