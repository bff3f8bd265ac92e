"""A notebook's code cells as Python that runs outside IPython (``sdp-run -n N train.ipynb``).

Reads an ``.ipynb`` document (nbformat 4: ``{"cells": [{"cell_type": "code", "source": ...}]}``)
and gives each code cell as Python source whose lines are the cell's own, line for line, so that
a line number in a traceback is the line in the cell. IPython's own lines are replaced, each by
one line of Python at the same indentation:

- run, because they are safe to run in every rank: ``%env NAME=VALUE`` (and ``%env NAME VALUE``)
  sets the variable, ``%env NAME`` is its value, ``%cd DIR`` changes the folder, ``%time STMT``
  runs ``STMT`` (untimed);
- skipped (``pass``), and listed once by ``sdp-run``: every other line magic (``%pip``,
  ``%matplotlib``, ``%timeit``, ...), shell lines (``!pip install ...``) and help lines
  (``model?``).

A cell whose first line is a cell magic is handled as a whole: ``%%time`` runs its body,
``%%capture [NAME]`` runs it with its output captured (in ``NAME``, as IPython does),
``%%writefile FILE`` writes its body to ``FILE`` (in every rank, the same bytes, atomically);
any other (``%%bash``, ``%%timeit``, ``%%writefile -a``, ``%%html``, ...) is skipped.

An IPython line is one that starts a statement: a ``%`` that continues an expression or a line
inside a triple-quoted string is Python's. Cells are numbered as ``sdp-convert``'s report numbers
them: from 1, among all the notebook's cells (markdown included).

This module reads the notebook itself, as the converter's ``sdp_convert.notebook`` does for its
own purpose: the runtime never imports the converter.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import tokenize
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["code", "time", "capture", "writefile", "skipped"]

_HELP = re.compile(r"(\?{1,2}[\w.]+|[\w.]+\?{1,2})")
_ENV_SET = re.compile(r"([A-Za-z_]\w*)(?:\s*=\s*|\s+)(.*)")


@dataclass(frozen=True)
class IPythonLine:
    """One IPython line (or cell magic) of a cell: where, what, and whether it runs."""

    line: int  # in the cell, from 1
    text: str  # as written, stripped
    run: bool


@dataclass
class Cell:
    """One code cell, ready to run."""

    number: int  # from 1, among all the notebook's cells
    #: Python, line for line the cell's (a cell magic's body starts on line 2; line 1 is blank).
    source: str
    kind: Kind = "code"
    #: ``%%capture``'s variable, ``%%writefile``'s file ("" when none).
    argument: str = ""
    #: The cell's body as written (for ``%%writefile``).
    body: str = ""
    ipython: list[IPythonLine] = field(default_factory=list)

    def skipped(self) -> list[IPythonLine]:
        """Its IPython lines that do not run."""
        return [x for x in self.ipython if not x.run]


def read(path: str) -> list[Cell]:
    """The code cells of the notebook at ``path``, in order.

    Raises ``ValueError`` with a one-line reason when the file is not a notebook.

    Example:
        >>> [c.number for c in read("train.ipynb")]   # a markdown cell first
        [2, 3, 4]
    """
    try:
        with open(path, "rb") as handle:
            document = json.loads(handle.read().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a valid notebook ({error})") from None
    cells = document.get("cells") if isinstance(document, dict) else None
    if not isinstance(cells, list):
        raise ValueError(f"{path}: not a valid notebook (no list of cells)")
    out = []
    for number, cell in enumerate(cells, start=1):
        if not isinstance(cell, dict):
            raise ValueError(f"{path}: not a valid notebook (cell {number} is not an object)")
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list) and all(isinstance(s, str) for s in source):
            source = "".join(source)
        if not isinstance(source, str):
            raise ValueError(f"{path}: not a valid notebook (the source of cell {number} is "
                             "not text)")
        out.append(translate(number, source))
    return out


def translate(number: int, text: str) -> Cell:
    """Cell ``number``'s source ``text`` as a ``Cell`` (see the module's docstring).

    Example:
        >>> translate(1, "%env SEED=1\\n!nvidia-smi\\nx = 1").source
        "__import__('os').environ['SEED'] = '1'\\npass\\nx = 1"
    """
    lines = text.split("\n")
    first = lines[0].strip()
    if first.startswith("%%"):
        body = "\n".join(lines[1:])
        kind, argument = _cell_magic(first)
        source, found = _lines([""] + lines[1:], start=0)
        magic = IPythonLine(1, first, kind != "skipped")
        return Cell(number, source, kind, argument, body, [magic, *found])
    source, found = _lines(lines, start=0)
    return Cell(number, source, ipython=found)


def _cell_magic(first: str) -> tuple[Kind, str]:
    name, _, rest = first[2:].partition(" ")
    try:
        words = shlex.split(rest)
    except ValueError:
        return "skipped", ""
    if name == "time":
        return "time", ""
    if name == "capture":
        names = [w for w in words if not w.startswith("-")]
        return "capture", names[0] if names else ""
    if name in ("writefile", "file") and len(words) == 1 and not words[0].startswith("-"):
        return "writefile", words[0]
    return "skipped", ""


def _lines(lines: list[str], start: int) -> tuple[str, list[IPythonLine]]:
    """The lines with each IPython line that starts a statement replaced by Python."""
    out: list[str] = []
    found: list[IPythonLine] = []
    pending: list[str] = []  # the lines of a statement that is not complete yet
    for n, line in enumerate(lines, start=start + 1):
        stripped = line.strip()
        if not pending and _is_ipython(stripped):
            indent = line[: len(line) - len(line.lstrip())]
            python = _python_for(stripped)
            found.append(IPythonLine(n, stripped, python is not None))
            out.append(indent + (python or "pass"))
            continue
        out.append(line)
        pending.append(line)
        if _complete("\n".join(pending)):
            pending = []
    return "\n".join(out), found


def _is_ipython(stripped: str) -> bool:
    return stripped.startswith(("%", "!")) or bool(_HELP.fullmatch(stripped))


def _complete(text: str) -> bool:
    """Whether ``text`` (lines of one statement so far) closes its brackets and strings."""
    try:
        for _ in tokenize.generate_tokens(io.StringIO(text.lstrip() + "\n").readline):
            pass
    except tokenize.TokenError:
        return False
    except (SyntaxError, ValueError):  # Python's compile says what is wrong, with the line
        return True
    return True


def _python_for(magic: str) -> str | None:
    """One line of Python doing what an IPython line does, or None when it is not run."""
    if not magic.startswith("%") or magic.startswith("%%"):
        return None
    name, _, rest = magic[1:].partition(" ")
    rest = rest.strip()
    if name == "env" and rest:
        match = _ENV_SET.fullmatch(rest)
        if match:
            key, value = match.groups()
            return f"__import__('os').environ[{key!r}] = {value.strip()!r}"
        if re.fullmatch(r"[A-Za-z_]\w*", rest):
            return f"__import__('os').environ.get({rest!r})"
        return None
    if name == "cd" and rest:
        try:
            words = shlex.split(rest)
        except ValueError:
            return None
        if len(words) == 1 and not words[0].startswith("-"):
            return f"__import__('os').chdir(__import__('os').path.expanduser({words[0]!r}))"
        return None
    if name == "time" and rest:
        return rest
    return None


def describe_skipped(path: str, cells: list[Cell]) -> str | None:
    """The one line that lists what does not run, or None when everything runs.

    Example:
        >>> describe_skipped("train.ipynb", read("train.ipynb"))
        'train.ipynb: IPython lines not run (not Python): cell 1, line 1: !pip install torch'
    """
    items = []
    for cell in cells:
        for x in cell.skipped():
            what = _short(x.text)
            if x.line == 1 and cell.kind == "skipped" and x.text.startswith("%%"):
                items.append(f"cell {cell.number}: {what} (the whole cell)")
            else:
                items.append(f"cell {cell.number}, line {x.line}: {what}")
    if not items:
        return None
    return f"{path}: IPython lines not run (not Python): " + "; ".join(items)


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
