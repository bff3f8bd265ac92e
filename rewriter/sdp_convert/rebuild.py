"""libcst's rebuilding traversal (``module.visit(transformer)``), rebuilding only what changed.

libcst's ``CSTNode.visit`` builds a new node for every node it visits, changed or not (each
``_visit_and_replace_children`` calls the node's constructor, which validates it), so a
transformer that edits a few statements of a file pays for a copy of the whole tree: about a
sixth of a conversion of a typical script. ``visit`` here makes the same hook calls, on the same
nodes, in the same order, and builds a new node only where a hook returned something other than
the node it was given somewhere below: elsewhere the ``updated_node`` a ``leave`` hook gets is
the original node itself (equal in every field to the copy libcst would have built, and libcst
nodes compare by identity only where a caller asks for it). What a changed child turns into
follows libcst's rules field by field (``libcst._nodes.internal``): a removed child of an
optional field becomes ``None``, of a ``MaybeSentinel`` field ``MaybeSentinel.DEFAULT``; a
sequence drops removed children and splices flattened ones; a statement body also drops a
statement that an edit left empty (``visit_body_sequence``); a required field refuses both.

The transformer must not use libcst's per-attribute hooks (``on_visit_attribute``/
``on_leave_attribute``), which this walk does not call (the engine's ``_Traversal`` has none).
``tests/test_rebuild.py`` compares the two traversals' hook calls and results over the fixtures.
"""

from __future__ import annotations

import inspect
import re

import libcst as cst

_Result = cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]

#: Per node class: (field, how libcst visits it) in the order its ``_visit_and_replace_children``
#: visits them; a field visited two ways (``ImportFrom.names``: a star or a sequence) is told by
#: its value.
_PLANS: dict[type, tuple[tuple[str, str], ...]] = {}
_CALL = re.compile(r'(visit_\w+)\(\s*self,\s*"(\w+)"')
_SINGLE = ("visit_required", "visit_optional", "visit_sentinel")
_SEQUENCES = ("visit_sequence", "visit_body_sequence")


def _plan(cls: type) -> tuple[tuple[str, str], ...] | None:
    """The fields of ``cls`` and how libcst visits each; None when its source cannot be read
    (the node is then visited by libcst itself)."""
    plan = _PLANS.get(cls)
    if plan is None:
        try:
            source = inspect.getsource(cls._visit_and_replace_children)  # type: ignore[attr-defined]
        except (OSError, TypeError):
            return None
        kinds: dict[str, str] = {}
        for function, field in _CALL.findall(source):
            if function not in _SINGLE + _SEQUENCES:
                return None
            kinds.setdefault(field, function)
        plan = _PLANS[cls] = tuple(kinds.items())
    return plan


def visit(node: cst.CSTNode, visitor: cst.CSTTransformer) -> _Result:
    """``node.visit(visitor)`` for a transformer without per-attribute hooks (module
    docstring): the same result, deep-equal and with the same code."""
    plan = _plan(type(node))
    if plan is None:
        return node.visit(visitor)
    updated = node
    if visitor.on_visit(node):
        changes: dict[str, object] = {}
        for field, how in plan:
            value = getattr(node, field)
            if isinstance(value, cst.CSTNode):
                new = visit(value, visitor)
                if new is not value:
                    changes[field] = _single(value, new, how)
            elif isinstance(value, (tuple, list)):
                items = _sequence(value, visitor, how == "visit_body_sequence")
                if items is not None:
                    changes[field] = items
        if changes:
            updated = node.with_changes(**changes)
    return visitor.on_leave(node, updated)


def _single(child: cst.CSTNode, new: _Result, how: str) -> object:
    """What a field holding ``child`` holds once the walk turned ``child`` into ``new``."""
    if isinstance(new, cst.FlattenSentinel) or (
        isinstance(new, cst.RemovalSentinel) and how == "visit_required"
    ):
        kind = "FlattenSentinel" if isinstance(new, cst.FlattenSentinel) else "RemovalSentinel"
        raise TypeError(
            f"We got a {kind} while visiting a {type(child).__name__}. This node's parent does "
            "not allow it."
        )
    if isinstance(new, cst.RemovalSentinel):
        return None if how == "visit_optional" else cst.MaybeSentinel.DEFAULT
    return new


def _sequence(
    children: tuple[cst.CSTNode, ...] | list[cst.CSTNode], visitor: cst.CSTTransformer,
    body: bool,
) -> tuple[cst.CSTNode, ...] | None:
    """The visited ``children`` as libcst's ``visit_sequence`` (``visit_body_sequence`` for a
    statement body) gives them; None when every child came back as itself."""
    out: list[cst.CSTNode] = []
    changed = False
    for child in children:
        new = visit(child, visitor)
        if new is child:
            out.append(child)
            continue
        changed = True
        if isinstance(new, cst.RemovalSentinel):
            continue
        for item in new if isinstance(new, cst.FlattenSentinel) else (new,):
            if body and not child._is_removable() and item._is_removable():
                continue  # an edit emptied the statement: libcst drops it
            out.append(item)
    return tuple(out) if changed else None
