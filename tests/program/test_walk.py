"""``program.syntax.walk`` and ``findall`` against libcst's own walk: the same calls on the same
nodes in the same order, over every fixture and over syntax the fixtures may lack."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import libcst.matchers as m
import pytest
from sdp_convert.analysis import Visitor
from sdp_convert.program.syntax import findall, walk

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"

EDGES = '''\
"""Doc."""
from __future__ import annotations
from . import a as b, c
from ..pkg import *
import os.path as osp, sys
x: int = 1
y = [i * j for i in range(3) if i for j in range(i)]
z = {k: v async for k, v in items()} if x else (lambda a, /, b=2, *c, d, **e: a)
w = f"{x!r:>{y}} {z=}" + "implicit" 'concatenation', rb'raw' b"bytes"
del w[1:2:3], y
@decorator(arg)
class C(Base, metaclass=Meta):
    a: "C" = None
    async def f(self, *, key=None) -> "C":
        global G
        async with lock as (p, q), other():
            await g(*args, **kw)
        try:
            raise E from err
        except* (A, B) as e:
            pass
        else:
            yield from it
        finally:
            return (n := 3)
match point:
    case Point(x=0, y=[1, *rest]) | {"k": _, **others} if rest:
        print(x if y else z, end="")
    case _:
        nonlocal_ = not -~+1 ** 2 // 3 @ m
assert x, "message"; x += 1; x <<= 2
for i, (a, *b) in enumerate(seq):
    continue
else:
    pass
while True:
    break
type Alias[T] = list[T]
def generic[T: int, *Ts, **P](a: T) -> T: ...
'''


class _Record(Visitor):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.calls.append(("visit", id(node)))
        # prune somewhere, as the index does for imports: children then go unvisited in both
        return not isinstance(node, cst.ImportAlias)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.calls.append(("leave", id(original_node)))


@pytest.fixture(scope="module")
def modules() -> list[tuple[str, cst.Module]]:
    return parsed_fixtures()


def parsed_fixtures() -> list[tuple[str, cst.Module]]:
    """``EDGES`` and every fixture's Python file, parsed: ``(name, module)``."""
    files = sorted(FIXTURES.rglob("*.py"))
    assert len(files) > 300
    sources = [("edges", EDGES)] + [(str(p.relative_to(FIXTURES)), p.read_text()) for p in files]
    return [(name, cst.parse_module(source)) for name, source in sources]


def test_walk_makes_the_calls_libcst_makes_in_its_order_on_every_fixture(modules):
    checked = 0
    for name, module in modules:
        ours, theirs = _Record(), _Record()
        walk(module, ours)
        module.visit(theirs)
        assert ours.calls == theirs.calls, name
        checked += len(theirs.calls)
    assert checked > 500_000  # every node of ~350 files, twice


def test_a_field_visited_only_when_set_keeps_its_place_whatever_came_first():
    # An f-string's format spec is visited only when there is one: a class first met without it
    # must still walk it, in its place, when it is there.
    from sdp_convert.program import syntax

    syntax._FIELDS.clear()
    for source in ('f"{a}"\n', 'f"{a:>{b}} {c!r:{d}}"\n', "from m import *\n", "from m import (a)\n"):
        module = cst.parse_module(source)
        ours, theirs = _Record(), _Record()
        walk(module, ours)
        module.visit(theirs)
        assert ours.calls == theirs.calls, source


@pytest.mark.parametrize(
    "matcher",
    [m.Call(), m.Name("model"), m.Attribute(attr=m.Name("step")), m.Assign(),
     m.Call(func=m.Attribute(attr=m.Name("to")) | m.Name("print")), m.SimpleString(),
     m.Name(), m.Arg(keyword=m.Name("lr")),
     m.Assign(targets=[m.AssignTarget(target=m.Name())], value=m.Call()),
     m.OneOf(m.Name("x"), m.Call())],
    ids=["call", "name", "step", "assign", "either", "string", "any-name", "lr", "assign-call",
         "one-of"],
)
def test_findall_finds_what_libcst_finds(modules, matcher):
    found = 0
    for _, module in modules[:60]:
        ours, theirs = findall(module, matcher), m.findall(module, matcher)
        assert [id(n) for n in ours] == [id(n) for n in theirs]
        found += len(theirs)
    assert found > 0
    assert findall(cst.MaybeSentinel.DEFAULT, matcher) == []


def test_walk_is_not_limited_by_the_recursion_of_libcsts_walk():
    # libcst's visit takes three frames per level: an expression nested 250 deep overflows it
    # under a 2,000-frame limit; ours takes one frame per level.
    import sys

    source = "x = " + "[" * 250 + "1" + "]" * 250 + "\n"
    module = cst.parse_module(source)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1500)
    try:
        with pytest.raises(RecursionError):
            module.visit(_Record())
        record = _Record()
        walk(module, record)
    finally:
        sys.setrecursionlimit(limit)
    assert len(record.calls) > 1000
