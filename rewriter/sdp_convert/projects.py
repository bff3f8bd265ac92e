"""Project mode: the files of one run, and the Python files next to them, are one program.

Before any file is converted, the run asks every PyTorch training script which functions of the
other modules feed its training loops (``engine.project_calls``, imports resolved by
``program.project.Project``), converts the modules that build those loaders with that fact
(``LoaderFeed``: the DataLoader gets its sampler where it is built, "used by main.py:38"), and
hands the training script what that conversion did (``ShardedSource``: set_epoch in its epoch
loop, its learning rate scaled). Every file is then converted with its ``ModuleFacts`` in
``Options.project``, in any order and in any worker process.

Files next to the given ones (the same folder, the packages in it, and the package a file is in)
are read, never written: a file given alone converts as before, understood with its neighbours. A
loader whose module is only read is not sharded in this run, and the training script says so
rather than scaling its learning rate for data that stays whole.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import gc
import re
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from .base import Options
from .engine import ModuleProbe, probe_module, project_exports
from .modules import Project, imported_modules, reachable_modules
from .program.project import LoaderFeed, ModuleFacts, ShardedSource
from .siblings import ProjectFiles, read_project


def project_options(
    files: Sequence[tuple[Path, str]], options: Options, project_files: ProjectFiles | None = None
) -> dict[Path, Options]:
    """``(path, display name)`` of the files this run converts -> the options to convert each
    with (``Options.project`` filled in). Files that cannot be read are left to the run.
    ``project_files``: what ``siblings.read_project(files)`` gave, if the caller has it."""
    written, shown, contents = (
        project_files if project_files is not None else read_project(files)
    )
    if len(contents) < 2:
        return {}
    project = Project(contents)

    # Only the modules that import others of the project, and those they import, are analysed
    # (with libcst): in a folder of independent scripts nothing is.
    with _collector_paused():
        imported = {path: imported_modules(project, path) for path in contents}
    related = {p for p, targets in imported.items() if targets} | {
        t for targets in imported.values() for t in targets
    }
    probes: dict[Path, ModuleProbe] = {
        path: probe_module(data, options, functools.partial(project.resolve, path),
                           functools.partial(_stepping, project, path))
        if path in related else ModuleProbe()
        for path, data in contents.items()
    }
    # Which entry points run the training code of which modules (init() goes there). Both are
    # converted in this run, or neither changes for the other (the module keeps its note).
    starts: dict[Path, list[Path]] = {}
    for path in contents:
        # (A training script is an entry point too: it initialises for the modules it runs.)
        if path in written and not probes[path].library:
            tree = project.tree(path)
            # An entry point: a ``__main__`` block, or a module-level script that calls the
            # project's functions when it runs (``engine.train(model, loader, ...)``).
            guarded = tree is not None and (
                any(_is_main_guard(stmt) for stmt in tree.body)
                or _calls_project_at_top(project, path, tree)
            )
            direct = imported.get(path, [])
            for target in reachable_modules(imported, path) if guarded else ():
                if target in direct and not project.runs_training_of(path, target) and not any(
                    target in reachable_modules(imported, other) for other in direct
                    if other != target
                ):
                    continue  # only its evaluator (say) is used: its training is not run here
                if (
                    probes[target].library and target in written
                    and target not in starts.setdefault(path, [])
                ):
                    starts[path].append(target)

    # Which project functions feed which training loops.
    feeds: dict[Path, list[LoaderFeed]] = {}
    wanted: dict[Path, list[tuple[str, Path, str, int | None]]] = {}
    for path, probe in probes.items():
        for call in probe.calls:
            producer, function = call.target
            if producer == path:
                continue
            feed = LoaderFeed(function, call.index, f"{shown[path]}:{call.line}")
            if feed not in feeds.setdefault(producer, []):
                feeds[producer].append(feed)
            wanted.setdefault(path, []).append((call.callee, producer, function, call.index))

    # What the modules that build those loaders do with them.
    exports: dict[Path, dict[tuple[str, int | None], tuple[int, bool, bool]]] = {}
    for producer, its_feeds in feeds.items():
        facts = ModuleFacts(feeds=tuple(its_feeds))
        found = project_exports(contents[producer], replace(options, project=facts))
        exports[producer] = {(e.function, e.index): (e.line, e.shuffles, e.already) for e in found}

    entries = {p: set(reachable_modules(imported, p)) for p in written
               if p in probes and (probes[p].script or starts.get(p))}
    chosen: dict[Path, Options] = {}
    for path in written:
        if path not in contents:
            continue
        sources = []
        for callee, producer, function, index in wanted.get(path, ()):
            line, shuffles, already = exports.get(producer, {}).get(
                (function, index), (0, False, False)
            )
            if not line:
                continue  # not sharded there (that module's report says why)
            sharded = already or producer in written
            source = ShardedSource(callee, index, f"{shown[producer]}:{line}", shuffles, sharded)
            if source not in sources:
                sources.append(source)
        runs = starts.get(path, [])
        importers = [p for p in entries if path in entries[p]]
        facts = ModuleFacts(
            tuple(feeds.get(path, ())), tuple(sources),
            starts=tuple(shown[p] for p in runs),
            started_by=tuple(shown[p] for p, its in starts.items() if path in its),
            framework=probes[runs[0]].framework if runs else (
                probes[importers[0]].framework if importers else None),
            helper=bool(importers),
            attribute_defaults=_attribute_defaults(project, path, imported, shown)
            if _DISTRIBUTES.search(contents[path]) else (),
            **_called_facts(project, path, shown, probes[path].called),
        )
        chosen[path] = replace(options, project=facts)
    chosen.update(_notebook_options(files, options, project, contents, shown))
    return chosen


def _called_facts(project: Project, path: Path, shown: dict[Path, str],
                  called: Sequence[str]) -> dict:
    """What the project functions and classes ``path`` calls (``called``, as it spells them)
    do: writing callbacks, helpers and handles, helpers that reach a collective, classes that
    step an optimizer; and the names its star imports of project modules bring in."""
    targets = [(q, t) for q in called
               if (t := project.resolve(path, q)) is not None and t[0] != path]
    return {
        "rank0_callbacks": tuple(q for q, t in targets if project.writing_callback(*t)),
        "writers": tuple(q for q, t in targets if project.writing_function(*t)),
        "handles": tuple(q for q, t in targets if project.writing_class(*t)),
        "collective_helpers": tuple((q, *found) for q, t in targets
                                    if (found := project.collective_function(*t)) is not None),
        "optimizer_wrappers": tuple((q, shown[t[0]], methods, project.sets_lr(*t))
                                    for q, t in targets
                                    if (methods := project.stepping_methods(*t))),
        "star_names": tuple(sorted(project.star_names(path).items())),
    }


def _notebook_options(files: Sequence[tuple[Path, str]], options: Options, project: Project,
                      contents: dict[Path, bytes], shown: dict[Path, str]) -> dict[Path, Options]:
    """The options of each notebook of the run that imports project modules: a notebook is no
    project module, but its cells are a program that calls the project's functions and classes
    (``from model import *``; a writing callback, a helper that saves), as a script does."""
    from .files import read_regular
    from .notebook import notebook_program
    from .siblings import resolver

    resolve = resolver()
    chosen: dict[Path, Options] = {}
    for path, _ in files:
        if path.suffix != ".ipynb":
            continue
        try:
            data = read_regular(path)
        except OSError:
            continue
        program = notebook_program(data) if data is not None else None
        if program is None:
            continue
        # Under a name no import can spell (``train.ipynb.py``: module ``train.ipynb``).
        key = resolve(path).with_name(path.name + ".py")
        with_notebook = Project({**contents, key: program[0].encode()})
        if not imported_modules(with_notebook, key):
            continue
        probe = probe_module(program[0].encode(), options,
                             functools.partial(with_notebook.resolve, key),
                             functools.partial(_stepping, with_notebook, key), entry=True)
        facts = ModuleFacts(framework=probe.framework,
                            **_called_facts(with_notebook, key, shown, probe.called))
        chosen[resolve(path)] = replace(options, project=facts)
    return chosen


#: What a module that distributes itself shows (``program.launch`` reads its switch's default).
_DISTRIBUTES = re.compile(rb"init_process_group|DistributedDataParallel|tf\.distribute|Strategy")


def _attribute_defaults(project: Project, path: Path, imported: dict[Path, list[Path]],
                        shown: dict[Path, str]) -> tuple[tuple[str, str, str], ...]:
    """``ModuleFacts.attribute_defaults`` of ``path``: what the modules it imports set."""
    found: dict[str, tuple[str, str]] = {}
    twice: set[str] = set()
    for module in reachable_modules(imported, path):
        for key, (value, line) in project.attribute_literals(module).items():
            if key in found and found[key][0] != value:
                twice.add(key)
            found.setdefault(key, (value, f"{shown[module]}:{line}"))
    return tuple(sorted((k, v, where) for k, (v, where) in found.items() if k not in twice))


def _stepping(project: Project, path: Path, qualified: str) -> tuple[str, ...]:
    """The methods that step an optimizer of the project class ``qualified`` names in ``path``."""
    target = project.resolve(path, qualified)
    return project.stepping_methods(*target) if target is not None else ()


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No garbage collection inside: while every module's ``ast`` is parsed (and kept, 1,000 of
    them in a pre-commit run), the collector, set off again and again by those allocations,
    went through them all each time and found nothing to free (40% of the parsing)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _calls_project_at_top(project: Project, path: Path, tree: ast.Module) -> bool:
    """Whether module-level code of ``path`` calls a function another project module
    defines (``engine.train(...)``, or ``train(...)`` after ``from engine import train``)."""
    local: dict[str, str] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module is not None:
            prefix = "." * stmt.level + stmt.module + "."
            local.update({a.asname or a.name: prefix + a.name for a in stmt.names})
        elif isinstance(stmt, ast.Import):
            local.update({a.asname: a.name for a in stmt.names if a.asname})
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import,
                             ast.ImportFrom)):
            continue
        for node in ast.walk(stmt):
            if not isinstance(node, ast.Call):
                continue
            parts: list[str] = []
            func: ast.expr = node.func
            while isinstance(func, ast.Attribute):
                parts.append(func.attr)
                func = func.value
            if not isinstance(func, ast.Name):
                continue
            qualified = ".".join([local.get(func.id, func.id), *reversed(parts)])
            target = project.resolve(path, qualified)
            if target is not None and target[0] != path:
                return True
    return False


def _is_main_guard(stmt: ast.stmt) -> bool:
    test = stmt.test if isinstance(stmt, ast.If) else None
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )
