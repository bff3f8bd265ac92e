"""Jupyter notebooks: convert the code cells as one program, keep everything else.

The code cells are joined into one module, separated by marker comments; IPython magics and shell
lines (``%time``, ``!pip ...``) and whole cell-magic cells (``%%bash``) are swapped for placeholder
comments first, so the module parses, and put back afterwards. Outputs, metadata and markdown cells
are not touched. Line numbers in the report are those of the joined program, prefixed by the cell.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

from .base import Options
from .changes import Change, ConversionError
from .engine import Result, convert

_CELL = "# -- sdp-convert cell {} --"
_CELL_RE = re.compile(r"^# -- sdp-convert cell (\d+) --$")
_MAGIC = "# -- sdp-convert magic {} --"
_MAGIC_RE = re.compile(r"^(\s*)# -- sdp-convert magic (\d+) --$")


def _lines(source: str | list[str]) -> list[str]:
    text = "".join(source) if isinstance(source, list) else source
    return text.split("\n")


def _program(
    cells: list[dict], code_cells: list[int]
) -> tuple[str, list[tuple[int, int]], list[str]]:
    """The code cells as one module: its text, (cell index, line in cell) of each of its lines,
    and the magic lines swapped for placeholder comments."""
    magics: list[str] = []
    program: list[str] = []
    line_to_cell: list[tuple[int, int]] = []  # per program line: (cell index, line in cell)
    for k, index in enumerate(code_cells):
        program.append(_CELL.format(k))
        line_to_cell.append((index, 0))
        lines = _lines(cells[index].get("source", ""))
        cell_magic = bool(lines) and lines[0].lstrip().startswith("%%")
        for n, line in enumerate(lines, start=1):
            stripped = line.lstrip()
            if cell_magic or stripped.startswith(("%", "!")):
                magics.append(line)
                indent = "" if cell_magic else line[: len(line) - len(stripped)]
                line = indent + _MAGIC.format(len(magics) - 1)
            program.append(line)
            line_to_cell.append((index, n))
    return "\n".join(program) + "\n", line_to_cell, magics


def notebook_program(data: bytes) -> tuple[str, list[tuple[int, int]]] | None:
    """A notebook's code cells as one module (as ``convert_notebook`` reads them) and the
    (cell index, line in cell) of each of its lines; None when ``data`` is no notebook."""
    try:
        cells = json.loads(data.decode("utf-8"))["cells"]
        code_cells = [i for i, c in enumerate(cells) if c.get("cell_type") == "code"]
        source, line_to_cell, _ = _program(cells, code_cells)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return source, line_to_cell


def convert_notebook(data: bytes, options: Options | None = None) -> Result:
    """Convert an ``.ipynb`` file's bytes; the result's output is the notebook's JSON."""
    try:
        nb = json.loads(data.decode("utf-8"))
        cells = nb["cells"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise ConversionError(f"not a valid notebook: {err}") from None
    code_cells = [i for i, c in enumerate(cells) if c.get("cell_type") == "code"]
    if not code_cells:
        raise ConversionError("notebook has no code cells")
    source, line_to_cell, magics = _program(cells, code_cells)
    try:
        result = convert(source.encode("utf-8"), options)
    except ConversionError as err:
        if err.line is not None and 0 < err.line <= len(line_to_cell):
            cell, line = line_to_cell[err.line - 1]
            raise ConversionError(f"cell {cell + 1}, line {line}: {err.message}") from None
        raise
    if not result.changed:
        return Result(data, data, result.info, result.changes)

    out_cells: dict[int, list[str]] = {}
    current: int | None = None
    for line in result.output.decode("utf-8").split("\n"):
        marker = _CELL_RE.match(line)
        if marker:
            current = code_cells[int(marker.group(1))]
            out_cells[current] = []
            continue
        magic = _MAGIC_RE.match(line)
        if magic:
            line = magics[int(magic.group(2))]
        if current is None:  # pragma: no cover - the first line is always a cell marker
            raise ConversionError("internal error: notebook cell markers lost")
        out_cells[current].append(line)
    for index, lines in out_cells.items():
        while lines and lines[-1] == "":
            lines.pop()
        text = "\n".join(lines)
        original = cells[index].get("source", "")
        if isinstance(original, list):
            cells[index]["source"] = [ln + "\n" for ln in text.split("\n")[:-1]] + (
                [text.split("\n")[-1]] if text else []
            )
        else:
            cells[index]["source"] = text
    indent = re.search(rb"\n( +)\S", data)
    width = len(indent.group(1)) if indent else 1
    output = (json.dumps(nb, indent=width, ensure_ascii=False) + "\n").encode("utf-8")

    changes = []
    for change in result.changes:
        cell, line = line_to_cell[min(change.line, len(line_to_cell)) - 1]
        changes.append(replace(change, message=f"cell {cell + 1}, line {line}: {change.message}"))
    return Result(data, output, result.info, changes)


__all__ = ["convert_notebook", "Change"]
