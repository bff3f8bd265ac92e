"""Training data cut from one long tensor of token ids, column by column, and how it is split.

The word-level language model of the PyTorch tutorials reshapes its corpus into ``batch_size``
rows (``ids = corpus.get_data(path, batch_size)``: row ``j`` is the ``j``-th contiguous stretch of
the token stream) and trains on its columns in order, carrying the LSTM's states from one window
to the next (truncated back-propagation through time)::

    for i in range(0, ids.size(1) - seq_length, seq_length):
        inputs = ids[:, i:i+seq_length]
        targets = ids[:, (i+1):(i+1)+seq_length]

Split between N ranks along the time axis, each rank an equal, contiguous stretch of columns
(``ids.narrow(1, rank * w, w)``, ``w = ids.size(1) // N``), every rank has ``batch_size`` rows of
``w`` columns: the rows are the ``N * batch_size`` contiguous stretches of length ``w`` that one
process would make of the stream with a batch of ``N * batch_size`` (row ``j`` of rank ``r`` is
that process's row ``j * N + r``), so each step's averaged gradient is that process's (the same
windows, the states carried along each row the same way), and every rank takes the same number
of steps. What differs: up to ``N - 1`` tokens at the end of each row are left out (the width is
cut to a multiple of N) instead of the stream's last tokens.

``stream_splits`` finds the tensor and the loops; only where

* a training ``for`` loop runs over ``range(..., X.size(1) ..., ...)`` (a torch tensor: the split
  is ``X.narrow(1, ...)``) and every subscript of ``X`` in its body is
  ``X[:, <slice using the loop variable>]``;
* ``X`` is bound once, by a plain assignment statement (``ids = corpus.get_data(...)``), and read
  nowhere else than in such loops and in ``X.size(1)`` / ``X.shape[1]`` (a step count), so
  nothing evaluates on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .index import Binding
from .rank_splits import mentions_data_rank
from .scopes import referents, training_loops, uses
from .syntax import findall

if TYPE_CHECKING:
    from .model import FileModel


@dataclass(frozen=True)
class StreamSplit:
    """A tensor of token ids whose columns the training loops read in order."""

    name: str
    #: The statement binding it (``ids = corpus.get_data(...)``), after which it is split.
    statement: cst.SimpleStatementLine
    loops: tuple[cst.For, ...]
    #: Split already (``ids = ids.narrow(1, sdp.rank() * ..., ...)``).
    done: bool


def stream_splits(fm: FileModel) -> list[StreamSplit]:
    """The tensors of token ids the training loops slice column by column, each with the
    statement that binds it and those loops; none where any such loop's tensor is bound in
    more than one place."""
    found: dict[int, tuple[str, cst.SimpleStatementLine, Binding, list[cst.For]]] = {}
    for loop in training_loops(fm):
        if not isinstance(loop, cst.For) or not isinstance(loop.target, cst.Name):
            continue
        name = _width_of(fm, loop.iter)
        if name is None or not _slices_columns(loop, name):
            continue
        bindings = referents(fm, name)
        line = _plain(fm, bindings[0]) if len(bindings) == 1 else None
        if line is None:
            return []
        found.setdefault(id(line), (name.value, line, bindings[0], []))[3].append(loop)
    splits = []
    for name, line, binding, loops in found.values():
        done = mentions_data_rank(fm, binding.value)  # type: ignore[arg-type]
        if done or _read_only_in(fm, binding, loops):
            splits.append(StreamSplit(name, line, tuple(loops), done))
    return splits


def _plain(fm: FileModel, binding: Binding) -> cst.SimpleStatementLine | None:
    """The line of ``X = <call>``, a statement of its own, binding the tensor; None otherwise."""
    line = fm.parent(binding.stmt)
    if binding.kind == "assign" and not binding.unpacked and isinstance(
        binding.stmt, cst.Assign
    ) and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(
        binding.value, cst.Call
    ):
        return line
    return None


def _width_of(fm: FileModel, it: cst.BaseExpression) -> cst.Name | None:
    """``X`` of ``range(..., X.size(1) ..., ...)`` / ``X.shape[1]``."""
    if not (isinstance(it, cst.Call) and fm.refers_to(it.func, "builtins.range") and it.args):
        return None
    names = [n for arg in it.args for n in _widths(arg.value, shape=False)]
    return names[0] if len(names) == 1 else None


def _widths(node: cst.CSTNode, shape: bool = True) -> list[cst.Name]:
    """The ``X`` of each ``X.size(1)`` in ``node`` (and of ``X.shape[1]`` with ``shape``)."""
    found = []
    for call in findall(node, m.Call(func=m.Attribute(attr=m.Name("size")))):
        assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
        if (isinstance(call.func.value, cst.Name) and len(call.args) == 1
                and m.matches(call.args[0].value, m.Integer("1"))):
            found.append(call.func.value)
    for sub in findall(node, m.Subscript(value=m.Attribute(attr=m.Name("shape")))) if shape else ():
        assert isinstance(sub, cst.Subscript) and isinstance(sub.value, cst.Attribute)
        if isinstance(sub.value.value, cst.Name) and len(sub.slice) == 1 and m.matches(
            sub.slice[0].slice, m.Index(value=m.Integer("1"))
        ):
            found.append(sub.value.value)
    return found


def _slices_columns(loop: cst.For, name: cst.Name) -> bool:
    """Every subscript of ``name`` in the loop's body is ``name[:, <slice of the loop var>]``,
    and there is one."""
    counter = loop.target.value  # type: ignore[attr-defined]
    subs = [s for s in findall(loop.body, m.Subscript(value=m.Name(name.value)))]
    for sub in subs:
        assert isinstance(sub, cst.Subscript)
        if len(sub.slice) != 2:
            return False
        rows, columns = sub.slice[0].slice, sub.slice[1].slice
        if not (isinstance(rows, cst.Slice) and rows.lower is None and rows.upper is None
                and rows.step is None and isinstance(columns, cst.Slice)):
            return False
        if not findall(columns, m.Name(counter)):
            return False
    return bool(subs)


def _read_only_in(fm: FileModel, binding: Binding, loops: list[cst.For]) -> bool:
    """The tensor is read only in ``loops`` and in ``X.size(1)`` / ``X.shape[1]``."""
    for use in uses(fm, binding):
        if any(a is loop for loop in loops for a in fm.ancestors(use)):
            continue
        around = fm.parent(fm.parent(use))
        if around is not None and any(use is w for w in _widths(around)):
            continue
        return False
    return True
