"""Keras model weights read before the model's first ``fit``.

``BroadcastGlobalVariablesCallback`` gives every worker rank 0's weights inside ``fit`` (at its
first batch). What the script reads of the model before that (``model.get_weights()``,
``model.save_weights(...)``, ``model.evaluate(...)``, ``model.predict(...)``, ``model.weights``)
differs per worker: each built its own random weights. ``weights_read_before_fit`` finds, for each
model, the first statement that reads them before its first ``fit``, in the block that runs that
``fit`` (so that every worker runs it: a broadcast is a collective), for
``broadcast_initial_state`` to broadcast rank 0's weights right before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .index import file_index
from .keras import keras_fit_calls
from .syntax import findall

if TYPE_CHECKING:
    from .model import FileModel

#: Methods of a Keras model that read its weights.
_READS = frozenset({"get_weights", "save", "save_weights", "evaluate", "predict",
                    "predict_on_batch", "test_on_batch"})
_ATTRS = frozenset({"weights", "trainable_weights", "variables", "trainable_variables"})


def weights_read_before_fit(fm: FileModel) -> list[tuple[cst.BaseStatement, str]]:
    """(the first statement that reads a model's weights before its first ``fit``, the model's
    name), one per model, in file order."""
    index = file_index(fm)
    found: dict[str, tuple[cst.BaseStatement, str]] = {}
    seen: set[int] = set()
    for fit in keras_fit_calls(fm):
        model = fit.func.value  # type: ignore[attr-defined]
        if not isinstance(model, cst.Name):
            continue
        binding = index.reaching(model.value, model)
        if binding is None or id(binding) in seen:
            continue
        seen.add(id(binding))
        statement = _statement(fm, fit)
        block = fm.parent(statement) if statement is not None else None
        if not isinstance(block, (cst.Module, cst.IndentedBlock)):
            continue
        body = list(block.body)
        position = body.index(statement)  # type: ignore[arg-type]
        for stmt in body[:position]:
            if index.is_before(stmt, binding.stmt) or stmt is binding.stmt:
                continue  # before the model exists (or where it is made)
            if _reads(fm, index, stmt, model.value, binding):
                found.setdefault(model.value, (stmt, model.value))
                break
    return sorted(found.values(), key=lambda s: index.order.get(id(s[0]), 0))


def _statement(fm: FileModel, node: cst.CSTNode) -> cst.BaseStatement | None:
    for parent in fm.ancestors(node):
        if isinstance(parent, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return parent
    return None


def _reads(fm: FileModel, index, stmt: cst.CSTNode, name: str, binding) -> bool:
    for attr in findall(stmt, m.Attribute(value=m.Name(name))):
        assert isinstance(attr, cst.Attribute)
        if index.reaching(name, attr.value) is not binding:
            continue
        parent = fm.parent(attr)
        called = isinstance(parent, cst.Call) and parent.func is attr
        if (called and attr.attr.value in _READS) or (
            not called and attr.attr.value in _ATTRS
        ):
            return True
    return False
