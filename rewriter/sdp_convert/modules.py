"""The modules of a run and the imports between them, read with ``ast`` alone (no libcst).

``Project`` resolves a qualified name as one file spells it (``data.get_loaders``,
``.data.get_loaders``, ``pkg.get_loaders`` through a package ``__init__`` that re-exports it) to
the file and top-level name that define it; ``imported_modules`` lists the other modules of the
run a module imports; ``CollectiveReach`` what the code of one module runs that every rank must
run together. Project mode plans with them, and the whole-program contract
(``contract``) follows the imports of a converted program with them, also in a warm run that
answers every file from the cache and loads no libcst.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .program.vocab import WRITING_KERAS_CALLBACKS
from .siblings import is_package_folder

# -- import resolution -------------------------------------------------------------------------


@dataclass
class Project:
    """The Python files of one run, by module name, and the names their packages re-export."""

    files: Mapping[Path, bytes]
    _modules: dict[str, Path] = field(default_factory=dict)
    _names: dict[Path, str] = field(default_factory=dict)
    _trees: dict[Path, ast.Module | None] = field(default_factory=dict)
    _literals: dict[Path, dict[str, tuple[str, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seen: dict[str, list[Path]] = {}
        for path in self.files:
            name = module_name(path)
            self._names[path] = name
            seen.setdefault(name, []).append(path)
        # Two files that would be the same module (two scripts' folders): neither is resolved.
        self._modules = {name: paths[0] for name, paths in seen.items() if len(paths) == 1}
        # Folders without ``__init__.py`` are namespace packages to a script run above them
        # (``from core.dataset import Dataset`` in train.py next to core/): a file is also its
        # dotted path below the run's top folder, where no real module has that name.
        aliases: dict[str, list[Path]] = {}
        for path, name in namespace_names(self.files):
            if name not in seen:
                aliases.setdefault(name, []).append(path)
        self._modules.update({n: ps[0] for n, ps in aliases.items() if len(ps) == 1})

    def name_of(self, path: Path) -> str:
        return self._names[path]

    def resolve(self, path: Path, qualified: str) -> tuple[Path, str] | None:
        """The file and top-level name that ``qualified`` (as ``path`` spells it) refers to."""
        absolute = self._absolute(path, qualified)
        return self._lookup(absolute, 0) if absolute else None

    def module_file(self, path: Path, qualified: str) -> Path | None:
        """The file of the module ``qualified`` names (``pkg.trainer.__module__`` or
        ``.trainer.__module__``: the suffix marks a module, not a name in it)."""
        absolute = self._absolute(path, qualified.removesuffix(".__module__"))
        if absolute is None:
            return None
        return self._modules.get(absolute) or self._modules.get(absolute + ".__init__")

    def _absolute(self, path: Path, qualified: str) -> str | None:
        level = len(qualified) - len(qualified.lstrip("."))
        if not level:
            return qualified
        package = self._names[path].split(".")
        if path.name != "__init__.py":
            package = package[:-1]
        if level - 1 > len(package) or (level > 1 and level - 1 == len(package)):
            return None
        base = package[: len(package) - (level - 1)]
        return ".".join([*base, qualified[level:]]) if base else qualified[level:]

    def _lookup(self, absolute: str, depth: int) -> tuple[Path, str] | None:
        parts = absolute.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module = self._modules.get(".".join(parts[:cut]))
            if module is None:
                continue
            rest = parts[cut:]
            if len(rest) != 1:
                return None
            return self._definition(module, rest[0], depth)
        return None

    def _definition(self, module: Path, name: str, depth: int) -> tuple[Path, str] | None:
        tree = self.tree(module)
        if tree is None:
            return None
        for stmt in reversed(tree.body):  # the last top-level binding wins
            if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)) and stmt.name == name:
                return module, name
            if isinstance(stmt, ast.ImportFrom) and depth < 5:
                if stmt.names[0].name == "*":  # a package's ``from .base_trainer import *``
                    absolute = self._absolute(module, "." * stmt.level + (stmt.module or ""))
                    found = self._lookup(f"{absolute}.{name}", depth + 1) if absolute else None
                    if found is not None:
                        return found
                    continue
                for alias in stmt.names:
                    if (alias.asname or alias.name) != name or stmt.module is None:
                        continue
                    source = "." * stmt.level + stmt.module + "." + alias.name
                    absolute = self._absolute(module, source)
                    return self._lookup(absolute, depth + 1) if absolute else None
            if _binds(stmt, name):
                return None  # assigned some other way: not followed
        return None

    def star_names(self, path: Path, depth: int = 0) -> dict[str, str]:
        """The names ``path``'s star imports of project modules (``from model import *``) bring
        from outside the project, with their qualified names there (``ModelCheckpoint`` ->
        ``keras.callbacks.ModelCheckpoint``, ``np`` -> ``numpy``): what the file's own names
        cannot show. Names the project module defines itself are followed by the run
        (``program.run``), not here; a module with ``__all__`` gives only what it lists."""
        tree = self.tree(path)
        found: dict[str, str] = {}
        if tree is None or depth > 3:
            return found
        for stmt in tree.body:
            if not (isinstance(stmt, ast.ImportFrom) and stmt.names[0].name == "*"):
                continue
            absolute = self._absolute(path, "." * stmt.level + (stmt.module or ""))
            module = self._modules.get(absolute or "") or self._modules.get(
                f"{absolute}.__init__")
            if module is not None and module != path:
                found.update(self._exported_imports(module, depth))
        return found

    def _exported_imports(self, module: Path, depth: int) -> dict[str, str]:
        tree = self.tree(module)
        if tree is None:
            return {}
        listed: set[str] | None = None
        names: dict[str, str] = dict(self.star_names(module, depth + 1))
        for stmt in tree.body:
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname:
                        names[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        names[top] = top
            elif isinstance(stmt, ast.ImportFrom) and stmt.names[0].name != "*":
                source = "." * stmt.level + (stmt.module or "")
                absolute = self._absolute(module, source)
                for alias in stmt.names:
                    bound = alias.asname or alias.name
                    parts = f"{absolute}.{alias.name}".split(".")
                    inside = absolute is None or stmt.level or any(
                        ".".join(parts[:cut]) in self._modules for cut in range(1, len(parts) + 1))
                    if inside:  # the project's own (the run follows it) or unknown
                        names.pop(bound, None)
                    else:
                        names[bound] = f"{absolute}.{alias.name}"
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.pop(stmt.name, None)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target in targets:
                    for node in ast.walk(target):
                        if isinstance(node, ast.Name):
                            names.pop(node.id, None)
                            if node.id == "__all__" and isinstance(
                                stmt.value, (ast.List, ast.Tuple)
                            ):
                                listed = {e.value for e in stmt.value.elts
                                          if isinstance(e, ast.Constant)
                                          and isinstance(e.value, str)}
        return {n: q for n, q in names.items() if not n.startswith("_") and (
            listed is None or n in listed)}

    def writing_callback(self, path: Path, name: str) -> bool:
        """Whether ``name`` is a Keras callback class of ``path`` that writes files (it opens a
        file to write or append, or saves: ``open(p, "a")``, ``model.save(...)``, ...)."""
        tree = self.tree(path)
        cls = next((s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == name),
                   None) if tree is not None else None
        if cls is None:
            return False
        if any(_name_of(b) in WRITING_KERAS_CALLBACKS for b in cls.bases):
            return True  # ``CustomModelCheckpoint(ModelCheckpoint)``: writes as its base does
        if not any(_name_of(b).endswith("Callback") for b in cls.bases):
            return False
        return any(_writes(node) for node in ast.walk(cls))

    def writing_function(self, path: Path, name: str) -> bool:
        """Whether ``name`` is a module-level function of ``path`` that writes files
        (``save_checkpoint(model, path)`` around ``torch.save``) and that rank 0 may run alone
        (its callers' calls of it go under ``if rank == 0:``): not one that runs what it is
        handed (``model(x)``: the forward of a wrapped model waits for every rank) or reaches a
        collective (``inserted.CollectiveReach``); such a helper runs on every rank, and the
        write inside it is what must be on rank 0 only."""
        found = self._function(path, name)
        if found is None or not any(_writes(node) for node in ast.walk(found[1])):
            return False
        return self.collective_function(path, name) is None

    def collective_function(self, path: Path, name: str) -> tuple[tuple[str, ...], bool] | None:
        """Whether ``name``, a module-level function of ``path``, runs what every rank must run
        together (``CollectiveReach``): the calls on the way when each parameter holds a wrapped
        model (``validation(model, ...)`` running ``model(...)``), and whether it reaches one
        with none handed to it (a barrier); None when it reaches none."""
        found = self._function(path, name)
        if found is None:
            return None
        tree, function = found
        handed = {a.arg for a in [*function.args.posonlyargs, *function.args.args,
                                  *function.args.kwonlyargs]}
        reach = CollectiveReach(tree)
        calls = reach.body(function, handed)
        if calls is None:
            return None
        return calls, reach.body(function, reach.wrapped - handed) is not None

    def _function(self, path: Path, name: str) -> tuple[ast.Module, ast.FunctionDef] | None:
        """The module-level function ``name`` of ``path``, with the module's tree."""
        tree = self.tree(path)
        function = next((s for s in tree.body if isinstance(s, ast.FunctionDef)
                         and s.name == name), None) if tree is not None else None
        return (tree, function) if tree is not None and function is not None else None

    def writing_class(self, path: Path, name: str) -> bool:
        """Whether ``name`` is a class of ``path`` (no Keras callback) whose ``__init__`` opens
        a file to write or append (``self.fh = open(path, "a")``): its instances write as they
        are used, like an open file."""
        tree = self.tree(path)
        cls = next((s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == name),
                   None) if tree is not None else None
        if cls is None or any(_name_of(b).endswith("Callback") for b in cls.bases):
            return False
        init = next((s for s in cls.body if isinstance(s, ast.FunctionDef)
                     and s.name == "__init__"), None)
        # Kept on the instance (``self.fh = open(...)``): one opened and closed inside
        # ``__init__`` (``with open(log, "a") as f: f.write(...)``) writes once, at construction,
        # where its own module's conversion guards it; the instance holds no file.
        kept = [n.value for n in ast.walk(init) if isinstance(n, ast.Assign) and any(
            isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
            for t in n.targets)] if init is not None else []
        return any(
            _writes(n) and _name_of(n.func) in ("open", "FileHandler")  # type: ignore[attr-defined]
            for value in kept for n in ast.walk(value))
    def stepping_methods(self, path: Path, name: str) -> tuple[str, ...]:
        """The methods of ``name``, a class of ``path`` that holds an optimizer, that step it:
        ``ScheduledOptim`` whose ``__init__`` keeps its ``optimizer`` parameter as
        ``self._optimizer`` and whose ``step_and_update_lr()`` calls ``self._optimizer.step()``.
        Empty for anything else."""
        tree = self.tree(path)
        cls = next((s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == name),
                   None) if tree is not None else None
        if cls is None:
            return ()
        methods = {s.name: s for s in cls.body if isinstance(s, ast.FunctionDef)}
        init = methods.get("__init__")
        if init is None:
            return ()
        params = {a.arg for a in init.args.args[1:] + init.args.kwonlyargs}
        held = {
            target.attr
            for node in ast.walk(init) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Name) and node.value.id in params
            for target in node.targets
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
            and target.value.id == "self"
        }
        return tuple(
            method for method, function in methods.items()
            if method != "__init__" and any(
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "step" and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr in held
                and isinstance(node.func.value.value, ast.Name)
                and node.func.value.value.id == "self"
                for node in ast.walk(function)
            )
        )

    def sets_lr(self, path: Path, name: str) -> bool:
        """Whether the class ``name`` of ``path`` writes a learning rate into parameter groups
        (``param_group["lr"] = lr``)."""
        tree = self.tree(path)
        cls = next((s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == name),
                   None) if tree is not None else None
        return cls is not None and any(
            isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                and t.slice.value == "lr" for t in node.targets)
            for node in ast.walk(cls)
        )

    def runs_training_of(self, path: Path, target: Path) -> bool:
        """Whether what ``path`` imports from ``target`` may run ``target``'s training: it does
        unless every import of it names functions or classes of ``target`` (``from
        model_runners import Evaluator``) whose code, with the functions and classes of
        ``target`` it names followed, calls no training method (``backward``, ``step``,
        ``apply_gradients``, ``fit``, ...) and whose bases are no classes of other project
        modules. A module import, a star import or anything not followed: it may."""
        tree, target_tree = self.tree(path), self.tree(target)
        if tree is None or target_tree is None:
            return True
        names: set[str] = set()
        for name in import_names(tree):
            found = self.resolve(path, name)
            if found is None and self.module_file(path, name) == target:
                return True  # the module itself
            if found is not None and found[0] == target:
                names.add(found[1])
        defs = {node.name: node for node in target_tree.body
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
        todo, seen = sorted(names), set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            node = defs.get(name)
            if node is None:
                return True
            if isinstance(node, ast.ClassDef) and any(
                (found := self.resolve(target, ast.unparse(base))) is not None
                and found[0] != target for base in node.bases
            ):
                return True  # a base of another module: its code is not read here
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and (
                    sub.func.attr in _TRAINING_METHODS
                ):
                    return True
                if isinstance(sub, ast.Name) and sub.id in defs:
                    todo.append(sub.id)
        return not names

    def attribute_literals(self, path: Path) -> dict[str, tuple[str, int]]:
        """The attributes of configuration objects ``path`` sets to a literal at its top level
        (``config.train.distributed = False``): the attribute path less its root
        (``train.distributed``) -> (the value as code, its line); one set twice to different
        values is left out."""
        if path in self._literals:
            return self._literals[path]
        tree = self.tree(path)
        found: dict[str, tuple[str, int]] = {}
        twice: set[str] = set()
        for stmt in tree.body if tree is not None else ():
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Attribute)
                    and isinstance(stmt.value, ast.Constant)):
                continue
            dotted = ast.unparse(stmt.targets[0])
            if not re.fullmatch(r"\w+(\.\w+)+", dotted):
                continue
            key = dotted.split(".", 1)[1]
            value = repr(stmt.value.value)
            if key in found and found[key][0] != value:
                twice.add(key)
            found.setdefault(key, (value, stmt.lineno))
        self._literals[path] = {k: v for k, v in found.items() if k not in twice}
        return self._literals[path]

    def tree(self, path: Path) -> ast.Module | None:
        """The ``ast`` of a file (parsed once; None if it does not parse)."""
        if path not in self._trees:
            try:
                self._trees[path] = ast.parse(self.files[path])
            except (SyntaxError, ValueError, RecursionError, MemoryError):  # not parsed
                self._trees[path] = None
        return self._trees[path]


#: Methods whose call trains a model (``Project.runs_training_of``).
_TRAINING_METHODS = frozenset({"backward", "step", "apply_gradients", "minimize", "fit",
                               "fit_generator", "train_on_batch", "train"})


#: Methods and functions that write files (``program.writes`` holds the full vocabulary, by
#: qualified name; a callback class in another module is read with ``ast``, names only).
_WRITING_CALLS = frozenset({"save", "save_weights", "savez", "savetxt", "to_csv", "dump",
                            "write_text", "write_bytes", "imwrite", "savefig", "to_pickle",
                            "imsave", "save_image", "save_pretrained", "FileHandler"})


def _name_of(expr: ast.expr) -> str:
    return expr.attr if isinstance(expr, ast.Attribute) else getattr(expr, "id", "")


def _writes(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    name = _name_of(node.func)
    if name == "open" and isinstance(node.func, ast.Name):
        modes = [a for a in node.args[1:2]] + [k.value for k in node.keywords if k.arg == "mode"]
        return any(
            isinstance(m, ast.Constant) and isinstance(m.value, str) and set(m.value) & set("wax")
            for m in modes
        )
    return name in _WRITING_CALLS


def _binds(stmt: ast.stmt, name: str) -> bool:
    targets: Iterable[ast.expr] = ()
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        targets = (stmt.target,)
    return any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t))


def module_name(path: Path) -> str:
    """``src/pkg/data.py`` -> ``pkg.data`` when ``src/pkg`` holds an ``__init__.py``."""
    parts = [path.stem] if path.name != "__init__.py" else []
    folder = path.parent
    while is_package_folder(folder) and folder.name:
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts) or path.parent.name


def namespace_names(files: Iterable[Path]) -> Iterator[tuple[Path, str]]:
    """Each file's names as a module of namespace packages: ``core/dataset.py`` below the
    run's top folder is ``core.dataset`` (and ``a/b/c.py`` both ``b.c`` and ``a.b.c``)."""
    paths = [p for p in files if p.suffix == ".py" and p.name != "__init__.py"]
    if len(paths) < 2:
        return
    top = Path(os.path.commonpath([str(p.parent) for p in paths]))
    for path in paths:
        try:
            parts = [*path.parent.relative_to(top).parts, path.stem]
        except ValueError:
            continue
        if not all(p.isidentifier() for p in parts):
            continue
        for start in range(len(parts) - 1):
            yield path, ".".join(parts[start:])


def imported_modules(project: Project, path: Path) -> list[Path]:
    """The other project modules ``path`` imports (or imports names from)."""
    tree = project.tree(path)
    return resolve_imports(project, path, import_names(tree)) if tree is not None else []


def import_names(tree: ast.Module) -> list[str]:
    """What the imports of ``tree`` name, as written: ``.data.get_loaders`` for ``from .data
    import get_loaders``, ``utils.__module__`` for ``import utils`` (the suffix marks a module)."""
    names: list[str] = []
    for node in _statements(tree):
        if isinstance(node, ast.ImportFrom):
            prefix = "." * node.level + (node.module + "." if node.module else "")
            if node.module and [a.name for a in node.names] == ["*"]:
                names.append(prefix + "__module__")  # ``from utils import *``: the module itself
            else:
                names += [prefix + alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            names += [alias.name + ".__module__" for alias in node.names]
    return names


def resolve_imports(project: Project, path: Path, names: Iterable[str]) -> list[Path]:
    """The other project modules among ``names`` (``import_names`` of ``path``)."""
    found: list[Path] = []
    for name in names:
        target = project.resolve(path, name) or project.module_file(path, name)
        module = target if isinstance(target, Path) or target is None else target[0]
        if module is not None and module != path and module not in found:
            found.append(module)
    return found


#: The fields of a node that hold statements (or the except clauses and cases that hold some).
_BODIES = frozenset({"body", "orelse", "finalbody", "handlers", "cases"})


def _statements(tree: ast.Module) -> Iterator[ast.AST]:
    """The statements of ``tree`` at any depth (with the except clauses and match cases that
    hold some), in ``ast.walk``'s order: what ``ast.walk`` gives, less the expressions, which
    never hold a statement (an import) and are most of a module's nodes."""
    todo: list[ast.AST] = [tree]
    for node in todo:  # breadth first, as ast.walk
        for name in node._fields:
            if name in _BODIES:
                todo.extend(getattr(node, name))
        yield node


def reachable_modules(imported: Mapping[Path, list[Path]], path: Path) -> list[Path]:
    """The project modules ``path`` imports, directly or through other project modules
    (``main`` -> ``runner`` -> ``trainer``): an entry point runs the training code of each."""
    found: list[Path] = []
    todo = list(imported.get(path, ()))
    while todo:
        module = todo.pop(0)
        if module == path or module in found:
            continue
        found.append(module)
        todo.extend(imported.get(module, ()))
    return found


# -- what every rank must run together ------------------------------------------------------------

#: The collectives of the distributed libraries, by their last name.
COLLECTIVE = re.compile(
    r"^(barrier|broadcast\w*|allreduce\w*|allgather\w*|alltoall\w*|rank0_first)$"
)


class CollectiveReach:
    """What every rank must run together, read with ``ast`` from one module: a collective of a
    distributed library (a barrier, a broadcast, an allreduce), a ``DistributedDataParallel``'s
    forward (it syncs buffers and may reduce), or a call of a function of the module that leads
    to one, 4 calls deep, the wrapped models handed to it followed into its parameters. The
    inserted-code check (``inserted``) asks it of what the conversion put under a rank test, and
    project mode (``Project.writing_function``) of another module's helpers before moving a call
    of one onto rank 0. (``program.ranks.reaches_collective`` answers it for the transforms.)"""

    def __init__(self, tree: ast.Module,
                 helpers: Iterable[tuple[str, tuple[str, ...], bool]] = ()) -> None:
        self.libraries = distributed_aliases(tree)
        #: Functions of other modules that reach one (``ModuleFacts.collective_helpers``), by
        #: the code that calls them here (``validation`` after ``from test import validation``).
        self.helpers = {spelled: (path, always) for name, path, always in helpers
                        for spelled in _spellings(tree, name)}
        self.functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        for node in module_nodes(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.functions.setdefault(node.name, []).append(node)
        #: The code of what holds a wrapped model (``model``, ``self.net``).
        self.wrapped = {
            ast.unparse(target) for node in module_nodes(tree) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call) and call_name(node.value.func) in _WRAPPERS
            for target in node.targets if isinstance(target, ast.Name | ast.Attribute)
        }

    def call(self, call: ast.Call, models: set[str], depth: int = 0,
             seen: frozenset[int] = frozenset()) -> tuple[str, ...] | None:
        """The calls from ``call`` to the first collective it reaches (``("evaluate(...)",
        "model(...)")``), with ``models`` the code of what holds a wrapped model; None if none."""
        func = ast.unparse(call.func)
        if func in models or (
            COLLECTIVE.match(call_name(call.func)) and root_name(call.func) in self.libraries
        ):
            return (f"{func}(...)",)
        outside = self.helpers.get(func)
        if outside is not None and (outside[1] or any(
            ast.unparse(a) in models for a in [*call.args, *(k.value for k in call.keywords)]
        )):
            return (f"{func}(...)", *outside[0])
        if depth >= 4:
            return None
        for function in self._callees(call):
            if id(function) in seen:
                continue
            found = self.body(function, self._handed(function, call, models), depth + 1,
                              seen | {id(function)})
            if found is not None:
                return (f"{func}(...)", *found)
        return None

    def body(self, function: ast.AST, models: set[str], depth: int = 0,
             seen: frozenset[int] = frozenset()) -> tuple[str, ...] | None:
        """The first collective the code of ``function`` (a def, or any node) reaches when it
        runs (not the functions, lambdas and classes it defines, which run later)."""
        nodes = [n for stmt in getattr(function, "body", [function]) for n in _walk_here(stmt)]
        for node in sorted((n for n in nodes if isinstance(n, ast.Call)),
                           key=lambda n: (n.lineno, n.col_offset)):
            found = self.call(node, models, depth, seen)
            if found is not None:
                return found
        return None

    def _callees(self, call: ast.Call) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        """``f(...)`` and ``self.m(...)``: the functions of the module of that name."""
        func = call.func
        if isinstance(func, ast.Name) or (
            isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
            and func.value.id == "self"
        ):
            return self.functions.get(call_name(func), [])
        return []

    @staticmethod
    def _handed(function: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call,
                models: set[str]) -> set[str]:
        """What holds a wrapped model inside ``function`` when ``call`` runs it: the parameters
        given one, ``self.`` attributes, and the outer names no parameter hides."""
        params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
        if params and params[0] in ("self", "cls") and isinstance(call.func, ast.Attribute):
            params = params[1:]
        inner = {m for m in models if m.startswith("self.")}
        inner |= models - {*params, *(a.arg for a in function.args.kwonlyargs)}
        for position, arg in enumerate(call.args):
            if position < len(params) and ast.unparse(arg) in models:
                inner.add(params[position])
        for keyword in call.keywords:
            if keyword.arg is not None and ast.unparse(keyword.value) in models:
                inner.add(keyword.arg)
        return inner


#: Wrappers whose forward every rank must run together.
_WRAPPERS = frozenset({"DistributedDataParallel"})


def _walk_here(node: ast.AST) -> list[ast.AST]:
    """The nodes of ``node`` that run with it (not the bodies of the functions, lambdas and
    classes it defines)."""
    found: list[ast.AST] = []
    todo = [node]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(child for child in ast.iter_child_nodes(current) if not isinstance(
            child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda))
    return found


def _spellings(tree: ast.Module, qualified: str) -> set[str]:
    """How the module ``tree`` calls what ``qualified`` names (``test.validation``):
    ``validation`` after ``from test import validation``, ``t.validation`` after ``import test as
    t``, ``test.validation`` after ``import test``."""
    found: set[str] = set()
    for node in module_nodes(tree):
        if isinstance(node, ast.ImportFrom):
            source = "." * node.level + (node.module or "")
            for alias in node.names:
                full = f"{source}.{alias.name}" if node.module else f"{source}{alias.name}"
                if full == qualified:
                    found.add(alias.asname or alias.name)
                elif qualified.startswith(full + "."):
                    found.add((alias.asname or alias.name) + qualified[len(full):])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if qualified.startswith(alias.name + "."):
                    found.add((alias.asname or alias.name) + qualified[len(alias.name):]
                              if alias.asname else qualified)
    return found


def call_name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


#: Libraries whose module-level functions are collectives.
_DISTRIBUTED = ("sdp_runtime", "torch.distributed", "horovod", "smdistributed")


def module_nodes(tree: ast.Module) -> list[ast.AST]:
    """``list(ast.walk(tree))``, walked once per tree (the checks of a conversion ask many
    questions of the same two trees; each walk of a long file costs as much as a question)."""
    nodes = getattr(tree, "_sdp_nodes", None)
    if nodes is None:
        nodes = list(ast.walk(tree))
        tree._sdp_nodes = nodes  # type: ignore[attr-defined]
    return nodes


def distributed_aliases(tree: ast.Module) -> set[str]:
    """Local names of the distributed libraries' modules and functions (``sdp``, ``dist``,
    ``hvd``, ``barrier`` from ``from sdp_runtime.torch import barrier``)."""
    names: set[str] = set()
    for node in module_nodes(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names
                      if a.name.startswith(_DISTRIBUTED)}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(_DISTRIBUTED):
            names |= {a.asname or a.name for a in node.names}
    return names


def root_name(func: ast.expr) -> str:
    while isinstance(func, ast.Attribute):
        func = func.value
    return func.id if isinstance(func, ast.Name) else ""
