"""torch.utils.data as data: which calls make loaders, samplers and streaming datasets, and the
questions about them (is this sampler distributed, is this dataset a stream)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from .index import Binding
from .scopes import _self_attribute_values, assigned_values, referents, uses
from .syntax import is_false, is_movable, literal_keys

if TYPE_CHECKING:
    from .model import FileModel

LOADERS = ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")


DISTRIBUTED_SAMPLERS = (
    "torch.utils.data.distributed.DistributedSampler",
    "torch.utils.data.DistributedSampler",
)


# Datasets a sampler cannot index: they must shard themselves.
_ITERABLE_DATASETS = (
    "torch.utils.data.IterableDataset",
    "torch.utils.data.dataset.IterableDataset",
    "torch.utils.data.ChainDataset",
    "torch.utils.data.dataset.ChainDataset",
    "datasets.IterableDataset",
)


_ITERABLE_PREFIXES = ("torchdata.", "webdataset.", "torch.utils.data.datapipes.")


def is_distributed_sampler(fm: FileModel, expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.IfExp):
        return is_distributed_sampler(fm, expr.body) or is_distributed_sampler(fm, expr.orelse)
    if isinstance(expr, cst.Call):
        return fm.refers_to(expr.func, *DISTRIBUTED_SAMPLERS)
    if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name):
        if expr.value.value == "self":
            return any(
                is_distributed_sampler(fm, v) for v in _self_attribute_values(fm, expr)
            )
        return False
    if isinstance(expr, cst.Name):
        return any(is_distributed_sampler(fm, v) for v in assigned_values(fm, expr))
    return False


def is_iterable_dataset(fm: FileModel, expr: cst.BaseExpression) -> bool:
    values: list[cst.BaseExpression] = [expr]
    if isinstance(expr, cst.Name):
        values = assigned_values(fm, expr)
    for value in values:
        if not isinstance(value, cst.Call):
            continue
        if fm.refers_to(value.func, "datasets.load_dataset") and any(
            a.keyword is not None and a.keyword.value == "streaming" and not is_false(a.value)
            for a in value.args
        ):
            return True
        if _is_iterable_class(fm, value.func, 0):
            return True
    return False


def _is_iterable_class(fm: FileModel, func: cst.BaseExpression, depth: int) -> bool:
    names = fm.qualified_names(func)
    if any(n in _ITERABLE_DATASETS or n.startswith(_ITERABLE_PREFIXES) for n in names):
        return True
    if depth > 3 or not isinstance(func, cst.Name):
        return False
    for assignment in referents(fm, func):
        cls = getattr(assignment, "node", None)
        if isinstance(cls, cst.ClassDef) and any(
            _is_iterable_class(fm, base.value, depth + 1) for base in cls.bases
        ):
            return True
    return False


def kwargs_literal(fm: FileModel, value: cst.BaseExpression) -> tuple[cst.Dict, int | None] | None:
    """``kw`` bound once to a dict literal that nothing else can add "shuffle" to."""
    if not isinstance(value, cst.Name):
        return None
    refs = referents(fm, value)
    if len(refs) != 1:
        return None
    (assignment,) = refs
    dict_node = _assigned_dict(fm, assignment)
    if dict_node is None:
        return None
    keys = literal_keys(dict_node)
    if keys is None:
        return None
    for use in uses(fm, assignment):
        if use is value:
            continue
        parent = fm.parent(use)
        if isinstance(parent, cst.Arg) and parent.star == "**":
            continue  # splatted into another call: fine
        if not (isinstance(parent, cst.Attribute) and parent.value is use):
            return None
        method = parent.attr.value
        if method in ("get", "copy", "items", "keys", "values"):
            continue
        if method != "update":
            return None
        update = fm.parent(parent)
        if not isinstance(update, cst.Call) or not all(
            a.keyword is None and not a.star and _dict_without_shuffle(fm, a.value)
            for a in update.args
        ):
            return None
    shuffle = [i for i, key in enumerate(keys) if key == "shuffle"]
    if shuffle and not is_movable(dict_node.elements[shuffle[0]].value):
        return None
    return dict_node, (shuffle[0] if shuffle else None)


def _dict_without_shuffle(fm: FileModel, expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.Name):
        refs = referents(fm, expr)
        if len(refs) != 1:
            return False
        found = _assigned_dict(fm, next(iter(refs)))
        if found is None:
            return False
        expr = found
    keys = literal_keys(expr) if isinstance(expr, cst.Dict) else None
    return keys is not None and "shuffle" not in keys


def _assigned_dict(fm: FileModel, assignment: Binding) -> cst.Dict | None:
    target = getattr(assignment, "node", None)
    holder = fm.parent(target) if target is not None else None
    assign = fm.parent(holder) if isinstance(holder, cst.AssignTarget) else None
    if (
        isinstance(assign, cst.Assign)
        and len(assign.targets) == 1
        and isinstance(assign.value, cst.Dict)
    ):
        return assign.value
    return None


def loader_base_name(binding: Binding | None) -> str:
    """``train_loader`` -> ``train``; ``loader`` -> ``loader``; unknown -> ``train``."""
    if binding is None:
        return "train"
    name = binding.attr if binding.cls is not None else binding.name
    for suffix in ("_dataloader", "_loader"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def sets_epoch(fm: FileModel, loop: cst.For | cst.While, receiver: str) -> bool:
    """Whether ``loop`` calls ``<receiver>.set_epoch(...)`` (``receiver`` as code) already."""
    for call in fm.method_calls("set_epoch"):
        assert isinstance(call.func, cst.Attribute)
        if fm.module.code_for_node(call.func.value) == receiver and any(
            a is loop for a in fm.ancestors(call)
        ):
            return True
    return False

