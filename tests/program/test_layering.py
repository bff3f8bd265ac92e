"""The program layer stands below the transforms: nothing under ``sdp_convert/program/`` imports
(at run time or for types) a transform, ``base``, the engine, the runner, the command line, the
pipeline or anything else above it. Ruff's rules ask ``checker.semantic()``, whose
``SemanticModel`` never sees a rule; here ``program.model.FileModel`` plays that part."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "rewriter" / "sdp_convert"
PROGRAM = sorted((PACKAGE / "program").glob("*.py"))
#: Modules outside program/ that it may build on: what a file is (detection), how the files of a
#: project import each other, and what those read files with (reading a regular file, the error
#: it raises). Everything else of sdp_convert is above the program layer.
BELOW = {"sdp_convert.analysis", "sdp_convert.modules", "sdp_convert.siblings",
         "sdp_convert.files", "sdp_convert.changes"}
#: Named in the failure message: the layers the program model must not know.
ABOVE = ("sdp_convert.transforms", "sdp_convert.base", "sdp_convert.engine", "sdp_convert.runner",
         "sdp_convert.cli", "sdp_convert.pipeline", "sdp_convert.migration", "sdp_convert.api",
         "sdp_convert.projects", "sdp_convert.contract", "sdp_convert.options")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, module: str) -> set[str]:
    """Every ``sdp_convert`` module ``source`` (the text of ``module``) imports, wherever the
    import is (``if TYPE_CHECKING:`` and function bodies included)."""
    package = module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("sdp_convert"):
                continue
            if node.module is None:  # from . import x: x is a module of that package
                found.update(f"{target}.{alias.name}" for alias in node.names)
            else:
                found.add(target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("sdp_convert"))
    return found


def _allowed(name: str) -> bool:
    return name == "sdp_convert.program" or name.startswith("sdp_convert.program.") or (
        name in BELOW
    )


def test_the_import_parser_sees_relative_absolute_and_type_only_imports():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from ..base import Transform\n"
        "from .index import FileIndex\n"
        "from .. import engine\n"
        "import sdp_convert.runner\n"
        "if TYPE_CHECKING:\n    from ..transforms.shard_dataloader import ShardDataloader\n"
        "def f():\n    from ..cli import main\n"
    )
    assert imports_of(source, "sdp_convert.program.flow") == {
        "sdp_convert.base", "sdp_convert.program.index", "sdp_convert.engine",
        "sdp_convert.runner", "sdp_convert.transforms.shard_dataloader", "sdp_convert.cli",
    }


@pytest.mark.parametrize("path", PROGRAM, ids=lambda p: p.stem)
def test_a_program_module_imports_nothing_above_the_program_layer(path):
    module = _module_name(path)
    above = sorted(name for name in imports_of(path.read_text(), module) if not _allowed(name))
    assert above == [], (
        f"{module} imports {above}: the program layer must not know the layers above it "
        f"({', '.join(ABOVE)}); take a FileModel (program.model), return facts, and let the "
        "transform act"
    )


def test_what_the_program_layer_builds_on_imports_nothing_above_it_either():
    for name in sorted(BELOW):
        path = PACKAGE.parent / (name.replace(".", "/") + ".py")
        above = sorted(n for n in imports_of(path.read_text(), name) if not _allowed(n))
        assert above == [], f"{name}, which the program layer imports, imports {above}"


def test_importing_the_whole_program_layer_loads_no_transform_base_or_engine():
    modules = [_module_name(p) for p in PROGRAM]
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n    importlib.import_module(name)\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('sdp_convert'))))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    assert "sdp_convert.program.model" in loaded
    above = sorted(m for m in loaded if not _allowed(m) and m != "sdp_convert")
    assert above == [], f"importing sdp_convert.program loads {above}"


def test_the_transforms_base_imports_the_program_layer_for_types_only():
    """``base.Transform`` reaches the program model it is given (``self.fm``); it imports the
    program layer under ``if TYPE_CHECKING:`` only, nowhere it would run."""
    tree = ast.parse((PACKAGE / "base.py").read_text())
    type_only = {
        id(node) for stmt in tree.body
        if isinstance(stmt, ast.If) and ast.unparse(stmt.test) == "TYPE_CHECKING"
        for node in ast.walk(stmt)
    }
    at_run_time = sorted(
        ast.unparse(node) for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and id(node) not in type_only
        and (node.module or "").startswith("program")
    )
    assert at_run_time == []
    assert any(isinstance(n, ast.ImportFrom) and n.module == "program.model"
               for n in ast.walk(tree) if id(n) in type_only)
