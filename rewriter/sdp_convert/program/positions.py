"""Where nodes start (line and column), from one code generation of the module.

libcst's ``PositionProvider`` tracks line and column for every token and every node (about twice
the cost of parsing); a report needs the start of a handful of nodes. ``node_positions`` records,
during one code generation, the token index at which each target node starts, then counts lines
and columns through the text once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import libcst as cst
from libcst._nodes.internal import CodegenState


class _AllFound(Exception):
    """Every target's code is generated: the rest of the module's is not needed."""


class _TargetPositions(CodegenState):
    """Code generation that notes where a few target nodes start, and nothing else.

    libcst's ``PositionProvider`` tracks line and column for every token and every node (about
    twice the cost of parsing); the report needs the start of a handful of nodes. Here a target's
    start is its token index; line and column come from the text before it.
    """

    def __init__(self, module: cst.Module, targets: set[int]) -> None:
        super().__init__(
            default_indent=module.default_indent, default_newline=module.default_newline
        )
        self.targets = targets
        self.left = set(targets)  # the targets whose code generation has not ended yet
        self.starts: dict[int, int] = {}
        self.fallback: dict[int, int] = {}  # where codegen of a node began, whitespace included

    def before_codegen(self, node: cst.CSTNode) -> None:
        if id(node) in self.targets:
            self.fallback.setdefault(id(node), len(self.tokens))

    def after_codegen(self, node: cst.CSTNode) -> None:
        """A target's start is final once its own code generation ends (its ``starts`` and
        ``fallback`` entries are set during it, first come first kept): once every target's
        has ended, stop (nothing after them moves where they start)."""
        if id(node) in self.left:
            self.left.discard(id(node))
            if not self.left:
                raise _AllFound

    @contextlib.contextmanager
    def record_syntactic_position(
        self,
        node: cst.CSTNode,
        *,
        start_node: cst.CSTNode | None = None,
        end_node: cst.CSTNode | None = None,
    ) -> Iterator[None]:
        key = id(node)
        if key in self.targets and start_node is not None:
            self.targets.add(id(start_node))  # its start is the child's (an indented block's)
        elif key in self.targets:
            self.starts.setdefault(key, len(self.tokens))
        yield
        if key in self.targets and start_node is not None and id(start_node) in self.starts:
            self.starts.setdefault(key, self.starts[id(start_node)])


def node_positions(module: cst.Module, targets: set[int]) -> dict[int, tuple[int, int]]:
    """``{id(node): (line, column)}`` (line 1-based, column 0-based) of the start of each node of
    ``module`` whose id is in ``targets``, from one code generation (no ``PositionProvider``),
    stopped once the last target's ends (``tests/program/test_positions.py``: the same answers
    as the whole generation)."""
    state = _TargetPositions(module, set(targets))
    with contextlib.suppress(_AllFound):
        module._codegen(state)
    # Line and column of each target's first token, counting through the text once.
    where: dict[int, tuple[int, int]] = {}
    line, col, done = 1, 0, 0
    starts = {**state.fallback, **state.starts}
    for index, key in sorted((index, key) for key, index in starts.items()):
        text = "".join(state.tokens[done:index])
        newlines = text.count("\n")
        if newlines:
            line += newlines
            col = len(text) - text.rfind("\n") - 1
        else:
            col += len(text)
        done = index
        where[key] = (line, col)
    return where


