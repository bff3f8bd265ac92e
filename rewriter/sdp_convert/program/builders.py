"""Code to write: how this file spells a module (``torch`` or ``th``), statements laid out as black
would, names not yet taken in a scope."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .index import imported_names
from .scopes import names_in
from .syntax import AddImport

if TYPE_CHECKING:
    from .model import FileModel

_MAX_LINE = 99


def rank0_test(sdp: str) -> cst.BaseExpression:
    """``<sdp>.rank() == 0``: the test of the code that runs on rank 0 only."""
    return cst.parse_expression(f"{sdp}.rank() == 0")


def torch_spelling(fm: FileModel, add_import: AddImport) -> str:
    """The module-level name bound to ``torch``; asks ``add_import`` for an import if there is
    none."""
    for stmt in fm.module.body:
        if not m.matches(stmt, m.SimpleStatementLine(body=[m.Import()])):
            continue
        assert isinstance(stmt, cst.SimpleStatementLine)
        imp = stmt.body[0]
        assert isinstance(imp, cst.Import)
        for alias in imp.names:
            full = cst.helpers.get_full_name_for_node(alias.name) or ""
            if alias.asname is not None:
                if full == "torch" and isinstance(alias.asname.name, cst.Name):
                    return alias.asname.name.value
            elif full == "torch" or full.startswith("torch."):
                return "torch"
    add_import("torch.utils.data.distributed")
    return "torch"


def statement(fm: FileModel, head: str, args: list[str], at: cst.CSTNode) -> cst.BaseStatement:
    """``head`` + ``args`` + ``)``: on one line, on three, or one argument a line (as black
    would), whichever first fits in ``_MAX_LINE`` columns where it goes."""
    step = fm.module.default_indent
    indent = len(step) * sum(1 for a in fm.ancestors(at) if isinstance(a, cst.IndentedBlock))
    inner = ", ".join(args)
    if indent + len(head) + len(inner) + 1 <= _MAX_LINE:
        return cst.parse_statement(f"{head}{inner})\n")
    if indent + len(step) + len(inner) <= _MAX_LINE:
        return cst.parse_statement(f"{head}\n{step}{inner}\n)\n")
    lines = "".join(f"{step}{arg},\n" for arg in args)
    return cst.parse_statement(f"{head}\n{lines})\n")


def conditional_statement(
    fm: FileModel, target: str, call: str, args: list[str], test: str, orelse: str
) -> cst.BaseStatement:
    """``target = (<call>(<args>) if <test> else <orelse>)``, laid out as black would lay out a
    long one (the sampler a condition chooses: ``sdp.is_initialized()``, a factory's flag)."""
    step = fm.module.default_indent
    return cst.parse_statement(
        f"{target} = (\n{step}{call}(\n{step * 2}{', '.join(args)}\n{step})\n"
        f"{step}if {test}\n{step}else {orelse}\n)\n"
    )


def module_spelling(fm: FileModel, module_name: str, add_import: AddImport) -> str:
    """The name this file reaches ``module_name`` by (``torch``, or ``T`` after ``import torch as
    T``); asks ``add_import`` for ``import <module_name>`` when the file has no such name."""
    for name, qualified, _ in imported_names(fm):
        if module_name in qualified:
            return name
    add_import(module_name)
    return module_name


def runs_right_before(fm: FileModel, call: cst.Call, stmt: cst.CSTNode) -> bool:
    """Statements can be inserted before ``stmt`` and run right before ``call``.

    ``stmt`` may also be an expression around ``call`` that a transform hoisted into a
    statement of its own: then whether ``call`` runs whenever that expression does."""
    if call is stmt:
        return True
    for parent in fm.ancestors(call):
        if parent is stmt:
            return True
        if isinstance(
            parent,
            (cst.SimpleStatementSuite, cst.Lambda, cst.BaseComp, cst.IndentedBlock, cst.IfExp),
        ):
            return False
        if isinstance(parent, cst.BooleanOperation):
            return False
    return False


def fresh_name(
    fm: FileModel, taken: dict[cst.CSTNode, set[str]], name: str, scope: cst.CSTNode
) -> str:
    """``name``, or ``name_2``, ...: not yet a name in ``scope`` (a function, class, module),
    and reserved there (``taken`` caches the names per scope for one transform).

    Every identifier read or written in ``scope`` counts (a global read there must not be
    shadowed); at module level that is every identifier of the file.
    """
    names = taken.get(scope)
    if names is None:
        names = taken[scope] = names_in(fm, scope)
    candidate, n = name, 2
    while candidate in names:
        candidate, n = f"{name}_{n}", n + 1
    names.add(candidate)
    if scope is not fm.module:
        module_names = taken.get(fm.module)
        if module_names is None:  # the file's names copied once per transform, not per name
            module_names = taken[fm.module] = names_in(fm, fm.module)
        module_names.add(candidate)
    return candidate
