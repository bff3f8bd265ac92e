"""Can a statement be put under ``if <rank> == 0:`` without changing what the other ranks do,
and is a use of a rank-0-only handle already testing it for None."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .index import Binding
from .scopes import binding_of, uses
from .syntax import target_names

if TYPE_CHECKING:
    from .model import FileModel


#: Why a statement cannot go onto rank 0 alone: the rest of the code reads what it assigns.
USED_LATER = "it assigns a name used later, which the other ranks would miss"


def guard_advice(problem: str, sdp: str) -> str:
    """What to do about a write on every rank that cannot go under ``if <rank> == 0:`` because
    of ``problem`` (``why_not_guardable``'s words). Where every rank needs the name it assigns
    (``train, labels = parse_annotations(dir, cache_file)``), never "run it on rank 0 only": a
    cache it reads back is built first by each machine's first process (``rank0_first``), any
    other write goes under the rank test inside, where it is."""
    if problem == USED_LATER:
        return (
            "every rank uses the name it assigns, so it cannot run on rank 0 alone: if what it "
            "writes is a cache it reads back, let each machine's first process build it before "
            f"the others read it (`with {sdp}.rank0_first():` around this call); otherwise keep "
            f"it on every rank and put the write itself under `if {sdp}.rank() == 0:`"
        )
    return f"{problem}; make it run on rank 0 only (if {sdp}.rank() == 0:)"


def why_not_guardable(fm: FileModel, node: cst.CSTNode, stmt: cst.CSTNode | None) -> str | None:
    """Why ``stmt`` (holding ``node``) cannot go under ``if <rank> == 0:``, in words; None when
    it can: not in a lambda, condition or ``for`` header, not sharing a line with a def, its
    result neither returned nor assigned to a name read later."""
    child = node
    for parent in fm.ancestors(node):
        if isinstance(parent, cst.Lambda):
            return "it is inside a lambda"
        if isinstance(parent, cst.SimpleStatementSuite) and parent is not stmt:
            compound = fm.parent(parent)
            if isinstance(compound, (cst.FunctionDef, cst.ClassDef)):
                return "it shares its line with a def, class or try"
        if parent is stmt:
            break
        if isinstance(parent, (cst.If, cst.While)) and child is parent.test:
            return "it is in a condition"
        if isinstance(parent, cst.For) and child is parent.iter:
            return "it is in a for header"
        child = parent
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef, cst.Try)):
        return "it shares its line with a def, class or try"
    if isinstance(stmt, cst.SimpleStatementLine):
        for small in stmt.body:
            if isinstance(small, cst.Return):
                return "its result is returned"
            if isinstance(
                small, (cst.Assign, cst.AnnAssign, cst.AugAssign)
            ) and binds_used_names(fm, small):
                return USED_LATER
    if isinstance(stmt, (cst.If, cst.While)) and isinstance(stmt.body, cst.IndentedBlock):
        return "it is in a condition"
    return None

def binds_used_names(fm: FileModel, small: cst.Assign | cst.AnnAssign | cst.AugAssign) -> bool:
    targets = (
        [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
    )
    for target in targets:
        names = (
            [n for n in target_names(target)]
            if not isinstance(target, cst.Attribute)
            else None
        )
        if names is None or isinstance(small, cst.AugAssign):
            return True
        for name in names:
            binding = binding_of(fm, name)
            if binding is None or uses(fm, binding):
                return True
    return False

def under_handle_test(fm: FileModel, use: cst.CSTNode, binding: Binding) -> bool:
    """``use`` is in ``if handle:`` / ``if handle is not None:`` (None on the other ranks)."""
    child = use
    for parent in fm.ancestors(use):
        if isinstance(parent, cst.If) and child is parent.body:
            test = parent.test
            if m.matches(
                test,
                m.Comparison(comparisons=[m.ComparisonTarget(m.IsNot(), m.Name("None"))]),
            ):
                assert isinstance(test, cst.Comparison)
                test = test.left
            if fm.module.code_for_node(test) == binding.code:
                return True
        child = parent
    return False

def is_none_test(fm: FileModel, use: cst.CSTNode) -> bool:
    """``handle is None``, ``not handle``, ``if handle:``: reading None there is fine."""
    parent = fm.parent(use)
    if isinstance(parent, cst.Comparison) and parent.left is use:
        return all(
            isinstance(c.operator, (cst.Is, cst.IsNot))
            and m.matches(c.comparator, m.Name("None"))
            for c in parent.comparisons
        )
    if isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not):
        return True
    if isinstance(parent, cst.BooleanOperation):
        return True
    return isinstance(parent, (cst.If, cst.While, cst.IfExp)) and parent.test is use
