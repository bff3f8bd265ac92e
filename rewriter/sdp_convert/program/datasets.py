"""Where a ``tf.data`` pipeline comes from, and which pipelines feed training.

``training_dataset_uses`` finds the expressions a training loop (or Keras ``fit``) consumes;
``trace_dataset`` follows one back through method chains, variables, function returns and
parameters to its source call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from ..base import Transform
from .flow import origin
from .index import FileIndex
from .keras import fit_arg, generator_flow, keras_fit_calls, keras_name
from .syntax import arg_named, code
from .training import training_facts

_SOURCES = frozenset(
    {
        "tensorflow.data.Dataset.from_tensor_slices",
        "tensorflow.data.Dataset.from_tensors",
        "tensorflow.data.Dataset.range",
        "tensorflow.data.Dataset.list_files",
        "tensorflow.data.Dataset.from_generator",
        "tensorflow.data.Dataset.zip",
        "tensorflow.data.Dataset.load",
        "tensorflow.data.TFRecordDataset",
        "tensorflow.data.TextLineDataset",
        "tensorflow.data.FixedLengthRecordDataset",
        "tensorflow.data.experimental.CsvDataset",
        "tensorflow_datasets.load",
    }
)


# Sources that come shuffled and batched: a shard of them is a set of whole, differently ordered
# batches on each worker.
_BATCHED_SOURCES = frozenset(
    {
        "tensorflow.data.experimental.make_csv_dataset",
        "keras.utils.image_dataset_from_directory",
        "keras.utils.text_dataset_from_directory",
        "keras.utils.audio_dataset_from_directory",
        "keras.utils.timeseries_dataset_from_array",
        "keras.preprocessing.image_dataset_from_directory",
        "keras.preprocessing.text_dataset_from_directory",
    }
)


_WRAPPERS = (
    "builtins.enumerate", "builtins.iter", "tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm"
)


@dataclass
class DatasetTrace:
    """How a training loop's (or fit's) dataset was built, from the use back to its source."""

    #: Method calls and the names they were reached through, from the use inwards.
    steps: list[cst.CSTNode] = field(default_factory=list)
    source: cst.Call | None = None
    source_name: str = ""
    #: The source is unpacked from a tuple (``(train, test), info = tfds.load(...)``).
    unpacked: bool = False
    problem: str | None = None

    @property
    def chain(self) -> list[cst.CSTNode]:
        """The steps in the order they apply, starting after the source."""
        return list(reversed(self.steps))


def trace_dataset(
    transform: Transform, index: FileIndex, expr: cst.BaseExpression, at: cst.CSTNode | None = None
) -> DatasetTrace:
    trace = DatasetTrace()
    _walk(transform, index, expr, at if at is not None else expr, trace, 0)
    return trace


def _source_name(transform: Transform, call: cst.Call) -> tuple[str, bool] | None:
    for q in transform.qualified_names(call.func):
        if q in _SOURCES:
            return q, False
        if q in _BATCHED_SOURCES or keras_name(q) in _BATCHED_SOURCES:
            return q, True
    return None


def _walk(
    transform: Transform,
    index: FileIndex,
    expr: cst.BaseExpression,
    at: cst.CSTNode,
    trace: DatasetTrace,
    depth: int,
) -> None:
    """Back from ``expr`` to the source: dataset methods and wrappers here, everything else
    (names, attributes, subscripts, parameters, functions) one ``program.flow.origin`` step at a
    time."""
    if depth > 20:
        trace.problem = "too many steps to follow"
        return
    if isinstance(expr, cst.Call):
        found = _source_name(transform, expr)
        if found is not None:
            trace.source, trace.source_name = expr, found[0]
            if found[1]:
                trace.problem = f"{_short(found[0])} shuffles and batches by itself"
            return
        if transform.refers_to(expr.func, *_WRAPPERS) and expr.args:
            _walk(transform, index, expr.args[0].value, at, trace, depth + 1)
            return
        if isinstance(expr.func, cst.Attribute):
            trace.steps.append(expr)
            _walk(transform, index, expr.func.value, at, trace, depth + 1)
            return
    back = origin(transform, index, expr, at)
    if back is None:
        trace.problem = (
            f"built by {code(expr.func)}()" if isinstance(expr, cst.Call)
            else f"{code(expr)} is not a tf.data pipeline the converter can follow"
        )
        return
    if back.problem is not None:
        unpacked = back.unpacked
        found = _source_name(transform, unpacked) if isinstance(unpacked, cst.Call) else None
        if found is not None:  # ``(train, test), info = tfds.load(...)``: the source itself
            trace.steps.append(expr)
            trace.source, trace.unpacked, trace.source_name = unpacked, True, found[0]
        else:
            trace.problem = back.problem
        return
    assert back.value is not None
    if isinstance(expr, (cst.Name, cst.Attribute, cst.Subscript)) and not (
        isinstance(expr, cst.Name) and isinstance(back.at, cst.Call)
    ):
        trace.steps.append(expr)  # a name the pipeline was held in (not a parameter)
    _walk(transform, index, back.value, back.at or at, trace, depth + 1)


def _short(qname: str) -> str:
    return qname.replace("tensorflow_datasets.", "tfds.").replace("tensorflow.", "tf.")


def _method(node: cst.CSTNode) -> str | None:
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        return node.func.attr.value
    return None


@dataclass
class Candidate:
    """An expression that may hold the training dataset, where a training loop consumes it."""

    expr: cst.BaseExpression
    #: For ``next(it)`` in a loop: that call, and the innermost loop around the optimizer step
    #: that holds it (the loop that decides how many batches are pulled).
    next_call: cst.Call | None = None
    loop: cst.For | cst.While | None = None


def training_dataset_uses(transform: Transform) -> list[tuple[cst.CSTNode, list[Candidate]]]:
    """(where, candidates) for each place a training dataset is consumed: the loops around the
    optimizer steps (their iterables, ``next(it)`` inside), and Keras ``fit``."""
    uses: list[tuple[cst.CSTNode, list[Candidate]]] = []
    seen: set[int] = set()
    for site in training_facts(transform).sites:
        if id(site.loops[-1]) in seen:
            continue
        seen.add(id(site.loops[-1]))
        candidates: list[Candidate] = []
        found: set[int] = set()
        for loop in site.loops:
            if isinstance(loop, cst.For) and not (
                isinstance(loop.iter, cst.Call)
                and transform.refers_to(loop.iter.func, "builtins.range")
            ):
                candidates.append(Candidate(loop.iter))
            for call in m.findall(loop.body, m.Call(func=m.Name("next"))):
                assert isinstance(call, cst.Call)
                if call.args and id(call) not in found:  # innermost loop first
                    found.add(id(call))
                    candidates.append(Candidate(call.args[0].value, call, loop))
        uses.append((site.loops[0], candidates))
    for fit in keras_fit_calls(transform):
        x = fit_arg(fit, "x")
        if x is not None and fit_arg(fit, "y") is None and generator_flow(transform, fit) is None:
            uses.append((fit, [Candidate(x.value)]))
    return uses


#: Sources whose length the converter cannot tell (a generator may never end).
_UNKNOWN_LENGTH = frozenset(
    {"tensorflow.data.Dataset.from_generator", "tensorflow.data.Dataset.zip"}
)


def dataset_length(trace: DatasetTrace) -> str:
    """Whether the dataset ends: "finite", "infinite" (``.repeat()`` without a count, and no
    ``take`` after it) or "unknown" (a generator's)."""
    length = "unknown" if trace.source_name in _UNKNOWN_LENGTH else "finite"
    for step in trace.chain:
        method = _method(step)
        if method not in ("repeat", "take"):
            continue
        assert isinstance(step, cst.Call)
        count = arg_named(step, "count", 0)
        if method == "repeat" and (count is None or code(count.value) in ("None", "-1")):
            length = "infinite"
        elif method == "take" and count is not None and code(count.value) != "-1":
            length = "finite"
    return length
