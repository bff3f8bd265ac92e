"""Lay out the lines the converter changed as the script's own formatter would, and only those.

A conversion writes some lines longer than the file's limit (``fit(...)`` with sliced arrays and
two callbacks, ``callbacks = [...] if sdp.rank() == 0 else [...]``). Where a changed line is
longer than the file's line length, black lays out that line at that length (its line ranges,
``lines=``, black >= 24.1), keeping the script's quotes (no string normalisation); changed lines
that fit stay as the converter wrote them. Black is given the statement holding the line alone
(dedented, at the line length less its indentation), not the whole file: about 5 ms a statement
instead of about 70 ms a file for black's parse. Every line the converter did not change stays
byte for byte: that is checked, and where black would touch one (or refuses the code), the long
line stays as it is; so does a long compound-statement header (``with ... as f:``). A
conversion whose changed lines all fit does not run black at all.

The line length is the file's own: ``line-length`` of ``[tool.black]``, else of ``[tool.ruff]``,
in the nearest ``pyproject.toml`` above the file (not above the top of its repository), else
black's 88 (``line_length_for``).
"""

from __future__ import annotations

import ast
import difflib
import functools
import os
import sys
from bisect import bisect_left, bisect_right
from collections import Counter
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: black's default, for files with no configured length.
DEFAULT_LINE_LENGTH = 88


def line_length_for(path: str | os.PathLike[str] | None) -> int:
    """The line length of the file at ``path`` (see the module docstring); None: the current
    directory's."""
    start = Path(path).absolute().parent if path is not None else Path.cwd()
    return _line_length_in(start)


@functools.lru_cache(maxsize=256)
def _line_length_in(directory: Path) -> int:
    for folder in (directory, *directory.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return _configured(candidate)
        if (folder / ".git").exists() or (folder / ".hg").exists():
            break
    return DEFAULT_LINE_LENGTH


def _configured(pyproject: Path) -> int:
    try:
        with pyproject.open("rb") as handle:
            tool = tomllib.load(handle).get("tool", {})
    except (OSError, tomllib.TOMLDecodeError):
        return DEFAULT_LINE_LENGTH
    for table in ("black", "ruff"):
        value = tool.get(table, {}).get("line-length") if isinstance(tool, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return DEFAULT_LINE_LENGTH


def format_changed(source: bytes, output: bytes, line_length: int) -> bytes:
    """``output`` with each statement holding a changed line longer than ``line_length`` laid out
    by black; ``output`` itself when there is none (see the module docstring)."""
    try:
        before = source.decode("utf-8").splitlines(keepends=True)
        after_text = output.decode("utf-8")
    except UnicodeDecodeError:
        return output  # another encoding: rare, and black would need it declared
    after = after_text.splitlines(keepends=True)
    if "\r" in after_text:
        return output  # black would rewrite the line endings
    known = set(before)
    if not any(_width(line) > line_length and line not in known for line in after):
        return output  # the usual case, decided without a diff
    changed = {i for a, b in changed_ranges(before, after) for i in range(a, b + 1)}
    long = sorted(i for i in changed if _width(after[i - 1]) > line_length)
    spans = _statements(after_text, long)
    if not spans:
        return output
    import black  # only here: importing it costs more than converting a small file

    lines = list(after)
    ordered = sorted(changed)

    def within(numbers: list[int], first: int, last: int) -> list[int]:
        """The sorted ``numbers`` from ``first`` to ``last`` (a search: a file has many spans)."""
        return numbers[bisect_left(numbers, first) : bisect_right(numbers, last)]

    for first, last in sorted(spans, reverse=True):
        mine = {i - first + 1 for i in within(ordered, first, last)}
        targets = [(i - first + 1,) * 2 for i in within(long, first, last)]
        new = _black(black, lines[first - 1 : last], line_length, targets, mine)
        if new is not None:
            lines[first - 1 : last] = new
    if lines == after:
        return output  # black changed nothing (``_statements`` parsed this text)
    result = "".join(lines)
    try:
        ast.parse(result)
    except SyntaxError:  # pragma: no cover - black keeps code valid; never write worse
        return output
    return result.encode("utf-8")


def _width(line: str) -> int:
    return len(line.rstrip("\n"))


def _statements(text: str, long: list[int]) -> set[tuple[int, int]]:
    """``(first, last)`` lines of each simple statement holding a line of ``long``, alone on its
    lines."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    lines = text.splitlines()
    wanted = set(long)
    spans: set[tuple[int, int]] = set()
    for node in _statements_over(tree, wanted):
        if isinstance(node, _COMPOUND):
            continue
        first, last = node.lineno, node.end_lineno or node.lineno
        head, tail = lines[first - 1], lines[last - 1]
        indent = head[: len(head) - len(head.lstrip())]
        if node.col_offset != len(indent) or tail[node.end_col_offset :].strip()[:1] not in (
            "", "#"
        ):
            continue  # shares its line with another statement (``a = 1; b = 2``)
        spans.add((first, last))
    return spans


def _statements_over(tree: ast.Module, wanted: set[int]) -> list[ast.stmt]:
    """The statements of ``tree`` whose lines hold one of ``wanted``: those of ``ast.walk`` that
    do, found by going down only into the statements that do (a statement's lines hold those
    of the statements in it; statements are only in the bodies of others, never in
    expressions)."""
    found: list[ast.stmt] = []
    todo: list[ast.AST] = [tree]
    lines = sorted(wanted)  # whether a statement's span holds one: a search, not a scan
    while todo:
        node = todo.pop()
        for field in _BODIES:
            for child in getattr(node, field, ()):
                if isinstance(child, ast.stmt):
                    last = child.end_lineno or child.lineno
                    at = bisect_left(lines, child.lineno)
                    if at < len(lines) and lines[at] <= last:
                        found.append(child)
                        todo.append(child)
                elif isinstance(child, ast.ExceptHandler | ast.match_case):
                    todo.append(child)  # their bodies hold statements
    return found


#: The fields that hold statements (``Try.handlers`` and ``Match.cases``: through their parts).
_BODIES = ("body", "orelse", "finalbody", "handlers", "cases")


_COMPOUND = (
    ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try,
    ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Match,
) + ((ast.TryStar,) if sys.version_info >= (3, 11) else ())


def _black(
    black: Any,
    statement: list[str],
    line_length: int,
    targets: list[tuple[int, int]],
    changed: set[int],
) -> list[str] | None:
    """One statement's lines with its ``targets`` lines (1-based, in the statement) laid out by
    black at its indentation; None if black refuses, or would touch a line not in ``changed``."""
    indent = statement[0][: len(statement[0]) - len(statement[0].lstrip())]
    if "\t" in indent or not all(
        line.startswith(indent) or not line.strip() for line in statement
    ):
        return None
    snippet = [line[len(indent) :] if line.strip() else line for line in statement]
    mode = black.Mode(line_length=max(line_length - len(indent), 20), string_normalization=False)
    try:
        laid_out = black.format_str("".join(snippet), mode=mode, lines=targets)
    except Exception:  # noqa: BLE001 - black refusing the code must not fail the conversion
        return None
    new = laid_out.splitlines(keepends=True)
    if not _only_within(snippet, new, changed) or not _same_code("".join(snippet), laid_out):
        return None
    return [indent + line if line.strip() else line for line in new]


def _same_code(before: str, after: str) -> bool:
    """The two layouts are the same program (black's own safety check, which ``format_str``
    skips)."""
    try:
        return ast.dump(ast.parse(before)) == ast.dump(ast.parse(after))
    except SyntaxError:
        return False


def _only_within(old: list[str], new: list[str], allowed: set[int]) -> bool:
    """Every line of ``old`` (1-based) not in ``allowed`` is in ``new`` unchanged."""
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, _, _ in matcher.get_opcodes():
        if tag != "equal" and any(i + 1 not in allowed for i in range(i1, i2)):
            return False
        if tag == "insert" and not {i1, i1 + 1} & allowed:
            return False  # new lines away from any changed line
    return True


def changed_ranges(before: list[str], after: list[str]) -> list[tuple[int, int]]:
    """The lines of ``after`` (1-based, inclusive ranges) that are not lines of ``before``.

    difflib's matcher on the whole of two long files is quadratic in their repeated lines (a
    notebook's ``loss.backward()`` in every cell: each search for the longest match goes through
    every copy). So the lines found once in each file, in the same order in both (the longest
    such run: patience diff's anchors), are matched first, and difflib matches the short
    stretches between them; where difflib alone would align those lines the same way (what it
    does when the other lines differ only by the converter's insertions and edits), the answer is
    the same (``tests/test_scale.py`` compares both on every golden and the corpus)."""
    ranges: list[tuple[int, int]] = []
    for a0, a1, b0, b1 in _stretches(before, after):
        if a0 == a1:
            if b1 > b0:
                ranges.append((b0 + 1, b1))
            continue
        if b0 == b1:
            continue
        matcher = difflib.SequenceMatcher(None, before[a0:a1], after[b0:b1], autojunk=False)
        ranges += [
            (b0 + j1 + 1, b0 + j2)
            for tag, _, _, j1, j2 in matcher.get_opcodes()
            if tag in ("replace", "insert") and j2 > j1
        ]
    return ranges


def _stretches(before: list[str], after: list[str]) -> list[tuple[int, int, int, int]]:
    """``(a0, a1, b0, b1)``: the stretches of both files between anchors (lines found once in
    each, matched in order: the longest increasing run of their positions)."""
    once_before = Counter(before)
    once_after = Counter(after)
    where = {line: i for i, line in enumerate(before) if once_before[line] == 1}
    pairs = [
        (where[line], j) for j, line in enumerate(after)
        if once_after[line] == 1 and line in where
    ]
    # Longest increasing subsequence of the ``before`` positions (pairs are in ``after`` order).
    tails: list[int] = []  # the ``before`` position ending the best run of each length
    ends: list[int] = []  # index into pairs of that position
    back: list[int] = []
    for k, (i, _) in enumerate(pairs):
        n = bisect_left(tails, i)
        back.append(ends[n - 1] if n else -1)
        if n == len(tails):
            tails.append(i)
            ends.append(k)
        else:
            tails[n], ends[n] = i, k
    anchors: list[tuple[int, int]] = []
    k = ends[-1] if ends else -1
    while k != -1:
        anchors.append(pairs[k])
        k = back[k]
    anchors.reverse()
    # Each anchor grows into the run of equal lines around it, as difflib's matches do.
    stretches = []
    a0 = b0 = 0
    for n, (i, j) in enumerate(anchors):
        start_a, start_b = i, j
        while start_a > a0 and start_b > b0 and before[start_a - 1] == after[start_b - 1]:
            start_a, start_b = start_a - 1, start_b - 1
        stretches.append((a0, start_a, b0, start_b))
        limit_a, limit_b = anchors[n + 1] if n + 1 < len(anchors) else (len(before), len(after))
        a0, b0 = i + 1, j + 1
        while a0 < limit_a and b0 < limit_b and before[a0] == after[b0]:
            a0, b0 = a0 + 1, b0 + 1
    stretches.append((a0, len(before), b0, len(after)))
    return stretches
