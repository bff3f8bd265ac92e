"""Data the script splits between the data-parallel ranks itself, by a rank it asks for.

SageMaker model-parallel (SMP) scripts give each replica its part of the data without a
``DistributedSampler`` in view: torchnet's ``SplitDataset(ds, partitions).select(
f"{smp.dp_rank()}")``, or a loader made by the project's own factory given the rank
(``create_pretraining_dataloader(paths, ..., dp_rank=smp.dp_rank(), dp_size=smp.dp_size())``).
Here such a split is recognised:

* ``split_by_rank(fm, loader)``: the dataset a ``DataLoader`` reads was narrowed to this rank's
  part (a ``.select(...)`` of it, or the call that made it, is given a data-parallel rank);
* ``made_for_rank(fm, iterable)``: what a training loop iterates was made by a call given a
  data-parallel rank (a loader factory);

where a data-parallel rank is a global rank call (``ranks.RANK_FUNCTIONS``), SMP's ``dp_rank()``
or ``rdp_rank()`` (of ``smdistributed.modelparallel`` or of the runtime's SMP modules), or a name
assigned one (``dp_rank = smp.dp_rank() if ... else smp.rdp_rank()``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .index import file_index
from .ranks import RANK_FUNCTIONS
from .scopes import assigned_values
from .syntax import code, findall

if TYPE_CHECKING:
    from .model import FileModel

_SMP_MODULES = (
    "smdistributed.modelparallel.torch", "smdistributed.modelparallel.tensorflow",
    "sdp_runtime.torch.smp", "sdp_runtime.tensorflow.smp",
)
#: Calls whose result is this process's index among the data-parallel replicas.
DATA_RANK_FUNCTIONS = (
    *RANK_FUNCTIONS,
    *(f"{module}.{name}" for module in _SMP_MODULES for name in ("dp_rank", "rdp_rank")),
)
#: ``enumerate(loader)``, ``iter(loader)``, ``tqdm(loader)``: the loader is what is iterated.
_ITERATION_WRAPPERS = ("builtins.enumerate", "builtins.iter", "tqdm.tqdm", "tqdm.auto.tqdm")


#: The names of a project's own helpers that give the rank (``dist_utils.get_rank()``, the
#: pattern of detectron2, DETR, timm and the reference scripts: torch.distributed's rank once
#: it is set up, else 0).
_RANK_HELPERS = frozenset({"get_rank", "get_global_rank", "dp_rank", "rdp_rank"})


def mentions_data_rank(fm: FileModel, expr: cst.CSTNode, depth: int = 0) -> bool:
    """Whether ``expr`` calls a data-parallel rank function (or a helper named like one), or
    reads a name assigned one."""
    for call in findall(expr, m.Call()):
        assert isinstance(call, cst.Call)
        if fm.refers_to(call.func, *DATA_RANK_FUNCTIONS):
            return True
        func = call.func
        name = func.attr.value if isinstance(func, cst.Attribute) else (
            func.value if isinstance(func, cst.Name) else "")
        if name in _RANK_HELPERS:
            return True
    if depth > 2:
        return False
    for name in findall(expr, m.Name()):
        assert isinstance(name, cst.Name)
        values = assigned_values(fm, name) if fm.parent(name) is not None else []
        if any(v is not expr and mentions_data_rank(fm, v, depth + 1) for v in values):
            return True
    return False


def split_by_rank(fm: FileModel, loader: cst.Call) -> bool:
    """Whether the dataset ``loader`` reads (its first argument, or ``dataset=``) is this rank's
    part: a call on it (``dataset.select(f"{smp.dp_rank()}")``) or the call it was assigned
    from is given a data-parallel rank."""
    dataset = next((a.value for a in loader.args if a.keyword is None and not a.star), None)
    dataset = dataset or next((a.value for a in loader.args
                               if a.keyword is not None and a.keyword.value == "dataset"), None)
    if not isinstance(dataset, cst.Name):
        return False
    if any(isinstance(v, cst.Call) and _given_rank(fm, v) for v in assigned_values(fm, dataset)):
        return True
    # ``dataset.select(rank)`` in the loader's scope: its reads of the name, from the file's
    # index (walking the scope for each loader was quadratic in a long notebook's loaders).
    for read in file_index(fm).loads_of(dataset.value, fm.enclosing_function(loader)):
        attribute = fm.parent(read)
        call = fm.parent(attribute) if isinstance(attribute, cst.Attribute) else None
        if isinstance(call, cst.Call) and call.func is attribute and _given_rank(fm, call):
            return True
    return False


def made_for_rank(fm: FileModel, iterable: cst.BaseExpression) -> bool:
    """Whether ``iterable`` (what a ``for`` loop iterates, through ``enumerate``/``iter``/``tqdm``)
    was made by a call given a data-parallel rank (a loader factory: ``dp_rank=...``)."""
    while (isinstance(iterable, cst.Call) and iterable.args
           and fm.refers_to(iterable.func, *_ITERATION_WRAPPERS)):
        iterable = iterable.args[0].value
    if isinstance(iterable, cst.Call):
        return _given_rank(fm, iterable)
    if isinstance(iterable, cst.Name):
        values = assigned_values(fm, iterable)
        return bool(values) and all(isinstance(v, cst.Call) and _given_rank(fm, v)
                                    for v in values)
    return False


def _given_rank(fm: FileModel, call: cst.Call) -> bool:
    return any(mentions_data_rank(fm, arg.value) for arg in call.args) or any(
        arg.keyword is not None and arg.keyword.value in ("dp_rank", "rdp_rank")
        and not code(arg.value).isdigit()
        for arg in call.args
    )
