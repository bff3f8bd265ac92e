"""Training data read through a Python batch iterator class of the script, and what splits it.

``for xb, yb in BatchIterator(x, y, 32)``, where the class's ``__iter__`` draws its order with
``order = np.arange(len(self.x)); np.random.shuffle(order)`` and yields the batches of the
slices of ``order``: every worker reads the whole set, each in its own order. When the structure
is the one above (the index array bound once, from ``np.arange``/``range``, shuffled in place,
and read after the shuffle only by the loop that yields, which counts ``len(order)``), splitting
the index array before the shuffle (``order = sdp.shard(np.arange(len(self.x)))``) gives every
worker its own samples, the same number on every worker, whatever each worker's shuffle:
``iterator_shard`` finds that array. Anything else gets a note (``shard_advice`` says what applies
to the object: ``.apply(sdp.shard)`` only to a ``tf.data`` pipeline, ``sdp.shard(...)`` to arrays,
and the arrays a class of the script reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .datasets import _WRAPPERS
from .index import FileIndex
from .syntax import code, findall

if TYPE_CHECKING:
    from .model import FileModel

_SHUFFLES = ("numpy.random.shuffle", "random.shuffle")
_INDEX_SOURCES = ("numpy.arange", "builtins.range")
_LENGTHS = ("builtins.len",)


@dataclass
class IteratorShard:
    """The index array of a batch iterator class that ``sdp.shard`` splits."""

    cls: cst.ClassDef
    #: ``np.arange(...)`` (or ``list(range(...))``'s ``range`` call's outer value) to wrap
    indices: cst.BaseExpression
    #: the in-place shuffle of it
    shuffle: cst.Call
    #: "converter" (to split), or "script" (``sdp.shard`` around it already)
    sharded_by: str


def iterated_class(
    fm: FileModel, index: FileIndex, expr: cst.BaseExpression
) -> cst.ClassDef | None:
    """The class of this file whose instance ``expr`` is (``BatchIterator(...)``, or a name bound
    once to one)."""
    while (
        isinstance(expr, cst.Call) and expr.args and fm.refers_to(expr.func, *_WRAPPERS)
    ):
        expr = expr.args[0].value
    if isinstance(expr, cst.Name):
        binding = index.reaching(expr.value, expr)
        if binding is None or binding.kind != "assign" or binding.unpacked:
            return None
        expr = binding.value  # type: ignore[assignment]
    if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name)):
        return None
    return index.class_named(expr.func)


def _method(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    for stmt in cls.body.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
            return stmt
    return None


def iterator_shard(
    fm: FileModel, index: FileIndex, expr: cst.BaseExpression
) -> IteratorShard | None:
    """The index array to split when ``expr`` is an instance of a batch iterator class of the
    script whose ``__iter__`` has the proven structure (module docstring); None otherwise."""
    cls = iterated_class(fm, index, expr)
    if cls is None:
        return None
    function = _method(cls, "__iter__")
    if function is None or not findall(function, m.Yield()):
        return None
    shuffles = [
        c for c in findall(function, m.Call())
        if isinstance(c, cst.Call) and fm.refers_to(c.func, *_SHUFFLES)
    ]
    if len(shuffles) != 1:
        return None
    shuffle = shuffles[0]
    if len(shuffle.args) != 1 or not isinstance(shuffle.args[0].value, cst.Name):
        return None
    name = shuffle.args[0].value.value
    bindings = index.bindings_of(name, function)
    if len(bindings) != 1 or bindings[0].kind != "assign" or bindings[0].unpacked:
        return None
    value = bindings[0].value
    sharded_by = "converter"
    inner = value
    if (
        isinstance(inner, cst.Call)
        and fm.refers_to(inner.func, f"{fm.runtime_module}.shard")
        and len(inner.args) == 1
    ):
        inner, sharded_by = inner.args[0].value, "script"
    if isinstance(inner, cst.Call) and fm.refers_to(inner.func, "builtins.list"):
        if len(inner.args) != 1:
            return None
        inner = inner.args[0].value
    if not (isinstance(inner, cst.Call) and fm.refers_to(inner.func, *_INDEX_SOURCES)):
        return None
    if not index.is_before(bindings[0].stmt, shuffle):
        return None
    reads = [r for r in index.loads_of(name, function) if r is not shuffle.args[0].value]
    loop = _yielding_loop(fm, function, name)
    if loop is None or any(loop not in fm.ancestors(r) for r in reads):
        return None
    assert value is not None
    return IteratorShard(cls, value, shuffle, sharded_by)


def _yielding_loop(
    fm: FileModel, function: cst.FunctionDef, name: str
) -> cst.For | None:
    """The one ``for start in range(0, len(name), step)`` of ``function`` around its yields."""
    loops = [
        f for f in findall(function, m.For())
        if isinstance(f, cst.For) and findall(f.body, m.Yield())
    ]
    outer = [f for f in loops if not any(o is not f and o in fm.ancestors(f) for o in loops)]
    if len(outer) != 1 or len(findall(function, m.Yield())) != len(
        findall(outer[0].body, m.Yield())
    ):
        return None
    loop = outer[0]
    it = loop.iter
    if not (isinstance(it, cst.Call) and fm.refers_to(it.func, "builtins.range")):
        return None
    args = it.args
    if len(args) < 2 or any(a.keyword is not None or a.star for a in args):
        return None
    start, stop = args[0].value, args[1].value
    if not (isinstance(start, cst.Integer) and start.value == "0"):
        return None
    counts = (
        isinstance(stop, cst.Call)
        and fm.refers_to(stop.func, *_LENGTHS)
        and len(stop.args) == 1
        and isinstance(stop.args[0].value, cst.Name)
        and stop.args[0].value.value == name
    )
    return loop if counts else None


def _generator_called(index: FileIndex, expr: cst.BaseExpression) -> cst.FunctionDef | None:
    """The generator function of this file that ``expr`` calls directly."""
    if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name)):
        return None
    binding = index.reaching(expr.func.value, expr)
    stmt = binding.stmt if binding is not None and binding.kind == "def" else None
    if isinstance(stmt, cst.FunctionDef) and findall(stmt, m.Yield()):
        return stmt
    return None


def shard_advice(
    fm: FileModel, index: FileIndex, expr: cst.BaseExpression | None, sdp: str
) -> tuple[str, bool]:
    """How to give each worker its own part of what ``expr`` holds, for its type as far as the
    file shows it: a class of the script, a NumPy/array value, or a ``tf.data`` pipeline; and
    whether the type is known (the advice then says what the data is)."""
    cls = iterated_class(fm, index, expr) if expr is not None else None
    if cls is not None:
        return (
            f"{cls.name.value} is a class of this script, not a tf.data pipeline: every worker "
            f"reads all of its data; give it each worker's part of its arrays ({sdp}.shard(x) of "
            f"each, in the same order on every worker) or split its index array with "
            f"{sdp}.shard(...) before it shuffles"
        ), True
    function = _generator_called(index, expr) if expr is not None else None
    if function is not None:
        return (
            f"{function.name.value}() is a generator of this script, not a tf.data pipeline: "
            f"every worker reads all of its data; give it each worker's part of its arrays "
            f"({sdp}.shard(x) of each, in the same order on every worker)"
        ), True
    value = expr
    if isinstance(expr, cst.Name):
        binding = index.reaching(expr.value, expr)
        value = binding.value if binding is not None and binding.kind == "assign" else None
    if isinstance(value, cst.Call) and any(
        q.startswith("numpy.") for q in fm.qualified_names(value.func)
    ):
        return (
            f"{code(value.func)}() makes a NumPy array: give each worker its part with "
            f"{sdp}.shard(...) (in the same order on every worker)"
        ), True
    return (
        f"give each worker its own part: .apply({sdp}.shard) right after the source if it is a "
        f"tf.data pipeline, {sdp}.shard(...) if it is arrays"
    ), False


#: Calls that train or evaluate: a loop holding one is no preview.
_WORK = frozenset({"fit", "evaluate", "apply_gradients", "train_on_batch", "test_on_batch",
                   "GradientTape", "gradient"})


def is_preview(fm: FileModel, call: cst.CSTNode | None) -> bool:
    """``for batch in ds.take(1): print(batch.shape)``: a ``take`` iterated by a loop that only
    looks at the data (no training, no evaluation) selects nothing the training data misses, so
    it is no train/test split."""
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "take"):
        return False
    loop = fm.parent(call)
    if not (isinstance(loop, cst.For) and loop.iter is call):
        return False
    for inner in findall(loop.body, m.Call()):
        assert isinstance(inner, cst.Call)
        func = inner.func
        name = func.attr.value if isinstance(func, cst.Attribute) else (
            func.value if isinstance(func, cst.Name) else "")
        if name in _WORK:
            return False
    return True


_RANDOM = frozenset({"rand", "randn", "randint", "normal", "uniform"})


def drawn_batches(fm: FileModel, loop: cst.CSTNode, sdp: str) -> str | None:
    """The note for a training loop that reads no dataset but draws its batches inside
    (``x = tf.random.normal(...)`` every step); None when it draws nothing."""
    for call in findall(loop, m.Call()):
        assert isinstance(call, cst.Call)
        names = fm.qualified_names(call.func)
        if any(".random." in q or q.split(".")[-1] in _RANDOM for q in names):
            return (
                f"this loop reads no dataset: it draws its batches inside "
                f"({code(call.func)}(...)), each worker its own unless they are seeded alike; "
                f"seeded alike, give each worker its own seed (seed + {sdp}.rank())"
            )
    return None
