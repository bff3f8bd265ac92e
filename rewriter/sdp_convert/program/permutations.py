"""Random orders made before the data is split between workers.

``idx = np.random.permutation(len(x)); x, y = x[idx], y[idx]`` and then every ``size()``-th
sample of ``x`` per worker: without a seed each worker permutes differently, so the workers'
parts overlap and some samples are never seen (and synthetic data drawn without a seed differs
between workers altogether). ``unseeded_orders`` finds such draws behind the arrays that the
conversion splits: draws that can be made the same on every worker (rank 0's, broadcast) and
in-place shuffles (``np.random.shuffle``, ``sklearn.utils.shuffle``,
``train_test_split`` without ``random_state``) and Keras folder readers that shuffle with no seed
(arrays computed by going through ``image_dataset_from_directory(folder)``) that a person must
seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .index import FileIndex, file_index
from .keras import keras_names
from .syntax import arg_named, code, findall

if TYPE_CHECKING:
    from .model import FileModel

#: Not draws from numpy's global generator: seeding, in-place shuffling, generator types.
_NOT_DRAWS = frozenset(
    {"seed", "shuffle", "default_rng", "RandomState", "Generator", "get_state", "set_state",
     "SeedSequence", "PCG64", "MT19937", "Philox", "SFC64", "BitGenerator"}
)
_GENERATORS = frozenset({"numpy.random.default_rng", "numpy.random.RandomState"})
#: Seed numpy's global generator on every worker alike.
_SEEDS = frozenset(
    {"numpy.random.seed", "keras.utils.set_random_seed", "tensorflow.keras.utils.set_random_seed",
     "tf_keras.utils.set_random_seed"}
)
#: Keras's folder readers: they shuffle (``shuffle=True`` by default) unless given a ``seed``.
_SHUFFLING_READERS = frozenset(
    {"keras.utils.image_dataset_from_directory", "keras.utils.text_dataset_from_directory",
     "keras.utils.audio_dataset_from_directory", "keras.preprocessing.image_dataset_from_directory",
     "keras.preprocessing.text_dataset_from_directory"}
)
#: Seed TensorFlow's generator on every worker alike (a reader's order then agrees).
_TF_SEEDS = frozenset({"tensorflow.random.set_seed", "tensorflow.set_random_seed"})
#: Reorder or split at random unless given ``random_state``.
_SKLEARN = frozenset(
    {"sklearn.utils.shuffle", "sklearn.model_selection.train_test_split"}
)


@dataclass
class UnseededOrders:
    #: permutation calls to make rank 0's on every worker -> the array they reorder (report)
    permutations: dict[cst.Call, str] = field(default_factory=dict)
    #: (node, what it is) for orders a person must seed
    notes: list[tuple[cst.CSTNode, str]] = field(default_factory=list)


def unseeded_orders(fm: FileModel, arrays: list[cst.BaseExpression]) -> UnseededOrders:
    """The unseeded random orders the values of ``arrays`` (original expressions the conversion
    splits by worker) come through."""
    found = UnseededOrders()
    if any(fm.calls_to(*_SEEDS)):
        return found  # numpy's generator is seeded alike on every worker
    index = file_index(fm)
    seen: set[int] = set()
    for expr in arrays:
        _walk(fm, index, expr, found, seen, 0)
    return found


def _walk(
    fm: FileModel,
    index: FileIndex,
    expr: cst.CSTNode,
    found: UnseededOrders,
    seen: set[int],
    depth: int,
) -> None:
    if depth > 10 or id(expr) in seen:
        return
    seen.add(id(expr))
    for node in findall(expr, m.Call() | m.Name()):
        if isinstance(node, cst.Call):
            _call(fm, index, node, found)
        elif isinstance(node, cst.Name):
            binding = index.reaching(node.value, node)
            if binding is None or binding.kind != "assign" or binding.value is None:
                continue
            _in_place(fm, index, node.value, binding.stmt, found)
            value = binding.value
            if binding.unpacked and isinstance(binding.stmt, cst.Assign):
                value = _element(binding.stmt.targets[0].target, value, node.value) or value
            _walk(fm, index, value, found, seen, depth + 1)


def _element(
    target: cst.BaseExpression, value: cst.BaseExpression, name: str
) -> cst.BaseExpression | None:
    """In ``(a, b), (c, d) = (x1, x2), (x3, x4)``, what ``name`` gets (``x3`` for ``c``)."""
    if isinstance(target, cst.Name):
        return value if target.value == name else None
    if not (
        isinstance(target, (cst.Tuple, cst.List))
        and isinstance(value, (cst.Tuple, cst.List))
        and len(target.elements) == len(value.elements)
    ):
        return None
    for t, v in zip(target.elements, value.elements, strict=True):
        if isinstance(t, cst.StarredElement) or isinstance(v, cst.StarredElement):
            return None
        found = _element(t.value, v.value, name)
        if found is not None:
            return found
    return None


def _call(fm: FileModel, index: FileIndex, call: cst.Call, found: UnseededOrders) -> None:
    draws = any(
        q.startswith("numpy.random.")
        and q[len("numpy.random.") :].isidentifier()
        and q[len("numpy.random.") :] not in _NOT_DRAWS
        for q in fm.qualified_names(call.func)
    )
    if draws or _unseeded_generator_method(fm, index, call):
        found.permutations.setdefault(call, code(call.args[0].value) if call.args else "")
    elif _unseeded_reader(fm, call):
        found.notes.append(
            (call, f"{code(call.func)}(...) shuffles without a seed, in another order on each "
                   f"worker, and the arrays made by going through it are divided between them")
        )
    elif fm.refers_to(call.func, *_SKLEARN) and arg_named(call, "random_state") is None:
        name = code(call.func)
        found.notes.append(
            (call, f"{name}() without random_state splits or shuffles differently on each "
                   f"worker before the data is divided between them")
        )


def _unseeded_reader(fm: FileModel, call: cst.Call) -> bool:
    """``image_dataset_from_directory(folder)``: shuffled with no seed (none of its own, none
    set for TensorFlow), so every worker reads the files in another order."""
    if not keras_names(fm, call.func) & _SHUFFLING_READERS or arg_named(call, "seed"):
        return False
    shuffle = arg_named(call, "shuffle")
    if shuffle is not None and code(shuffle.value) == "False":
        return False
    return not any(fm.calls_to(*_TF_SEEDS))


def _unseeded_generator_method(fm: FileModel, index: FileIndex, call: cst.Call) -> bool:
    """``rng.permutation(n)`` (or any draw) with ``rng = np.random.default_rng()`` (no seed)."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)):
        return False
    binding = index.reaching(func.value.value, call)
    value = binding.value if binding is not None else None
    return (
        isinstance(value, cst.Call)
        and fm.refers_to(value.func, *_GENERATORS)
        and not value.args
    )


def _in_place(
    fm: FileModel, index: FileIndex, name: str, stmt: cst.CSTNode, found: UnseededOrders
) -> None:
    """``np.random.shuffle(name)`` after ``name`` is assigned at ``stmt``."""
    for call in fm.calls_to("numpy.random.shuffle"):
        if not call.args or code(call.args[0].value) != name:
            continue
        if index.is_before(stmt, call) and all(c is not call for c, _ in found.notes):
            found.notes.append(
                (call, f"np.random.shuffle({name}) orders {name} differently on each worker "
                       f"before the data is divided between them")
            )
