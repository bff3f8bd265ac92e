"""Training data read through a legacy torchtext iterator, and whether its examples can be split.

``BucketIterator(train, batch_size=..., device=..., train=True)`` (``torchtext.data`` before
0.9, ``torchtext.legacy.data`` until 0.12) batches and shuffles the ``examples`` list of the
``Dataset`` it is given; it takes no sampler. Such an iterator feeding a training loop is split by
handing it this rank's part of the examples, ``sdp.shard(train)`` (the runtime's copy of the
dataset with every ``size()``-th example, ``ceil(n / size())`` on every rank, padded as
``DistributedSampler`` pads); its own shuffle then runs on each rank's part. That is right only
where the examples are in the same order on every rank, so a split is planned only where

* the iterator's loops are all training loops (``program.flow.loader_sites``; an iterator that
  also, or only, feeds evaluation stays whole);
* its dataset is a name bound, once, to a constructor of a torchtext dataset class that reads
  its examples in order (``Dataset(examples=...)``, ``TranslationDataset(path=..., exts=...)``,
  ``TabularDataset(...)``), never to ``.split()`` (a random split, per process unless seeded) nor
  to anything else, and no argument of that constructor draws a random number or shuffles;
* the iterator is not given ``batch_size_fn=`` (batches counted in tokens would differ in number
  between the ranks, and the ranks' gradient averaging would wait for a batch that never comes),
  nor ``**kwargs``.

``example_splits`` answers, for each iterator call of the file that feeds training, with the
dataset argument to split and whether it is split already (``sdp.shard(train)``: a second
conversion changes nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .flow import loader_sites
from .scopes import assigned_values, training_loops
from .syntax import findall

if TYPE_CHECKING:
    from .model import FileModel

_PACKAGES = ("torchtext.data", "torchtext.legacy.data")
#: The iterators that batch a dataset's ``examples`` (not ``BPTTIterator``: it cuts one text).
ITERATORS = tuple(
    f"{package}{module}.{name}" for package in _PACKAGES for module in ("", ".iterator")
    for name in ("Iterator", "BucketIterator")
)
#: Dataset classes whose examples are given, or read from files, in order.
DATASETS = (
    *(f"{package}{module}.{name}" for package in _PACKAGES for module in ("", ".dataset")
      for name in ("Dataset", "TabularDataset")),
    *(f"{package}{module}.TranslationDataset" for package in (
        "torchtext.datasets", "torchtext.legacy.datasets") for module in ("", ".translation")),
)
_RANDOM = ("random.", "numpy.random.", "torch.rand", "torch.randperm", "sklearn.utils.shuffle",
           "sklearn.model_selection.train_test_split")
_SHUFFLING = frozenset({"shuffle", "sample", "permutation", "split", "random_split"})


@dataclass(frozen=True)
class ExampleSplit:
    """An iterator call feeding training and the dataset argument it is to be given split."""

    iterator: cst.Call
    #: The dataset argument (``train``, or ``sdp.shard(train)`` where split already).
    dataset: cst.Arg
    done: bool
    #: The loops it feeds (all of them training loops).
    loops: tuple[cst.CSTNode, ...]


def example_splits(fm: FileModel) -> list[ExampleSplit]:
    """The legacy torchtext iterators of the file that feed training and can be split."""
    found = []
    calls = fm.calls_to(*ITERATORS)
    training = training_loops(fm) if calls else set()
    for call in calls:
        split = _split(fm, call, training)
        if split is not None:
            found.append(split)
    return found


def _split(fm: FileModel, call: cst.Call, training: set) -> ExampleSplit | None:
    if any(a.star for a in call.args) or any(
        a.keyword is not None and a.keyword.value == "batch_size_fn" for a in call.args
    ):
        return None
    arg = next((a for a in call.args if a.keyword is None), None) or next(
        (a for a in call.args if a.keyword is not None and a.keyword.value == "dataset"), None)
    if arg is None:
        return None
    value, done = arg.value, False
    if isinstance(value, cst.Call) and len(value.args) == 1 and fm.refers_to(
        value.func, "sdp_runtime.torch.shard"
    ):
        value, done = value.args[0].value, True
    if not isinstance(value, cst.Name):
        return None
    made = assigned_values(fm, value)
    if len(made) != 1 or not isinstance(made[0], cst.Call) or not fm.refers_to(
        made[0].func, *DATASETS
    ) or _shuffles(fm, made[0], 0):
        return None
    sites, _ = loader_sites(fm, call)
    loops = tuple(site.loop for site in sites)
    if not loops or any(loop not in training for loop in loops):
        return None
    return ExampleSplit(call, arg, done, loops)


def _shuffles(fm: FileModel, node: cst.CSTNode, depth: int) -> bool:
    """Whether ``node`` (or, two names deep, what the names it reads were assigned) draws a
    random number or reorders: then the examples may differ in order between the ranks."""
    for call in findall(node, m.Call()):
        assert isinstance(call, cst.Call)
        func = call.func
        name = func.attr.value if isinstance(func, cst.Attribute) else (
            func.value if isinstance(func, cst.Name) else "")
        if name in _SHUFFLING or any(q.startswith(_RANDOM) for q in fm.qualified_names(func)):
            return True
    if depth >= 2:
        return False
    for name in findall(node, m.Name()):
        assert isinstance(name, cst.Name)
        if fm.parent(name) is None:
            continue
        if any(v is not node and _shuffles(fm, v, depth + 1) for v in assigned_values(fm, name)):
            return True
    return False


def split_example_loops(fm: FileModel, will: bool) -> set[int]:
    """The training loops (by id) that read a split iterator's examples: split already, or (when
    ``will``: the transform is on) split by this conversion."""
    return {id(loop) for split in example_splits(fm) if split.done or will
            for loop in split.loops}
