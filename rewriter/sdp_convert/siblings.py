"""What the other files of one run say about a file: modules a Hogwild program imports; which
files make up the run's project, and a digest of them (without parsing anything).

``main.py`` of the Hogwild example starts ``torch.multiprocessing`` workers over one model in
shared memory and runs ``train()`` from ``train.py`` in each of them. ``main.py`` alone shows the
parallelism (it is left unchanged, see ``analysis``); ``train.py`` looks like any training
module, and converting it (a sampler, a scaled learning rate, ``sdp`` calls with no ``init()``)
would break the program. So a file that a converted-in-the-same-run file imports, when that file
parallelises with ``torch.multiprocessing`` and ``share_memory()``, is left unchanged too.
"""

from __future__ import annotations

import ast
import hashlib
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .files import read_regular

#: What ``read_project`` gives: ``(written, shown, contents)``.
ProjectFiles = tuple[dict[Path, str], dict[Path, str], dict[Path, bytes]]


def hogwild_imports(
    paths: Sequence[Path], contents: Mapping[Path, bytes] | None = None
) -> dict[Path, str]:
    """Sibling module path -> the file (of ``paths``) that imports it and runs Hogwild workers.

    ``contents``: files read already (resolved path -> bytes, as ``read_project`` gives them),
    not read again."""
    resolve = resolver()
    resolved = {p: resolve(p) for p in paths}
    wanted = {r: p for p, r in resolved.items()}
    found: dict[Path, str] = {}
    for path in paths:
        data = contents.get(resolved[path]) if contents is not None else None
        if data is None:
            try:
                data = read_regular(path)
            except OSError:
                continue
            if data is None:
                continue
        if b"share_memory" not in data or b"multiprocessing" not in data:
            continue
        try:
            tree = ast.parse(data)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        if not _uses_multiprocessing(tree):
            continue
        for name in _local_imports(tree):
            sibling = (path.parent / f"{name}.py").resolve()
            if sibling in wanted and sibling != resolved[path]:
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


#: At most this many neighbouring files are read (a file in a huge folder stays on its own).
MAX_NEIGHBOURS = 500
#: Larger files are not read as neighbours (generated code, data).
MAX_BYTES = 1_000_000


def neighbours(
    paths: Sequence[Path], is_package: Callable[[Path], bool] | None = None
) -> list[Path]:
    """Python files next to ``paths``: their folders, the packages in those folders (and in a
    ``src/`` folder there), and the package each file belongs to (up to its top package's
    folder)."""
    is_package = is_package or is_package_folder
    roots: set[Path] = set()
    for folder in dict.fromkeys(path.parent for path in paths):  # files share folders
        while is_package(folder) and folder.parent != folder:
            folder = folder.parent
        roots.add(folder)
    found: list[Path] = []
    for root in sorted(roots):
        for walked, dirs, files in os.walk(root):
            here = Path(walked)
            dirs[:] = sorted(
                d for d in dirs if is_package(here / d) or (here == root and d == "src")
            )
            found += [here / f for f in sorted(files) if f.endswith(".py")]
            if len(found) > MAX_NEIGHBOURS:
                return []
    return found


def is_package_folder(folder: Path) -> bool:
    """A folder with an ``__init__.py`` (one that cannot be read is not: the run says why)."""
    try:
        return (folder / "__init__.py").is_file()
    except OSError:
        return False


def resolver() -> Callable[[Path], Path]:
    """``Path.resolve`` for many files in few folders: each folder is resolved once (a file that
    is not a symlink resolves to its resolved folder / its name)."""
    folders: dict[Path, Path] = {}

    def resolve(path: Path) -> Path:
        try:
            if path.name in ("", ".", "..") or os.path.islink(path):
                return path.resolve()
            folder = folders.get(path.parent)
            if folder is None:
                folder = folders[path.parent] = path.parent.resolve()
        except (OSError, RuntimeError):  # a symlink loop: the path as it is (never read)
            return path.absolute()
        return folder / path.name

    return resolve


def read_project(files: Sequence[tuple[Path, str]]) -> ProjectFiles:
    """The project of a run (``projects``): ``(written, shown, contents)``: the run's own Python
    files (resolved path -> display name), those and their ``neighbours`` (-> the name reports
    give them), and the contents of every one that can be read (not a link, not too large).

    Each file is read once; a run reads its project once and hands it to ``project_digest``,
    ``hogwild_imports`` and ``projects.project_options``."""
    resolve = resolver()
    written = {resolve(path): display for path, display in files if path.suffix == ".py"}
    shown = dict(written)
    for path in neighbours([p for p, _ in files if p.suffix == ".py"], _package_test()):
        shown.setdefault(resolve(path), str(path))
    contents: dict[Path, bytes] = {}
    for path in shown:
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
                continue  # a link, a FIFO or a device: never read (a FIFO would hang)
            if (data := read_regular(path)) is not None:
                contents[path] = data
        except OSError:
            continue
    return written, shown, contents


def _package_test() -> Callable[[Path], bool]:
    """``is_package_folder``, asked once per folder."""
    known: dict[Path, bool] = {}

    def is_package(folder: Path) -> bool:
        if folder not in known:
            known[folder] = is_package_folder(folder)
        return known[folder]

    return is_package


def project_digest(
    files: Sequence[tuple[Path, str]], project: ProjectFiles | None = None
) -> str:
    """A digest of everything project mode reads for the run's ``files``: which files are
    converted, the names reports give them, and the contents of those and their neighbours.
    A cached conversion is valid only while it is unchanged (``cache``: it goes into the key's
    ``deps``). Empty when there is no project (fewer than two readable Python files).
    ``project``: what ``read_project(files)`` gave, if the caller has it."""
    written, shown, contents = project if project is not None else read_project(files)
    if len(contents) < 2:
        return ""
    digest = hashlib.sha256()
    for path in sorted(contents):
        own = hashlib.sha256(contents[path]).hexdigest()
        digest.update(f"{path}\0{shown[path]}\0{path in written}\0{own}\n".encode())
    return digest.hexdigest()
