"""Deleting files and directories: which calls delete, what runs on rank 0 with them, and whether
every rank can wait for the deletion right after it.

``is_deletion`` answers for ``shutil.rmtree``, ``os.remove``/``unlink``/``rmdir``/``removedirs``,
``tf.io.gfile.rmtree``/``remove`` and ``<pathlib.Path>.unlink()``/``.rmdir()``.

``deletion_unit`` gives the statement to run on rank 0 only for a deletion, and whether a barrier
may follow it. A deletion under a test or a loop that reads the file system
(``if os.path.exists(d): shutil.rmtree(d)``, ``for f in glob(...): os.remove(f)``) goes to rank 0
with that test or loop: another rank would read the file system while rank 0 deletes and could take
the other branch, or loop over fewer files. The barrier (every rank waits until the deletion is
done, so no rank reads or writes the path before it) may follow only where every rank gets to it
the same way: not inside a loop, an ``except`` or a ``finally`` (of its function, or around a call
of its function), nor under a file-system test that could not go to rank 0 with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .scopes import assigned_values, binding_of, callers, uses
from .syntax import findall, target_names

if TYPE_CHECKING:
    from .model import FileModel

#: Calls deleting a file or a directory tree.
DELETIONS = (
    "shutil.rmtree",
    "os.remove",
    "os.unlink",
    "os.rmdir",
    "os.removedirs",
    "tensorflow.io.gfile.rmtree",
    "tensorflow.io.gfile.remove",
)

#: Methods of ``pathlib.Path`` that delete.
PATH_DELETIONS = ("unlink", "rmdir")

#: What makes a ``pathlib`` path.
PATHS = ("pathlib.Path", "pathlib.PurePath", "pathlib.PosixPath")

#: Calls whose answer depends on what is on disk now.
FILE_SYSTEM_READS = (
    "os.path.exists",
    "os.path.isdir",
    "os.path.isfile",
    "os.path.lexists",
    "os.listdir",
    "os.scandir",
    "os.walk",
    "glob.glob",
    "glob.iglob",
    "tensorflow.io.gfile.exists",
    "tensorflow.io.gfile.isdir",
    "tensorflow.io.gfile.listdir",
    "tensorflow.io.gfile.glob",
    "tensorflow.io.gfile.walk",
)

#: ``<path>.<method>()`` reading the file system.
PATH_READS = ("exists", "is_dir", "is_file", "iterdir", "glob", "rglob")


def is_deletion(fm: FileModel, call: cst.Call) -> bool:
    """``call`` deletes a file or directory (see the module docstring)."""
    if fm.refers_to(call.func, *DELETIONS):
        return True
    return (
        isinstance(call.func, cst.Attribute)
        and call.func.attr.value in PATH_DELETIONS
        and is_path(fm, call.func.value)
    )


def path_deletions(fm: FileModel) -> list[cst.Call]:
    """``<path>.unlink()`` / ``<path>.rmdir()`` of a ``pathlib`` path made in this file."""
    return [
        call
        for method in PATH_DELETIONS
        for call in fm.method_calls(method)
        if is_deletion(fm, call)
    ]


def is_path(fm: FileModel, expr: cst.BaseExpression, depth: int = 0) -> bool:
    """``expr`` is a ``pathlib`` path: ``Path(p)``, ``Path(p) / "x"``, ``Path(p).with_suffix(s)``,
    or a name only ever assigned one."""
    if depth > 3:
        return False
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Divide):
        return is_path(fm, expr.left, depth + 1)
    if isinstance(expr, cst.Call):
        if fm.refers_to(expr.func, *PATHS):
            return True
        return isinstance(expr.func, cst.Attribute) and is_path(fm, expr.func.value, depth + 1)
    if isinstance(expr, cst.Name):
        values = assigned_values(fm, expr)
        return bool(values) and all(is_path(fm, v, depth + 1) for v in values)
    return False


def reads_file_system(fm: FileModel, expr: cst.CSTNode) -> bool:
    """``expr`` (a test or a loop's iterable) asks the file system what is there now."""
    for call in findall(expr, m.Call()):
        assert isinstance(call, cst.Call)
        if fm.refers_to(call.func, *FILE_SYSTEM_READS):
            return True
        if (
            isinstance(call.func, cst.Attribute)
            and call.func.attr.value in PATH_READS
            and is_path(fm, call.func.value)
        ):
            return True
    return False


def deletion_unit(fm: FileModel, stmt: cst.BaseStatement) -> tuple[cst.BaseStatement, bool]:
    """``(statement to run on rank 0, whether a barrier may follow it)`` for the statement
    ``stmt`` that holds a deletion (see the module docstring)."""
    unit = stmt
    uniform = True
    child: cst.CSTNode = stmt
    for parent in fm.ancestors(stmt):
        if isinstance(parent, cst.FunctionDef):
            uniform = uniform and _called_alike(fm, parent, 0)
            break
        if isinstance(parent, (cst.ClassDef, cst.Lambda, cst.Module)):
            break
        header = _header(parent, child)
        if header is not None and reads_file_system(fm, header):
            if _movable(fm, parent):
                unit, uniform = parent, True  # type: ignore[assignment]
            else:
                uniform = False
        elif isinstance(parent, (cst.For, cst.While, cst.ExceptHandler, cst.Finally)):
            uniform = False
        child = parent
    return unit, uniform


def _called_alike(fm: FileModel, function: cst.FunctionDef, depth: int) -> bool:
    """Every call of ``function`` (and of the functions calling it) is outside loops, ``except``
    and ``finally``: where it runs, every rank runs it the same number of times."""
    if depth > 3:
        return False
    for call in callers(fm, function):
        for parent in fm.ancestors(call):
            if isinstance(parent, (cst.For, cst.While, cst.ExceptHandler, cst.Finally, cst.Lambda)):
                return False
            if isinstance(parent, cst.FunctionDef):
                if not _called_alike(fm, parent, depth + 1):
                    return False
                break
    return True


def _header(compound: cst.CSTNode, child: cst.CSTNode) -> cst.CSTNode | None:
    """The test or iterable deciding whether ``child`` (a part of ``compound``) runs."""
    if isinstance(compound, (cst.If, cst.While)) and child is not compound.test:
        return compound.test
    if isinstance(compound, cst.For) and child is not compound.iter:
        return compound.iter
    return None


def _movable(fm: FileModel, compound: cst.CSTNode) -> bool:
    """``compound`` is a whole statement of a block that can run on rank 0 alone: it returns,
    breaks and yields nothing, and binds no name read outside it."""
    if fm.enclosing_statement(compound) is not compound:
        return False  # an ``elif``: the outer ``if`` decides
    if findall(compound, m.Return() | m.Yield() | m.Break() | m.Continue() | m.Raise()):
        return False
    targets: list[cst.BaseExpression] = []
    for node in findall(compound, m.AssignTarget() | m.AnnAssign() | m.AugAssign() | m.For()):
        targets.append(node.target)  # type: ignore[attr-defined]
    for target in targets:
        names = target_names(target)
        if not isinstance(target, (cst.Name, cst.Tuple, cst.List)):
            return False  # ``self.x = ...``, ``d[k] = ...``: read who knows where
        for name in names:
            binding = binding_of(fm, name)
            if binding is None:
                return False
            if any(not any(p is compound for p in fm.ancestors(u)) for u in uses(fm, binding)):
                return False
    return True


def next_statement(fm: FileModel, stmt: cst.CSTNode) -> cst.CSTNode | None:
    """The statement after ``stmt`` in its block (None: the last one)."""
    body = getattr(fm.parent(stmt), "body", None)
    if not isinstance(body, (list, tuple)):
        return None
    index = next((i for i, s in enumerate(body) if s is stmt), len(body))
    return body[index + 1] if index + 1 < len(body) else None
