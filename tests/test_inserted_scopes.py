"""The inserted-code check follows, in each function, only the functions the conversion changed
(``inserted._changed_functions``): what it reports must be what following every function of
both files reports, on the fixtures' input/expected pairs and on outputs that do break a
function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from sdp_convert import inserted

ROOT = Path(__file__).resolve().parent.parent


def _pairs() -> list[tuple[str, bytes, bytes]]:
    pairs = []
    for case in sorted(ROOT.glob("fixtures/*/*/input.py")):
        expected = case.with_name("expected.py")
        if expected.exists():
            pairs.append((str(case.parent.relative_to(ROOT)), case.read_bytes(),
                          expected.read_bytes()))
    for source in sorted(ROOT.glob("fixtures/projects/*/input/**/*.py")):
        parts = source.relative_to(ROOT).parts
        expected = ROOT.joinpath(*parts[:3], "expected", *parts[4:])
        if expected.exists():
            pairs.append((str(source.relative_to(ROOT)), source.read_bytes(),
                          expected.read_bytes()))
    return pairs


def _broken(output: bytes) -> bytes | None:
    """``output`` with, in each of its first functions that assigns a name after its first
    statement, a read of that name put before the first statement (UnboundLocalError)."""
    try:
        tree = ast.parse(output)
    except SyntaxError:
        return None
    lines = output.splitlines(keepends=True)
    inserts: dict[int, bytes] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or len(inserts) >= 4:
            continue
        name = next((t.id for s in node.body[1:] if isinstance(s, ast.Assign)
                     for t in s.targets if isinstance(t, ast.Name)), None)
        first = node.body[0]
        if name is None or first.lineno in inserts or first.lineno == node.lineno:
            continue
        indent = lines[first.lineno - 1][:first.col_offset]
        if indent.strip():
            continue
        inserts[first.lineno] = indent + f"print({name})\n".encode()
    if not inserts:
        return None
    return b"".join(inserts.get(i + 1, b"") + line for i, line in enumerate(lines))


def _both(before: bytes, after: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list]:
    restricted = inserted.problems(before, after)
    with monkeypatch.context() as patch:
        patch.setattr(inserted, "_changed_functions", lambda *args: None)
        whole = inserted.problems(before, after)
    return restricted, whole


def test_following_only_the_changed_functions_finds_what_following_all_finds(monkeypatch):
    pairs = _pairs()
    assert len(pairs) > 100
    broken = 0
    for name, before, after in pairs:
        restricted, whole = _both(before, after, monkeypatch)
        assert restricted == whole, name
        worse = _broken(after)
        if worse is not None:
            restricted, whole = _both(before, worse, monkeypatch)
            assert restricted == whole, name
            broken += any("on a path that does not bind it" in why for _, why in whole)
    assert broken > 50  # the broken outputs do find problems in functions


def test_a_function_changed_among_twins_of_the_same_name_is_followed(monkeypatch):
    before = b"def f():\n    x = 1\n    return x\n\n\ndef f():\n    print(x)\n    x = 2\n"
    after = b"def f():\n    print(x)\n    x = 1\n    return x\n\n\ndef f():\n    print(x)\n" \
            b"    x = 2\n"
    restricted, whole = _both(before, after, monkeypatch)
    assert restricted == whole == []  # `f`'s `x` is excused by the other `f`'s read, as before
    after = b"def f():\n    x = 1\n    return x\n\n\ndef g():\n    print(y)\n    y = 2\n"
    before = after.replace(b"print(y)", b"pass")
    restricted, whole = _both(before, after, monkeypatch)
    assert restricted == whole and [why for _, why in whole] == [
        "the inserted code reads `y` in g() on a path that does not bind it "
        "(UnboundLocalError when that path runs)"]


def test_an_unchanged_function_is_not_followed_again():
    before = b"def f():\n    print(x)\n    x = 1\n\n\ndef g():\n    return 1\n"
    after = b"import os\n\n\ndef f():\n    print(x)\n    x = 1\n\n\ndef g():\n    return 2\n"
    assert inserted._changed_functions(ast.parse(before), ast.parse(after), before,
                                       after) == {"g"}
    latin = b"# -*- coding: latin-1 -*-\n" + after
    assert inserted._changed_functions(ast.parse(before), ast.parse(latin), before,
                                       latin) is None
