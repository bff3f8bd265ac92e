"""libcst's parse of a long file, a run of top-level statements at a time (peak memory).

libcst's native parser holds about 30 KiB of its own memory per line of the file while it parses
(its packrat caches and token buffers, outside Python's heap): a 20,000-line file takes some
600 MiB of the process's peak for the parse alone, and the allocator keeps that memory after it.
``parse_module`` here cuts a long file at top-level statement boundaries into pieces of about
``CHUNK_LINES`` lines, parses each, and joins their statements into one ``Module``: the same tree
``libcst.parse_module`` gives (``tests/test_longparse.py`` compares them node for node), built
with the memory of one piece's parse.

A cut is made only where nothing can be in doubt: before a top-level statement (its decorators)
as CPython's ``ast`` places it, right after the statement before or after empty lines only (no
comment, no whitespace: libcst gives those to the next statement, as the piece's header here).
Any piece that does not parse, any header or footer out of place, a file whose newlines or
indentation the pieces would read differently, and the whole file is parsed at once, as libcst
does (which also gives a broken file's error message).
"""

from __future__ import annotations

import ast
import re
import warnings

import libcst as cst
from libcst import native
from libcst._parser.detect_config import convert_to_utf8
from libcst._parser.types.config import PartialParserConfig

#: Lines a piece should have at least (files up to twice this long are parsed at once).
CHUNK_LINES = 1000


def parse_module(data: bytes, chunk_lines: int = CHUNK_LINES) -> cst.Module:
    """``libcst.parse_module(data)``, a piece at a time when ``data`` is long."""
    if data.count(b"\n") < 2 * chunk_lines or b"\r" in data:
        return cst.parse_module(data)
    encoding, text = convert_to_utf8(data, partial=PartialParserConfig())
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]  # (str.splitlines would also cut at form feeds and the like)
    pieces = _pieces(text, lines if lines[-1] else lines[:-1], chunk_lines)
    if len(pieces) < 2:
        return cst.parse_module(data)
    try:
        modules = [native.parse_module(piece, encoding) for piece in pieces]
    except Exception:  # noqa: BLE001 - a cut in the wrong place, or a broken file
        return cst.parse_module(data)
    joined = _join(modules, pieces)
    return joined if joined is not None else cst.parse_module(data)


def _pieces(text: str, lines: list[str], chunk_lines: int) -> list[str]:
    """``lines`` cut before top-level statements (CPython's ``ast`` says where they are), about
    ``chunk_lines`` lines apart, where only empty lines lie between the statements."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes and the like: not ours to say
            tree = ast.parse(text.removeprefix("\ufeff"))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    pieces: list[str] = []
    start = 0
    end = 0  # the line (1-based) the statement before ends on
    for stmt in tree.body:
        decorators = getattr(stmt, "decorator_list", None)
        first = decorators[0].lineno if decorators else stmt.lineno
        if (
            end and first > end and first - 1 - start >= chunk_lines
            and all(line == "\n" for line in lines[end:first - 1])
        ):
            pieces.append("".join(lines[start:end]))
            start = end  # the empty lines go with the statement after them, as libcst has it
        end = stmt.end_lineno or first
    if pieces and len(lines) - start < chunk_lines // 2:  # no short last piece
        pieces[-1] += "".join(lines[start:])
    else:
        pieces.append("".join(lines[start:]))
    return pieces


def _join(modules: list[cst.Module], pieces: list[str]) -> cst.Module | None:
    """One module of the pieces' statements, or None where a piece reads differently alone."""
    first, last = modules[0], modules[-1]
    indent = None
    body: list[cst.BaseStatement] = []
    for n, (module, piece) in enumerate(zip(modules, pieces, strict=True)):
        if module.default_newline != first.default_newline or not module.body:
            return None
        if re.search(r"^[ \t]", piece, re.MULTILINE):
            # Pieces with indented lines must find the file's indentation (the first piece with
            # any gives it, as the first indented line of the file does); pieces without any
            # hold nothing that depends on it.
            if indent is None:
                indent = module.default_indent
            elif module.default_indent != indent:
                return None
        if module is not last and (module.footer or not module.has_trailing_newline):
            return None
        stmts = list(module.body)
        if n and module.header:
            # Empty lines before the cut statement: libcst's whole-file parse gives them to it.
            if any(line.comment is not None or line.whitespace.value for line in module.header):
                return None
            stmts[0] = stmts[0].with_changes(
                leading_lines=[*module.header, *stmts[0].leading_lines]
            )
        body.extend(stmts)
    return first.with_changes(
        body=body, footer=last.footer, has_trailing_newline=last.has_trailing_newline,
        default_indent=indent if indent is not None else first.default_indent,
    )
