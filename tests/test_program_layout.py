"""The shape of the converter: transforms are leaves that ask the program layer, not each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TRANSFORMS = Path(__file__).resolve().parents[1] / "rewriter" / "sdp_convert" / "transforms"
MODULES = sorted(p for p in TRANSFORMS.glob("*.py") if p.name != "__init__.py")


def _imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:  # from .x import y / from . import x
                found.update([node.module] if node.module else [a.name for a in node.names])
            elif node.level == 0 and (node.module or "").startswith("sdp_convert.transforms"):
                found.add(node.module or "")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("sdp_convert.transforms"))
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_a_transform_imports_no_other_transform(path):
    assert _imported_modules(path) == set(), (
        f"{path.name} imports another transform module: move what it shares to "
        "sdp_convert.program (or sdp_convert.migration)"
    )



@pytest.mark.parametrize(
    "decorate",
    [lambda m: m.leave(m.Call()), lambda m: m.visit(m.Name()), lambda m: m.call_if_inside(m.For())],
    ids=["leave", "visit", "call_if_inside"],
)
def test_a_transform_with_a_matcher_decorated_hook_is_refused_when_defined(decorate):
    import libcst.matchers as m
    from sdp_convert.base import Transform

    with pytest.raises(TypeError, match="matcher decorators .* are not supported on a Transform"):

        class Decorated(Transform):  # noqa: F841 - defining it is the test
            @decorate(m)
            def on_call(self, original_node, updated_node):
                return updated_node


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_a_transform_module_stays_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= 450, (
        f"{path.name} has {lines} lines: a transform holds its policy only; move the analysis it "
        "needs to sdp_convert.program"
    )
