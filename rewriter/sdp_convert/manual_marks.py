"""Manual notes that stay in the file: ``# sdp-convert: manual - <what to do>`` comments.

A converted file is "already uses sdp_runtime" to every later run, which has nothing left to say
about it: the manual notes of the conversion would be printed once and then be gone, while the
pre-commit rewrite hook makes converting in place the normal path. So a conversion that changes
a file also writes each manual note into it, as a comment line just above the statement it is
about (same indentation)::

    # sdp-convert: manual - SGD: 0.1 left as it is: no sharded training data was found; ...
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

and every run reports each such comment it finds as a manual item (``MARKER``), until a person
does what it says and deletes the comment. ``--check`` fails on them unless
``--allow-manual-markers`` is given (``cli``).

``apply`` is called on every conversion the command line and the Python API make
(``runner.convert_bytes``, and ``notebook`` on the joined cells), after the engine's own checks:
the notes are comments, which no transform reads, so the output stays a fixed point (the golden
tests convert each ``expected.py`` again through the same path). ``write`` is given the original
source, its (formatted) conversion and the conversion's changes,
whose lines are the original's; it finds the matching line of the output by a line diff, then the
start of the logical line (statement) holding it, so a comment never lands inside a bracket or a
string. A note already written there (a file converted again) is not written twice. ``read``
finds the comments by ``tokenize``, so text inside a string never counts.
"""

from __future__ import annotations

import difflib
import io
import re
import tokenize
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .changes import Change

if TYPE_CHECKING:
    from .engine import Result

#: The transform name manual items read from marker comments are reported under.
MARKER = "manual_marker"
PREFIX = "# sdp-convert: manual - "
_COMMENT = re.compile(r"#\s*sdp-convert:\s*manual\s*-\s*(.*\S)")
_NEEDLE = b"sdp-convert: manual"


def _text(data: bytes) -> tuple[str, str] | None:
    """The source as text and its encoding; None when it cannot be decoded."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding), encoding
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return None


def read(data: bytes) -> list[Change]:
    """A manual item for each marker comment in ``data`` (at the comment's line and column)."""
    if _NEEDLE not in data:
        return []
    decoded = _text(data)
    if decoded is None:
        return []
    found = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(decoded[0]).readline):
            if tok.type == tokenize.COMMENT and (match := _COMMENT.match(tok.string)):
                found.append(Change(tok.start[0], tok.start[1] + 1, MARKER,
                                    f"{match.group(1)} (delete this comment when done)",
                                    manual=True))
    except (tokenize.TokenError, SyntaxError):
        return []
    return found


def apply(data: bytes, result: Result) -> Result:
    """``result`` (the engine's conversion of ``data``) with the markers of ``data`` reported
    and, when the conversion changes the file, its manual notes written into the output."""
    result.changes = merge(data, result.changes)
    if result.changed:
        result.output = write(data, result.output, result.changes)
    return result


def merge(data: bytes, changes: Sequence[Change]) -> list[Change]:
    """``changes`` plus the markers of ``data`` that do not repeat one of them."""
    said = {c.message for c in changes if c.manual}
    extra = [c for c in read(data) if c.message.removesuffix(_DONE) not in said]
    return sorted([*changes, *extra]) if extra else list(changes)


_DONE = " (delete this comment when done)"


def _statements(text: str) -> list[tuple[int, int]]:
    """``(first row, last row)`` of each logical line (statement) of ``text``, 1-based."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    skip = (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if start is None:
            if tok.type in skip or tok.type == tokenize.ENDMARKER:
                continue
            start = tok.start[0]
        if tok.type == tokenize.NEWLINE:
            spans.append((start, tok.end[0]))
            start = None
    return spans


def write(source: bytes, output: bytes, changes: Sequence[Change]) -> bytes:
    """``output`` with a marker comment above each statement a manual change of ``changes``
    is about (lines of ``source``); ``output`` itself when there is none or it cannot be
    placed safely."""
    manual = [c for c in changes if c.manual and c.transform != MARKER]
    if not manual:
        return output
    before, after = _text(source), _text(output)
    if before is None or after is None:
        return output
    text, encoding = after
    old = before[0].splitlines(keepends=True)
    new = text.splitlines(keepends=True)
    try:
        spans = _statements(text)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return output
    if not spans:
        return output
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    blocks = matcher.get_opcodes()

    def mapped(line: int) -> int:
        """The output row (1-based) of the source's ``line``."""
        for tag, i1, i2, j1, _j2 in blocks:
            if i1 <= line - 1 < i2:  # inserts hold no line of the source
                return j1 + (line - 1 - i1) + 1 if tag == "equal" else j1 + 1
        return len(new)

    inserts: dict[int, list[str]] = {}
    for change in manual:
        row = mapped(change.line)
        # The statement holding the row, or the next one (a comment or blank line).
        span = next((s for s in spans if s[0] <= row <= s[1]), None)
        span = span or next((s for s in spans if s[0] > row), spans[-1])
        at = span[0] - 1
        line = new[at]
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        note = PREFIX + " ".join(change.message.split())
        already = {ln.strip() for ln in new[max(at - 8, 0):at]}
        mine = inserts.setdefault(at, [])
        if note not in already and indent + note not in mine:
            mine.append(indent + note)
    if not any(inserts.values()):
        return output
    newline = "\r\n" if new and new[0].endswith("\r\n") else "\n"
    lines: list[str] = []
    for i, line in enumerate(new):
        lines.extend(n + newline for n in inserts.get(i, []))
        lines.append(line)
    return "".join(lines).encode(encoding)
