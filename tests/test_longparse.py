"""A long file is parsed a piece at a time (``sdp_convert.longparse``, peak memory, issue 39):
the tree must be the one libcst's whole-file parse gives, node for node, on every file the
converter's tests hold and on the benchmark's long shapes, cut into small pieces so that every
kind of boundary they have is crossed."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from sdp_convert import longparse

from .test_scale import _scale_inputs

ROOT = Path(__file__).resolve().parents[1]


def _sources() -> list[tuple[str, bytes]]:
    files = sorted([*ROOT.glob("fixtures/*/*/input.py"),
                    *ROOT.glob("fixtures/projects/*/input/**/*.py"),
                    *ROOT.glob("tests/e2e/real/scripts/*.py")])
    inputs = _scale_inputs()
    return [(str(f.relative_to(ROOT)), f.read_bytes()) for f in files] + [
        ("blocks", inputs.training_blocks(200).encode()),
        ("helpers", inputs.flat_helpers(200).encode()),
        ("appended", inputs.appended_functions(30).encode()),
        # Indentation first met in a later piece, empty lines and comments between statements,
        # a decorator, a docstring with lines at column 0, no newline at the end.
        ("mixed", (b'"""Doc.\n\ntext at column 0\n"""\nimport os\nx = 1\ny = 2\n\n\nz = 3\n'
                   b"# about f\n@decorator\ndef f():\n  return 1\n\n\nclass C:\n  pass\n"
                   b"  # C's own\n\nw = [\n1,\n]\nif w:\n  pass\nelse:\n  pass\nv = 1")),
    ]


def test_the_pieces_join_into_libcsts_own_tree():
    compared = cut = 0
    for name, data in _sources():
        whole = cst.parse_module(data)
        for chunk_lines in (3,):
            joined = longparse.parse_module(data, chunk_lines)
            assert joined.deep_equals(whole), (name, chunk_lines)
            assert (joined.bytes, joined.encoding, joined.default_indent,
                    joined.default_newline, joined.has_trailing_newline) == (
                whole.bytes, whole.encoding, whole.default_indent, whole.default_newline,
                whole.has_trailing_newline), (name, chunk_lines)
            compared += 1
            text = data.decode()
            lines = [line + "\n" for line in text.split("\n")]
            cut += len(longparse._pieces(text, lines, chunk_lines))
    assert compared > 200 and cut > 5 * compared  # the files were cut, not parsed whole


def test_a_long_file_is_cut_and_a_broken_one_gets_libcsts_error():
    inputs = _scale_inputs()
    text = inputs.training_blocks(3000)
    lines = [line + "\n" for line in text.split("\n")][:-1]
    assert len(longparse._pieces(text, lines, longparse.CHUNK_LINES)) >= 2
    with pytest.raises(cst.ParserSyntaxError):
        longparse.parse_module((text + "x = (\n").encode())
