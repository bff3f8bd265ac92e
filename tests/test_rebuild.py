"""``rebuild.visit``: libcst's rebuilding traversal, rebuilding only what changed, gives the same
hook calls and the same tree as ``module.visit`` (the engine's pass runs on it)."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from sdp_convert import rebuild

ROOT = Path(__file__).resolve().parents[1]
INPUTS = sorted(ROOT.glob("fixtures/*/*/input.py"))


class _Editing(cst.CSTTransformer):
    """Edits of every kind a transform makes (replace, remove from a sequence, flatten into a
    sequence, remove an optional or sentinel field, empty a statement line), recording each hook
    call with the node it got."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str, int]] = []
        self.updated: list[cst.CSTNode] = []
        self.in_annassign = 0
        self.fired: set[str] = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.calls.append(("visit", type(node).__name__, id(node)))
        if isinstance(node, cst.AnnAssign):
            self.in_annassign += 1
        return not isinstance(node, cst.Lambda)  # a subtree not entered

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave(self, original_node, updated_node):  # type: ignore[no-untyped-def]
        self.calls.append(("leave", type(original_node).__name__, id(original_node)))
        self.updated.append(updated_node)
        node = updated_node
        if isinstance(node, cst.AnnAssign):
            self.in_annassign -= 1
        if isinstance(node, cst.Name) and node.value.startswith(("x", "model", "opt")):
            self.fired.add("replace")
            return node.with_changes(value=node.value + "_r")
        if isinstance(node, cst.Arg) and node.keyword is not None and (
            node.keyword.value in ("shuffle", "lr", "batch_size")
        ):
            self.fired.add("remove from a sequence")
            return cst.RemovalSentinel.REMOVE
        if isinstance(node, cst.Annotation) and not self.in_annassign:
            self.fired.add("remove an optional field")
            return cst.RemovalSentinel.REMOVE  # a parameter's or a return's: optional fields
        if isinstance(node, cst.Comma) and isinstance(node.whitespace_after,
                                                      cst.ParenthesizedWhitespace):
            self.fired.add("remove a sentinel field")
            return cst.RemovalSentinel.REMOVE  # a sentinel field
        if isinstance(node, cst.Expr) and isinstance(node.value, cst.Call) and (
            cst.helpers.get_full_name_for_node(node.value.func) == "print"
        ):
            self.fired.add("remove a statement")
            return cst.RemovalSentinel.REMOVE  # may empty its line
        if isinstance(node, cst.SimpleStatementLine) and any(
            isinstance(s, cst.Import) for s in node.body
        ):
            self.fired.add("flatten a statement")
            return cst.FlattenSentinel([node, cst.parse_statement("import sdp_runtime\n")])
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(
            node.targets[0].target, cst.Name
        ) and node.targets[0].target.value.startswith("loss"):
            self.fired.add("flatten a small statement")
            return cst.FlattenSentinel([node, cst.Expr(cst.parse_expression("touch()"))])
        return node


def test_the_fixtures_cover_every_kind_of_edit():
    fired: set[str] = set()
    emptied = 0
    for path in INPUTS:
        editing = _Editing()
        module = cst.parse_module(path.read_bytes())
        rebuild.visit(module, editing)
        fired |= editing.fired
        lines = [s for s in module.body if isinstance(s, cst.SimpleStatementLine)]
        emptied += any(len(s.body) == 1 and "print(" in module.code_for_node(s) for s in lines)
    assert fired == {
        "replace", "remove from a sequence", "remove an optional field",
        "remove a sentinel field", "remove a statement", "flatten a statement",
        "flatten a small statement",
    }
    assert emptied > 10  # lines that hold a print() alone: the body rule drops them


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_same_hook_calls_and_tree_as_libcst(path):
    module = cst.parse_module(path.read_bytes())
    theirs, ours = _Editing(), _Editing()
    expected = module.visit(theirs)
    got = rebuild.visit(module, ours)
    assert ours.calls == theirs.calls
    assert len(ours.updated) == len(theirs.updated)
    for mine, libcsts in zip(ours.updated, theirs.updated, strict=True):
        assert mine.deep_equals(libcsts)
    assert isinstance(got, cst.Module) and got.deep_equals(expected)
    assert got.code == expected.code


def test_an_unchanged_tree_is_the_tree_itself():
    module = cst.parse_module((ROOT / INPUTS[0]).read_bytes())
    assert rebuild.visit(module, cst.CSTTransformer()) is module


def test_a_required_field_refuses_a_removal_as_libcst_does():
    class RemoveCallee(cst.CSTTransformer):
        def leave_Name(self, original_node, updated_node):  # type: ignore[no-untyped-def]
            return cst.RemovalSentinel.REMOVE if updated_node.value == "f" else updated_node

    module = cst.parse_module("f(1)\n")
    with pytest.raises(TypeError, match="RemovalSentinel"):
        module.visit(RemoveCallee())
    with pytest.raises(TypeError, match="RemovalSentinel"):
        rebuild.visit(module, RemoveCallee())
