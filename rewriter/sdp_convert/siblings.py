"""What the other files of one run say about a file: modules a Hogwild program imports.

``main.py`` of the Hogwild example starts ``torch.multiprocessing`` workers over one model in
shared memory and runs ``train()`` from ``train.py`` in each of them. ``main.py`` alone shows the
parallelism (it is left unchanged, see ``analysis``); ``train.py`` looks like any training
module, and converting it (a sampler, a scaled learning rate, ``sdp`` calls with no ``init()``)
would break the program. So a file that a converted-in-the-same-run file imports, when that file
parallelises with ``torch.multiprocessing`` and ``share_memory()``, is left unchanged too.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path


def hogwild_imports(paths: Sequence[Path]) -> dict[Path, str]:
    """Sibling module path -> the file (of ``paths``) that imports it and runs Hogwild workers."""
    wanted = {p.resolve(): p for p in paths}
    found: dict[Path, str] = {}
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if b"share_memory" not in data or b"multiprocessing" not in data:
            continue
        try:
            tree = ast.parse(data)
        except (SyntaxError, ValueError):
            continue
        if not _uses_multiprocessing(tree):
            continue
        for name in _local_imports(tree):
            sibling = (path.parent / f"{name}.py").resolve()
            if sibling in wanted and sibling != path.resolve():
                found[wanted[sibling]] = str(path)
    return found


def _uses_multiprocessing(tree: ast.Module) -> bool:
    shares = any(
        isinstance(n, ast.Attribute) and n.attr == "share_memory" for n in ast.walk(tree)
    )
    imports = any(
        (isinstance(n, ast.Import) and any(a.name.startswith("torch.multiprocessing")
                                           for a in n.names))
        or (isinstance(n, ast.ImportFrom) and (n.module or "").startswith("torch.multiprocessing"))
        or (isinstance(n, ast.ImportFrom) and n.module == "torch"
            and any(a.name == "multiprocessing" for a in n.names))
        for n in ast.walk(tree)
    )
    return shares and imports


def _local_imports(tree: ast.Module) -> set[str]:
    """Top-level module names the file imports (``import train``, ``from train import x``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level in (0, 1):
            names.add(node.module.split(".")[0])
    return names
