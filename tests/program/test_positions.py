"""``node_positions`` stops its code generation once the last target's ends: the positions it
gives must be those of the whole generation, for any choice of targets."""

from __future__ import annotations

import random
from pathlib import Path

import libcst as cst
import pytest
from sdp_convert.program import positions

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(ROOT.glob("fixtures/*/*/input.py"))[::3]


def _nodes(module: cst.Module) -> list[cst.CSTNode]:
    found, todo = [], [module]
    while todo:
        node = todo.pop()
        found.append(node)
        todo.extend(reversed(node.children))
    return found


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_stopping_after_the_last_target_gives_the_whole_generations_positions(source, monkeypatch):
    module = cst.parse_module(source.read_bytes())
    nodes = _nodes(module)
    picks = random.Random(source.name + source.parent.name)
    choices = [
        {id(n) for n in nodes if isinstance(n, cst.BaseStatement | cst.Call)},
        {id(nodes[len(nodes) // 3])},  # one node early on: most of the file is left out
        {id(n) for n in picks.sample(nodes, min(20, len(nodes)))},
        {id(n) for n in nodes},
    ]
    for targets in choices:
        early = positions.node_positions(module, targets)
        with monkeypatch.context() as patch:
            patch.setattr(positions._TargetPositions, "after_codegen", lambda self, node: None)
            whole = positions.node_positions(module, targets)
        assert {k: early[k] for k in targets if k in early} == {
            k: whole[k] for k in targets if k in whole}
        assert targets & set(early) == targets & set(whole)


def test_the_generation_stops_at_the_last_target(monkeypatch):
    module = cst.parse_module("a = 1\nif b:\n    c = f(2)\n" + "d = 3\n" * 50)
    call = module.body[1].body.body[0].body[0].value
    seen: list[cst.CSTNode] = []
    original = positions._TargetPositions.before_codegen

    def before(self, node):
        seen.append(node)
        original(self, node)

    monkeypatch.setattr(positions._TargetPositions, "before_codegen", before)
    assert positions.node_positions(module, {id(call), id(module.body[0])}) == {
        id(call): (3, 8), id(module.body[0]): (1, 0)}
    assert not any(node is module.body[-1] for node in seen)
