"""Build the program layer's view of a snippet, as the engine does for a file: its FileModel."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from sdp_convert.program.model import FileModel


def probe(source: str) -> FileModel:
    """The program model of ``source`` (dedented), built on its own: no transform, no engine."""
    return FileModel.from_source(source, dedent=True)


def code(fm: FileModel, node: cst.CSTNode) -> str:
    return fm.module.code_for_node(node).strip()


def find(fm: FileModel, matcher: m.BaseMatcherNode, text: str | None = None) -> cst.CSTNode:
    """The first node matching ``matcher`` (whose code is ``text``, if given)."""
    for node in m.findall(fm.module, matcher):
        if text is None or code(fm, node) == text:
            return node
    raise AssertionError(f"no {matcher} {text!r} in the snippet")
