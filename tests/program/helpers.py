"""Build the program layer's view of a snippet, as the engine does for a file."""

from __future__ import annotations

import textwrap

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.metadata import MetadataWrapper
from sdp_convert.analysis import detect
from sdp_convert.base import FileState, Options, Transform
from sdp_convert.engine import _resolve
from sdp_convert.program.index import index_module
from sdp_convert.program.model import FileModel


class Probe(Transform):
    """A transform that changes nothing: a handle on the program layer for one file."""

    DESCRIPTION = "test probe"


def probe(source: str) -> Probe:
    module = cst.parse_module(textwrap.dedent(source))
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    index = index_module(module)
    metadata = _resolve(wrapper, index)
    info = detect(module, metadata, "auto", False)
    state = FileState(model=FileModel(module, info, index), options=Options())
    transform = Probe(CodemodContext(wrapper=wrapper), state)
    transform.metadata = metadata  # type: ignore[assignment]
    return transform


def code(t: Transform, node: cst.CSTNode) -> str:
    return t.module.code_for_node(node).strip()


def find(t: Transform, matcher: m.BaseMatcherNode, text: str | None = None) -> cst.CSTNode:
    """The first node matching ``matcher`` (whose code is ``text``, if given)."""
    for node in m.findall(t.module, matcher):
        if text is None or code(t, node) == text:
            return node
    raise AssertionError(f"no {matcher} {text!r} in the snippet")
