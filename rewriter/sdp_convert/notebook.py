"""Jupyter notebooks: convert the code cells as one program, keep everything else.

The code cells are joined into one module, separated by marker comments; IPython magics and shell
lines (``%time``, ``!pip ...``) and whole cell-magic cells (``%%bash``) are swapped for placeholder
comments first, so the module parses, and put back afterwards. Outputs, metadata and markdown cells
are not touched. Line numbers in the report are those of the joined program, prefixed by the cell.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import replace
from json.decoder import scanstring

from . import manual_marks
from .base import Options
from .changes import Change, ConversionError
from .compiles import check, check_output
from .engine import CELL_MARK, Result, convert

_CELL = CELL_MARK
_CELL_RE = re.compile("^" + re.escape(CELL_MARK).replace(r"\{\}", r"(\d+)") + "$")
_MAGIC = "# -- sdp-convert magic {} --"
_MAGIC_RE = re.compile(r"^(\s*)# -- sdp-convert magic (\d+) --$")


def _lines(source: str | list[str]) -> list[str]:
    text = "".join(source) if isinstance(source, list) else source
    return text.split("\n")


def _check_shape(cells: object) -> None:
    """Raise ``ConversionError`` unless ``cells`` is what nbformat says: a list of objects whose
    ``source`` (of code cells) is a string or a list of strings."""
    if not isinstance(cells, list):
        raise ConversionError(
            f"not a valid notebook: cells is a {type(cells).__name__}, not a list")
    for n, cell in enumerate(cells, start=1):
        if not isinstance(cell, dict):
            raise ConversionError(
                f"not a valid notebook: cell {n} is a {type(cell).__name__}, not an object")
        source = cell.get("source", "")
        if cell.get("cell_type") == "code" and not (
            isinstance(source, str)
            or (isinstance(source, list) and all(isinstance(x, str) for x in source))
        ):
            raise ConversionError(
                f"not a valid notebook: the source of cell {n} is not text or a list of lines")


def _source_rows(text: str) -> dict[int, list[int]]:
    """For each cell (by index): the line of the ``.ipynb`` file, 1-based, on which each line
    of its source is, so that a report points at a line a person (or a GitHub annotation) can
    find in the file. Empty when the document cannot be walked."""
    decoder = json.JSONDecoder()
    space = re.compile(r"[ \t\n\r]*")
    newlines = [m.start() for m in re.finditer("\n", text)]

    def row(offset: int) -> int:
        return bisect.bisect_left(newlines, offset) + 1

    def skip(i: int) -> int:
        return space.match(text, i).end()  # type: ignore[union-attr]

    def items(i: int, close: str) -> list[tuple[str | None, int]]:
        """``(key or None, value offset)`` of the object or array starting at ``i``."""
        found: list[tuple[str | None, int]] = []
        i = skip(i + 1)
        if text[i] == close:
            return found
        while True:
            key = None
            if close == "}":
                key, i = scanstring(text, i + 1)
                i = skip(skip(i) + 1)  # the colon
            found.append((key, i))
            _, i = decoder.raw_decode(text, i)
            i = skip(i)
            if text[i] != ",":
                return found
            i = skip(i + 1)

    try:
        top = dict(items(skip(0), "}"))
        rows: dict[int, list[int]] = {}
        for index, (_, cell) in enumerate(items(top["cells"], "]")):
            source = dict(items(cell, "}")).get("source")
            if source is None:
                continue
            if text[source] != "[":
                value, _ = decoder.raw_decode(text, source)
                rows[index] = [row(source)] * (value.count("\n") + 1)
                continue
            lines: list[int] = []
            starts = True
            for _, element in items(source, "]"):
                value, _ = decoder.raw_decode(text, element)
                if starts:
                    lines.append(row(element))
                lines.extend([row(element)] * value[:-1].count("\n"))
                starts = value.endswith("\n")
            rows[index] = lines or [row(source)]
        return rows
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return {}


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
        continued = False  # the line before was a magic or shell line ending in ``\``
        for n, line in enumerate(lines, start=1):
            stripped = line.lstrip()
            if cell_magic or continued or stripped.startswith(("%", "!")):
                continued = line.rstrip().endswith("\\")  # ``!python x.py \`` goes on
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
        _check_shape(cells)
        code_cells = [i for i, c in enumerate(cells) if c.get("cell_type") == "code"]
        source, line_to_cell, _ = _program(cells, code_cells)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, ConversionError):
        return None
    return source, line_to_cell


def convert_notebook(data: bytes, options: Options | None = None) -> Result:
    """Convert an ``.ipynb`` file's bytes; the result's output is the notebook's JSON."""
    try:
        nb = json.loads(data.decode("utf-8"))
        if not isinstance(nb, dict):
            raise TypeError(f"the document is a {type(nb).__name__}, not an object")
        cells = nb["cells"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise ConversionError(f"not a valid notebook: {err}") from None
    _check_shape(cells)
    code_cells = [i for i, c in enumerate(cells) if c.get("cell_type") == "code"]
    if not code_cells:
        raise ConversionError("notebook has no code cells")

    source, line_to_cell, magics = _program(cells, code_cells)
    try:
        joined = source.encode("utf-8")
        check(joined, notebook=True)
        result = manual_marks.apply(joined, convert(joined, options))
        if result.changed:
            check_output(result.output, notebook=True)
    except ConversionError as err:
        if err.line is not None and 0 < err.line <= len(line_to_cell):
            cell, line = line_to_cell[err.line - 1]
            raise ConversionError(f"cell {cell + 1}, line {line}: {err.message}",
                                  _row(data, cell, line), err.col) from None
        raise
    if not result.changed:
        return Result(data, data, result.info, placed(data, result.changes, line_to_cell))

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

    return Result(data, output, result.info, placed(data, result.changes, line_to_cell))


def run_hint(command: str) -> str:
    """The first-run line for a converted notebook: ``command`` (``sdp-run --audit -n 2 NB``)
    runs its code cells; from inside Jupyter, the runtime's ``notebook_launcher`` runs a function
    (docs/running.md, "Notebooks")."""
    return (f"sdp-convert: first run of a converted notebook: {command} runs its code cells on 2 "
            "processes and checks that its ranks train one model on split data; inside Jupyter, "
            "put the training in a function and call sdp_runtime.notebook_launcher(train, "
            "num_processes=2, audit=True)")


def _row(data: bytes, cell: int, line: int) -> int | None:
    """The ``.ipynb`` file's line holding line ``line`` (1-based; 0: the cell) of ``cell``."""
    rows = _source_rows(data.decode("utf-8")).get(cell)
    return rows[min(max(line, 1), len(rows)) - 1] if rows else None


def placed(
    data: bytes, changes: list[Change], line_to_cell: list[tuple[int, int]]
) -> list[Change]:
    """The joined program's changes, said of the notebook: the message names the cell and its
    line, and ``line`` is the line of the ``.ipynb`` file where that source line is."""
    rows = _source_rows(data.decode("utf-8")) if changes else {}
    placed = []
    for change in changes:
        cell, line = line_to_cell[min(change.line, len(line_to_cell)) - 1]
        cell_rows = rows.get(cell)
        where = cell_rows[min(max(line, 1), len(cell_rows)) - 1] if cell_rows else change.line
        placed.append(replace(change, line=where,
                              message=f"cell {cell + 1}, line {line}: {change.message}"))
    return placed


__all__ = ["convert_notebook", "Change"]
