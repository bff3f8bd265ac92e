"""The program layer stands below the transforms: nothing under ``sdp_convert/program/`` imports
(at run time or for types) a transform, ``base``, the engine, the runner, the command line, the
pipeline or anything else above it. Ruff's rules ask ``checker.semantic()``, whose
``SemanticModel`` never sees a rule; here ``program.model.FileModel`` plays that part."""

from __future__ import annotations

import ast
import re
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


# -- the layers inside program/ ------------------------------------------------------------------

#: The layers of ``program/``, lowest first: (what the layer knows, its modules). A module imports
#: modules of its own layer and of the layers below it, never one above (at module level, inside
#: a function, or for types; the one exception is ``TYPE_ONLY_ANYWHERE``). Inside a layer the
#: imports form no circle. docs/how-it-works.md lists the same layers.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    # Reading and building code, where nodes start, qualified names by libcst's rules, and the
    # vocabularies and facts that are plain data (no tree walked with a binding index).
    ("syntax, names and data", frozenset({"syntax", "positions", "names", "vocab", "facts"})),
    # The one walk of a file: every binding and read, scopes, self.<attr>.
    ("bindings", frozenset({"index"})),
    # Questions on the index: uses of a binding, callers and callees, argument to parameter,
    # the calls and loops that train.
    ("scopes", frozenset({"scopes"})),
    # Value flow both ways, and the framework vocabularies with their questions on names.
    ("value flow and vocabularies", frozenset({
        "flow", "builders", "keras", "optimizers", "loaders", "writes",
    })),
    # What one file does: models, optimizers' steps, TensorFlow training, rank-0 code, writes,
    # deletions, downloads, Keras 2 calls, launch flags.
    ("per-file facts", frozenset({
        "training", "steps", "models", "model_setup", "ranks", "rank_splits", "readback",
        "smp_saves", "guards", "deletions", "fetches", "launch", "keras2", "keras_reads",
        "permutations", "example_lists", "seeds",
        "stream_splits",
    })),
    # What the other modules of the run say about this one (``ModuleFacts`` given to the file):
    # loaders built elsewhere that it iterates, loaders it builds for another module, repairs.
    ("the file in its project", frozenset({"project"})),
    # Whether the data that feeds training is split between the ranks: builds on the file's
    # facts and on what the project says about its loaders.
    ("training data", frozenset({"datasets", "batch_iterators", "sample_lists", "tfshards",
                                 "sharding"})),
    # The program model of one file: at run time it holds the binding index only; its cache of
    # answers (``Facts``) is typed with the answers of the layers below.
    ("the file's model", frozenset({"model"})),
    # Several modules, one program: bindings, calls and returns followed across the run.
    ("the run", frozenset({"run"})),
)
#: Modules every layer may import under ``if TYPE_CHECKING:`` whatever their layer: every function
#: of ``program/`` takes a ``model.FileModel`` as its first argument and names it in annotations.
#: Such a reference is a type only (nothing runs, nothing is imported at run time): the function
#: asks the model for what the lower layers gave it (parents, qualified names, the index), never
#: for an answer of a higher layer.
TYPE_ONLY_ANYWHERE = frozenset({"model"})
LAYER_OF = {name: level for level, (_, names) in enumerate(LAYERS) for name in names}


def program_imports(source: str) -> list[tuple[str, int, bool]]:
    """``(module, line, type_only)`` for every import of a module of ``program/`` in ``source``
    (a module of ``program/``): relative or absolute, at module level, inside a function or a
    class, or under ``if TYPE_CHECKING:`` (``type_only``)."""
    tree = ast.parse(source)
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING", "typing.TYPE_CHECKING"
        ):
            type_only.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1 or module == "sdp_convert.program" or (
                node.level == 2 and module == "program"
            ):
                if node.level == 1 and module:
                    names = [module.split(".")[0]]
                else:  # from . import x, from sdp_convert.program import x
                    names = [alias.name for alias in node.names]
            elif module.startswith("sdp_convert.program.") or (
                node.level == 2 and module.startswith("program.")
            ):
                names = [module.split("program.", 1)[1].split(".")[0]]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[2] for a in node.names
                     if a.name.startswith("sdp_convert.program.")]
        found.extend((name, node.lineno, id(node) in type_only) for name in names)
    return sorted(found, key=lambda f: f[1])


def _stems() -> list[str]:
    return [p.stem for p in PROGRAM if p.stem != "__init__"]


def test_the_layer_parser_sees_lazy_type_only_relative_and_absolute_imports():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from .index import FileIndex\n"
        "from . import scopes\n"
        "from ..analysis import detect\n"
        "import sdp_convert.program.flow\n"
        "if TYPE_CHECKING:\n    from .model import FileModel\nelse:\n    from .keras import x\n"
        "def f():\n    from .sharding import training_data\n"
        "class C:\n    def g(self):\n        from sdp_convert.program import run\n"
    )
    assert program_imports(source) == [
        ("index", 2, False), ("scopes", 3, False), ("flow", 5, False), ("model", 7, True),
        ("keras", 9, False), ("sharding", 11, False), ("run", 14, False),
    ]


def test_every_program_module_is_in_exactly_one_layer():
    listed = [name for _, names in LAYERS for name in names]
    twice = sorted({name for name in listed if listed.count(name) > 1})
    assert twice == [], f"in more than one layer: {twice}"
    assert sorted(set(_stems()) - set(listed)) == [], "a program module in no layer: add it"
    assert sorted(set(listed) - set(_stems())) == [], "a layer names a module that is gone"
    # The package itself is documentation: it imports none of its modules.
    assert program_imports((PACKAGE / "program" / "__init__.py").read_text()) == []


@pytest.mark.parametrize("path", [p for p in PROGRAM if p.stem != "__init__"],
                         ids=lambda p: p.stem)
def test_a_program_module_imports_no_module_of_a_higher_layer(path):
    level = LAYER_OF[path.stem]
    upward = [
        f"{path.name}:{line} imports {name} ({LAYERS[LAYER_OF[name]][0]})"
        + (" under TYPE_CHECKING" if type_only else "")
        for name, line, type_only in program_imports(path.read_text())
        if LAYER_OF[name] > level and not (type_only and name in TYPE_ONLY_ANYWHERE)
    ]
    assert upward == [], (
        f"{path.stem} is in the layer '{LAYERS[level][0]}' and imports from above it: "
        f"{upward}; move the function it needs down (or this module up), do not hide the import "
        "in a function"
    )


def test_the_imports_inside_each_layer_form_no_circle():
    edges: dict[str, dict[str, int]] = {}
    for path in PROGRAM:
        if path.stem == "__init__":
            continue
        for name, line, type_only in program_imports(path.read_text()):
            if type_only and name in TYPE_ONLY_ANYWHERE:
                continue
            if name != path.stem and LAYER_OF[name] == LAYER_OF[path.stem]:
                edges.setdefault(path.stem, {}).setdefault(name, line)

    def circle_from(start: str, trail: list[str]) -> list[str] | None:
        for name in sorted(edges.get(trail[-1], {})):
            if name == start:
                return trail
            if name not in trail:
                found = circle_from(start, [*trail, name])
                if found:
                    return found
        return None

    for start in sorted(edges):
        circle = circle_from(start, [start])
        if circle:
            hops = [f"{a}.py:{edges[a][b]} imports {b}"
                    for a, b in zip(circle, [*circle[1:], start], strict=True)]
            pytest.fail(f"a circle inside the layer '{LAYERS[LAYER_OF[start]][0]}': {hops}")


def test_how_it_works_lists_the_same_layers():
    """docs/how-it-works.md's table of the program layer: one row group per layer, in order."""
    text = (PACKAGE.parents[1] / "docs" / "how-it-works.md").read_text()
    rows = text.split("| layer | module | answers |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    documented: list[set[str]] = []
    for row in rows:
        layer, modules = row.split(" | ")[:2]
        if layer.strip("| *"):
            documented.append(set())
        documented[-1].update(re.findall(r"`program\.(\w+)`", modules))
    assert documented == [set(names) for _, names in LAYERS]
