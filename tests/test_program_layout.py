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

