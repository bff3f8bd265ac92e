"""Run a notebook's code cells as one program: what ``sdp-run -n N train.ipynb`` runs in each rank.

``python -m sdp_runtime._notebook NOTEBOOK ARGS...`` (``sdp-run`` starts it so). The code cells
run in order in one ``__main__`` namespace, as in a Jupyter kernel: ``sys.argv`` is
``[NOTEBOOK, *ARGS]``, the notebook's folder is first on ``sys.path``, the current folder is the
one ``sdp-run`` was started in (as for a script), there is no ``__file__`` (as in Jupyter),
``display(...)`` prints each object's text form, and the value of a cell's last expression is
printed unless it is None or the line ends with ``;``. IPython lines are run or skipped as
``_cells`` says; rank 0 prints one line listing those skipped.

Every cell is compiled before the first one runs, so a syntax error in the last cell is found at
once. Each cell is compiled under the name ``NOTEBOOK, cell N`` with its source in ``linecache``:
a traceback reads ``File "train.ipynb, cell 5", line 3``, with the line's text, and the audit
names a write ``train.ipynb, cell 5:3``. An uncaught exception is reported through
``sys.excepthook`` (the runtime's, after ``sdp.init()``: the rank's failure is recorded for
``sdp-run``) with the runner's own frames left out, and the rank exits with status 1.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import linecache
import os
import pprint
import sys
import tempfile
import traceback
import types
from collections.abc import Sequence
from typing import Any

from . import _cells, _env


def display(*objs: Any, **kwargs: Any) -> None:
    """IPython's ``display`` outside IPython: prints each object's text form (its ``repr``,
    laid out as ``pprint`` does), one after the other; IPython's keyword arguments are ignored.

    Example:
        >>> display({"lr": 0.1}, "done")
        {'lr': 0.1}
        'done'
    """
    for obj in objs:
        print(pprint.pformat(obj, sort_dicts=False))


def cell_filename(path: str, number: int) -> str:
    """The name a cell is compiled under: ``train.ipynb, cell 5``."""
    return f"{path}, cell {number}"


class _Captured:
    """What ``%%capture NAME`` binds: the cell's output (IPython's ``CapturedIO``, text only)."""

    def __init__(self, stdout: str, stderr: str) -> None:
        self.stdout, self.stderr = stdout, stderr
        self.outputs: list[Any] = []

    def show(self) -> None:
        sys.stdout.write(self.stdout)
        sys.stderr.write(self.stderr)

    def __call__(self) -> None:
        self.show()


def _compile(path: str, cell: _cells.Cell) -> tuple[types.CodeType | None, types.CodeType | None]:
    """The cell's statements and, when it ends with an expression, that expression (to print
    its value): two code objects under the cell's name; (None, None) for a cell that does not run
    Python."""
    if cell.kind in ("skipped", "writefile"):
        return None, None
    import ast

    name = cell_filename(path, cell.number)
    lines = cell.source.splitlines(keepends=True)
    linecache.cache[name] = (len(cell.source), None, lines, name)  # tracebacks show the line
    tree = ast.parse(cell.source, name, "exec")
    last = None
    end = tree.body[-1] if tree.body else None
    if isinstance(end, ast.Expr) and not _ends_with_semicolon(lines, end):
        tree.body.pop()
        last = compile(ast.Expression(end.value), name, "eval")
    return compile(tree, name, "exec"), last


def _ends_with_semicolon(lines: list[str], node: Any) -> bool:
    end = getattr(node, "end_lineno", None) or node.lineno
    text = lines[end - 1] if end - 1 < len(lines) else ""
    return text.split("#", 1)[0].rstrip().endswith(";")


def _write_file(target: str, body: str) -> None:
    """``%%writefile``: every rank writes the same bytes, each through a rename of its own."""
    folder = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".writefile-", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(body if body.endswith("\n") else body + "\n")
    os.replace(tmp, target)


def _run_cell(cell: _cells.Cell, code: types.CodeType | None, last: types.CodeType | None,
              namespace: dict[str, Any]) -> None:
    if cell.kind == "writefile":
        _write_file(cell.argument, cell.body)
        return
    if code is None:
        return
    if cell.kind == "capture":
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            exec(code, namespace)
            value = eval(last, namespace) if last is not None else None
            if value is not None:
                display(value)
        if cell.argument:
            namespace[cell.argument] = _Captured(out.getvalue(), err.getvalue())
        return
    exec(code, namespace)
    if last is not None:
        value = eval(last, namespace)
        if value is not None:
            display(value)


def _in_cells(tb: types.TracebackType | None, names: set[str]) -> types.TracebackType | None:
    """The traceback from the first frame of a cell (the runner's frames left out)."""
    first = tb
    while tb is not None and tb.tb_frame.f_code.co_filename not in names:
        tb = tb.tb_next
    return tb or first


def run(path: str, args: Sequence[str] = ()) -> int:
    """Run the notebook's code cells in order; the exit status (0, or 1 after an error).

    Arguments:
        path: the ``.ipynb`` file.
        args: the program's arguments (``sys.argv[1:]``).

    Example:
        >>> run("train.ipynb", ["--epochs", "1"])
        0
    """
    try:
        cells = _cells.read(path)
    except (OSError, ValueError) as error:
        print(f"sdp-run: error: {error}", file=sys.stderr)
        return 2
    names = {cell_filename(path, c.number) for c in cells}
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = print_exception  # sdp.init() chains the runtime's hook before it
    try:
        compiled = [_compile(path, c) for c in cells]
    except SyntaxError as error:
        sys.excepthook(type(error), error, None)
        return 1
    skipped = _cells.describe_skipped(path, cells)
    if skipped and _env.detect().rank == 0:
        print(f"sdp-run: {skipped}", file=sys.stderr, flush=True)

    main = types.ModuleType("__main__")
    main.__dict__.update({"__builtins__": builtins, "display": display})
    sys.modules["__main__"] = main  # pickle finds the classes the cells define
    sys.argv = [path, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(path))
    for cell, (code, last) in zip(cells, compiled, strict=True):
        try:
            _run_cell(cell, code, last, main.__dict__)
        except Exception as error:
            tb = _in_cells(error.__traceback__, names)
            sys.excepthook(type(error), error.with_traceback(tb), tb)
            return 1
    return 0


def print_exception(kind: type[BaseException], error: BaseException,
                     tb: types.TracebackType | None) -> None:
    """Python's default hook, through ``traceback``, which reads the cells' lines from
    ``linecache`` (the interpreter's own hook reads source files from disk only)."""
    traceback.print_exception(kind, error, tb)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sdp_runtime._notebook NOTEBOOK ARGS...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m sdp_runtime._notebook NOTEBOOK [ARGS...]", file=sys.stderr)
        return 2
    return run(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
