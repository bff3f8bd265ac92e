"""``program.syntax.walk_code``, the walk of the binding index and detection, against ``walk``:
the same nodes less the layout ones (whitespace, comments, punctuation), and the same answers
from the index, the qualified names and detection, on every fixture."""

from __future__ import annotations

import dataclasses

import libcst as cst
import pytest
from sdp_convert import engine
from sdp_convert.analysis import Visitor
from sdp_convert.program import index as index_module
from sdp_convert.program import syntax
from sdp_convert.program.syntax import LAYOUT, walk, walk_code

from .test_walk import parsed_fixtures


@pytest.fixture(scope="module")
def modules() -> list[tuple[str, cst.Module]]:
    return parsed_fixtures()


class _Record(Visitor):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []
        self.parents: dict[int, int | None] = {}
        self.stack: list[cst.CSTNode] = []
        self.layout_inside: list[cst.CSTNode] = []  # non-layout nodes under a layout one

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.stack and type(self.stack[-1]) in LAYOUT and type(node) not in LAYOUT:
            self.layout_inside.append(node)
        self.calls.append(("visit", id(node)))
        self.parents[id(node)] = id(self.stack[-1]) if self.stack else None
        self.stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.stack.pop()
        self.calls.append(("leave", id(original_node)))


def test_walk_code_is_walk_without_the_layout_nodes(modules):
    kept = dropped = 0
    for name, module in modules:
        full, code = _Record(), _Record()
        walk(module, full)
        walk_code(module, code)
        # Layout nodes hold layout nodes only: dropping them drops nothing else.
        assert full.layout_inside == [], name
        layout = {id(n) for n in syntax._preorder(module) if type(n) in LAYOUT}
        assert code.calls == [c for c in full.calls if c[1] not in layout], name
        assert code.parents == {k: v for k, v in full.parents.items() if k not in layout}, name
        kept += len(code.parents)
        dropped += len(layout)
    assert dropped > kept  # most of libcst's nodes are layout


def _read_full(module: cst.Module, monkeypatch: pytest.MonkeyPatch):
    """The engine's read of ``module`` as it was before ``walk_code``: every node walked."""
    with monkeypatch.context() as patch:
        patch.setattr(index_module, "walk_code", walk)
        patch.setattr(index_module, "LAYOUT", frozenset())
        return engine._read(module, "auto", False)


def _plain(value: object) -> object:
    """``value`` with nodes as their ids, for comparing."""
    if isinstance(value, cst.CSTNode):
        return ("node", id(value))
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}  # type: ignore[misc]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(map(repr, map(_plain, value)))
    return value


def _binding(b: index_module.Binding, rank) -> tuple:
    return (b.name, id(b.scope), b.kind, id(b.stmt), id(b.value), b.unpacked, rank(b.order),
            id(b.target), b.blocks)


def test_the_index_names_and_detection_answer_as_with_every_node_walked(modules, monkeypatch):
    checked = 0
    for name, module in modules:
        _, full, _, full_info = _read_full(module, monkeypatch)
        _, code, _, code_info = engine._read(module, "auto", False)
        nodes = syntax._preorder(module)
        layout = {id(n) for n in nodes if type(n) in LAYOUT}
        # (the index does not go into imports: their names are bound at the statement)
        kept = [n for n in nodes if id(n) in full.order and id(n) not in layout]
        # Order: the same nodes in the same order; a position taken between nodes (where a
        # binding made at the end of a statement counts from) is the number of kept nodes
        # before it.
        assert list(code.order) == [id(n) for n in kept], name
        assert sorted(code.order.values()) == list(range(len(kept))), name
        positions = sorted(full.order[id(n)] for n in kept)

        def rank(position: int, positions: list[int] = positions) -> int:
            from bisect import bisect_left

            return bisect_left(positions, position)

        assert all(code.order[id(n)] == rank(full.order[id(n)]) for n in kept), name
        assert {k: v for k, v in full.scope_of.items() if k not in layout} == code.scope_of
        assert all(code.scope(n) is full.scope(n) for n in kept), name
        assert {t: v for t, v in full.by_type.items() if t not in LAYOUT} == code.by_type, name
        for table in ("bindings", "augmented", "attribute_bindings"):
            assert {k: [_binding(b, rank) for b in v]
                    for k, v in getattr(full, table).items()} == {
                k: [_binding(b, lambda o: o) for b in v]
                for k, v in getattr(code, table).items()}, (name, table)
        assert [(rank(s), rank(e), names) for s, e, names in full.loop_spans] == (
            code.loop_spans), name
        for field in ("parent_scope", "loads", "shadowed", "shadowed_reads", "declared",
                      "calls_by_name", "functions", "classes", "loops", "withs", "returns",
                      "_load_ids", "read_blocks"):
            ours, theirs = getattr(code, field), getattr(full, field)
            if field == "shadowed":
                ours = {k: _binding(b, lambda o: o) for k, b in ours.items()}
                theirs = {k: _binding(b, rank) for k, b in theirs.items()}
            assert _plain(ours) == _plain(theirs), (name, field)
        assert {k: _binding(b, lambda o: o) for k, b in code.by_target.items()} == {
            k: _binding(b, rank) for k, b in full.by_target.items()}, name
        # Qualified names: the same for every node; none for a layout node either way.
        assert full.names is not None and code.names is not None
        for node in nodes:
            assert code.names[node] == full.names[node], name
            if id(node) in layout:
                assert not full.names[node]
        # Detection: the same answers; parents of the kept nodes.
        for field in dataclasses.fields(full_info):
            ours, theirs = getattr(code_info, field.name), getattr(full_info, field.name)
            if field.name == "parents":
                theirs = {k: v for k, v in theirs.items() if id(k) not in layout}
            assert _plain(ours) == _plain(theirs), (name, field.name)
        checked += len(kept)
    assert checked > 150_000
