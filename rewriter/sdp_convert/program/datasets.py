"""Where a ``tf.data`` pipeline comes from, and which pipelines feed training.

``training_dataset_uses`` finds the expressions a training loop (or Keras ``fit``) consumes;
``trace_dataset`` follows one back through method chains, variables, function returns and
parameters to its source call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .flow import origin, reaches, returned_element
from .index import FileIndex, file_index
from .keras import (
    fit_arg,
    generator_flow,
    image_iterator,
    iterator_seeded,
    keras_fit_calls,
    keras_name,
)
from .project import fed_returns
from .scopes import callers, param_for_arg, referents
from .syntax import _EQUAL, append_arg, arg_named, code, findall
from .training import training_facts

if TYPE_CHECKING:
    from .model import FileModel

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
        "keras.preprocessing.timeseries_dataset_from_array",  # the older spelling (TF 2.3-2.8)
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
    #: The functions the trace went into through their return, with the call it came from and
    #: how many calls the function has (a helper that builds the training and the test data).
    functions: list[tuple[cst.FunctionDef, cst.Call, int]] = field(default_factory=list)

    @property
    def chain(self) -> list[cst.CSTNode]:
        """The steps in the order they apply, starting after the source."""
        return list(reversed(self.steps))


def trace_dataset(
    fm: FileModel, index: FileIndex, expr: cst.BaseExpression, at: cst.CSTNode | None = None
) -> DatasetTrace:
    trace = DatasetTrace()
    _walk(fm, index, expr, at if at is not None else expr, trace, 0)
    return trace


def _source_name(fm: FileModel, call: cst.Call) -> tuple[str, bool] | None:
    for q in fm.qualified_names(call.func):
        if q in _SOURCES:
            return q, False
        if q in _BATCHED_SOURCES or keras_name(q) in _BATCHED_SOURCES:
            return q, True
    return None


def _walk(
    fm: FileModel,
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
        found = _source_name(fm, expr)
        if found is not None:
            trace.source, trace.source_name = expr, found[0]
            if found[1]:
                trace.problem = f"{_short(found[0])} shuffles and batches by itself"
            return
        if fm.refers_to(expr.func, *_WRAPPERS) and expr.args:
            _walk(fm, index, expr.args[0].value, at, trace, depth + 1)
            return
        if isinstance(expr.func, cst.Attribute):
            trace.steps.append(expr)
            _walk(fm, index, expr.func.value, at, trace, depth + 1)
            return
        if isinstance(expr.func, cst.Name):
            binding = index.reaching(expr.func.value, expr)
            if binding is not None and isinstance(binding.stmt, cst.FunctionDef):
                _through_function(fm, index, binding.stmt, expr, trace, depth)
                return
    if isinstance(expr, cst.Name) and _through_entered_call(
        fm, index, expr, at, trace, depth
    ):
        return
    back = origin(fm, index, expr, at)
    if back is None:
        trace.problem = (
            f"built by {code(expr.func)}()" if isinstance(expr, cst.Call)
            else f"{code(expr)} is not a tf.data pipeline the converter can follow"
        )
        return
    if back.problem is not None:
        unpacked = back.unpacked
        found = _source_name(fm, unpacked) if isinstance(unpacked, cst.Call) else None
        if found is not None:  # ``(train, test), info = tfds.load(...)``: the source itself
            trace.steps.append(expr)
            trace.source, trace.unpacked, trace.source_name = unpacked, True, found[0]
        elif not (isinstance(expr, cst.Name) and _through_unpacked_call(
            fm, index, expr, at, trace, depth
        )):
            trace.problem = back.problem
        return
    assert back.value is not None
    if isinstance(expr, (cst.Name, cst.Attribute, cst.Subscript)) and not (
        isinstance(expr, cst.Name) and isinstance(back.at, cst.Call)
    ):
        trace.steps.append(expr)  # a name the pipeline was held in (not a parameter)
    _walk(fm, index, back.value, back.at or at, trace, depth + 1)


def _through_function(
    fm: FileModel,
    index: FileIndex,
    function: cst.FunctionDef,
    call: cst.Call,
    trace: DatasetTrace,
    depth: int,
) -> None:
    """Into a function of this file through its one return. A function called several times (the
    training and the test data) is followed for this call: its parameters are this call's
    arguments (``_through_entered_call``), and ``trace.functions`` says it is shared."""
    returns = [r for r in index.returns.get(id(function), []) if r.value is not None]
    if len(returns) != 1:
        trace.problem = f"{function.name.value}() has {len(returns)} return statements"
        return
    trace.functions.append((function, call, len(callers(fm, function))))
    value = returns[0].value
    assert value is not None
    _walk(fm, index, value, returns[0], trace, depth + 1)


def _through_unpacked_call(
    fm: FileModel,
    index: FileIndex,
    name: cst.Name,
    at: cst.CSTNode,
    trace: DatasetTrace,
    depth: int,
) -> bool:
    """``train, n = make(train_dir)`` with ``make`` a function of this file returning one
    ``dataset, count``: into it for this call (``trace.functions`` says how many calls it has:
    a helper that builds the training and the test data); False when it is no such call."""
    binding = index.reaching(name.value, at)
    stmt = binding.stmt if binding is not None else None
    value = binding.value if binding is not None else None
    if not (isinstance(stmt, cst.Assign) and len(stmt.targets) == 1 and isinstance(
        value, cst.Call) and isinstance(stmt.targets[0].target, (cst.Tuple, cst.List))):
        return False
    target = stmt.targets[0].target
    names = [e.value.value if isinstance(e.value, cst.Name) else None for e in target.elements]
    returned = returned_element(index, value, names.index(name.value), len(names)) if (
        names.count(name.value) == 1) else None
    if returned is None:
        return False
    function, element, ret = returned
    trace.steps.append(name)  # the training call's dataset, after the function returns it
    trace.functions.append((function, value, len(callers(fm, function))))
    _walk(fm, index, element, ret, trace, depth + 1)
    return True


def _through_entered_call(
    fm: FileModel,
    index: FileIndex,
    name: cst.Name,
    at: cst.CSTNode,
    trace: DatasetTrace,
    depth: int,
) -> bool:
    """A parameter of a function the trace entered through one call's return: that call's
    argument (whatever the function's other callers pass). False when ``name`` is no such
    parameter (``program.flow.origin`` then decides)."""
    binding = index.reaching(name.value, at)
    if binding is None or binding.kind != "param" or not isinstance(binding.stmt, cst.FunctionDef):
        return False
    function = binding.stmt
    for entered, through, _ in trace.functions:
        if entered is function:
            arg = next(
                (
                    a
                    for a in through.args
                    if (p := param_for_arg(function, through, a)) is not None
                    and p.name.value == name.value
                ),
                None,
            )
            if arg is None:
                trace.problem = f"parameter {name.value!r} of {function.name.value}() is not passed"
            else:
                _walk(fm, index, arg.value, through, trace, depth + 1)
            return True
    return False


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


def _counter(fm: FileModel, iterable: cst.BaseExpression) -> bool:
    """``range(n)``, ``trange(n)``, in ``enumerate``/``tqdm`` or not: a step counter, no data."""
    while (
        isinstance(iterable, cst.Call) and iterable.args
        and fm.refers_to(iterable.func, *_WRAPPERS)
    ):
        iterable = iterable.args[0].value
    return isinstance(iterable, cst.Call) and (
        fm.refers_to(iterable.func, "builtins.range")
        or any(q.endswith(".trange") for q in fm.qualified_names(iterable.func))
    )


def training_dataset_uses(fm: FileModel) -> list[tuple[cst.CSTNode, list[Candidate]]]:
    """(where, candidates) for each place a training dataset is consumed: the loops around the
    optimizer steps (their iterables, ``next(it)`` inside), and Keras ``fit``."""
    uses: list[tuple[cst.CSTNode, list[Candidate]]] = []
    seen: set[int] = set()
    facts = training_facts(fm)
    for site in facts.sites:
        if id(site.loops[-1]) in seen or in_keras_train_step(fm, site.loops[-1]):
            continue
        seen.add(id(site.loops[-1]))
        candidates: list[Candidate] = []
        found: set[int] = set()
        # The steps of this loop: a ``next(it)`` in it whose value reaches none of them (``A, B
        # = next(test_iter)`` for samples after the step, rebound by the ``for`` before the next
        # one) pulls no training data.
        steps = [s.statement for s in facts.sites if s.loops[-1] is site.loops[-1]]
        for loop in site.loops:
            if isinstance(loop, cst.For) and not _counter(fm, loop.iter):
                candidates.append(Candidate(loop.iter))
            for call in findall(loop.body, m.Call(func=m.Name("next"))):
                assert isinstance(call, cst.Call)
                if call.args and id(call) not in found and reaches(fm, call, steps):
                    found.add(id(call))
                    candidates.append(Candidate(call.args[0].value, call, loop))
        uses.append((site.loops[0], candidates))
    for fit in keras_fit_calls(fm):
        x = fit_arg(fit, "x")
        if (
            x is not None
            and fit_arg(fit, "y") is None
            and generator_flow(fm, fit) is None
            and not holds_arrays(fm, x.value, fit)
            and keras_sequence(fm, x.value, fit) is None
            and not (  # shuffled alike on every worker: sharded by wrap_keras_fit
                (iterator := image_iterator(fm, fit)) is not None
                and iterator_seeded(iterator) is not None
            )
            and not (  # sdp.shard(x): split already
                isinstance(x.value, cst.Call)
                and fm.refers_to(x.value.func, f"{fm.runtime_module}.shard")
            )
        ):
            uses.append((fit, [Candidate(x.value)]))
    # Project mode: datasets this module returns for another module's training loop.
    uses += [(ret, [Candidate(value)]) for ret, value, _feed in fed_returns(fm)]
    return uses


# -- arrays (what ``fit(x)`` gets when it is not a dataset) ---------------------------------------

#: Calls whose result is an array, a tensor or a table (of rows that ``sdp.shard`` can split).
_ARRAY_PREFIXES = ("numpy.", "pandas.")
_ARRAY_CALLS = frozenset(
    {
        "sklearn.model_selection.train_test_split",
        "tensorflow.constant",
        "tensorflow.convert_to_tensor",
        "tensorflow.cast",
        "tensorflow.reshape",
        "tensorflow.concat",
        "tensorflow.stack",
        "tensorflow.expand_dims",
        "tensorflow.image.resize",
    }
)


def holds_arrays(
    fm: FileModel, expr: cst.BaseExpression, at: cst.CSTNode | None = None
) -> bool:
    """Whether ``expr`` (original) is an array, tensor or table, or a tuple, list or dict of them,
    as far as its assignments show: ``np.random.rand(...)``, ``x_train`` unpacked from
    ``keras.datasets.mnist.load_data()``, ``x / 255.0``, ``x[idx].astype("float32")``, ``(x1,
    x2)``. A ``tf.data`` pipeline, a generator, a ``Sequence`` or anything the converter cannot
    follow is not (``fit`` gets it whole; the dataset transforms look at it)."""
    return _arrays(fm, file_index(fm), expr, at if at is not None else expr, 0)


def _arrays(
    fm: FileModel, index: FileIndex, expr: cst.BaseExpression, at: cst.CSTNode, depth: int
) -> bool:
    if depth > 12:
        return False
    if isinstance(expr, (cst.Tuple, cst.List)):
        elements = [e.value for e in expr.elements if isinstance(e, cst.Element)]
        return bool(elements) and len(elements) == len(expr.elements) and all(
            _arrays(fm, index, e, at, depth + 1) for e in elements
        )
    if isinstance(expr, cst.Dict):
        values = [e.value for e in expr.elements if isinstance(e, cst.DictElement)]
        return bool(values) and len(values) == len(expr.elements) and all(
            _arrays(fm, index, v, at, depth + 1) for v in values
        )
    if isinstance(expr, cst.Call):
        names = fm.qualified_names(expr.func)
        if any(q.startswith(_ARRAY_PREFIXES) or q in _ARRAY_CALLS for q in names):
            return True
        if any(
            (k := keras_name(q)) is not None and k.startswith("keras.datasets.")
            and k.endswith(".load_data")
            for q in names
        ):
            return True
        if isinstance(expr.func, cst.Attribute):
            # x.astype(...), rng.normal(...) of rng = np.random.RandomState(0), df.to_numpy()
            return _arrays(fm, index, expr.func.value, at, depth + 1)
        return False
    if isinstance(expr, cst.Subscript):
        return _arrays(fm, index, expr.value, at, depth + 1)
    if isinstance(expr, cst.BinaryOperation):
        return _arrays(fm, index, expr.left, at, depth + 1) or _arrays(
            fm, index, expr.right, at, depth + 1
        )
    if isinstance(expr, cst.UnaryOperation):
        return _arrays(fm, index, expr.expression, at, depth + 1)
    if isinstance(expr, cst.Name):
        binding = index.reaching(expr.value, at)
        if binding is None or binding.kind != "assign" or binding.value is None:
            return False
        value = binding.value
        if binding.unpacked:
            element = _unpacked_element(binding.stmt, expr.value, value)
            if element is not None:
                return _arrays(fm, index, element, binding.stmt, depth + 1)
            # (x_train, y_train), _ = keras.datasets.mnist.load_data(), train_test_split(...)
            return isinstance(value, cst.Call) and _arrays(
                fm, index, value, binding.stmt, depth + 1
            )
        return _arrays(fm, index, value, binding.stmt, depth + 1)
    if isinstance(expr, cst.Attribute):
        found = index.attribute_bindings.get(code(expr), [])
        if found and found[-1].value is not None and not found[-1].unpacked:
            return _arrays(fm, index, found[-1].value, found[-1].stmt, depth + 1)
    return False


_SEQUENCES = frozenset({"keras.utils.Sequence", "keras.utils.PyDataset"})


def keras_sequence(
    fm: FileModel, expr: cst.BaseExpression, at: cst.CSTNode | None = None
) -> cst.ClassDef | None:
    """The class of this file, a ``keras.utils.Sequence``/``PyDataset``, that ``expr`` (original)
    is an instance of (``train_gen = DataGenerator(files, batch_size=32)``), or None."""
    index = file_index(fm)
    value: cst.BaseExpression | None = expr
    where: cst.CSTNode = at if at is not None else expr
    for _ in range(4):
        if isinstance(value, cst.Name):
            binding = index.reaching(value.value, where)
            if binding is None or binding.kind != "assign" or binding.unpacked:
                return None
            value, where = binding.value, binding.stmt
            continue
        break
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
        return None
    binding = index.reaching(value.func.value, value)
    cls = binding.stmt if binding is not None else None
    if not isinstance(cls, cst.ClassDef):
        return None
    for base in cls.bases:
        if any(keras_name(q) in _SEQUENCES for q in fm.qualified_names(base.value)):
            return cls
    return None


def _unpacked_element(
    stmt: cst.CSTNode, name: str, value: cst.BaseExpression
) -> cst.BaseExpression | None:
    """``x, y = x[idx], y[idx]``: the element of ``value`` that ``name`` gets."""
    if not (isinstance(stmt, cst.Assign) and len(stmt.targets) == 1):
        return None
    target = stmt.targets[0].target
    if not (
        isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List))
    ):
        return None
    if len(target.elements) != len(value.elements):
        return None
    for t, v in zip(target.elements, value.elements, strict=True):
        if isinstance(t.value, cst.Name) and t.value.value == name and isinstance(v, cst.Element):
            return v.value
    return None


def in_keras_train_step(fm: FileModel, node: cst.CSTNode) -> bool:
    """Whether ``node`` is inside a Keras model's ``train_step`` override (that applies a tape's
    gradients): Keras ``fit`` calls it once per batch, inside a traced graph. A loop there (a
    GAN's discriminator steps) is no training loop of its own: ``fit`` feeds it, and
    ``wrap_keras_fit``'s callbacks broadcast and average for it."""
    steps = training_facts(fm).train_step_methods
    return any(step in fm.ancestors(node) for step in steps)


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


#: ``torch.utils.data.random_split`` by its qualified names.
RANDOM_SPLITS = ("torch.utils.data.random_split", "torch.utils.data.dataset.random_split")
#: Seeds that make torch's global generator the same on every rank.
TORCH_SEEDS = ("torch.manual_seed", "torch.random.manual_seed", "lightning.seed_everything",
               "pytorch_lightning.seed_everything", "transformers.set_seed")


def unseeded_random_split(fm: FileModel, dataset: cst.BaseExpression) -> cst.Call | None:
    """The ``random_split(...)`` call (no ``generator=``, no torch seed anywhere in the file)
    that ``dataset`` is a part of: ``train_set, val_set = random_split(ds, [n, m])``.

    Unseeded, each rank draws its own split: the training part of one rank overlaps the
    validation part of another, and the shards of the training part are not disjoint."""
    if not isinstance(dataset, cst.Name) or fm.calls_to(*TORCH_SEEDS):
        return None
    for binding in referents(fm, dataset):
        value = binding.value
        if (
            binding.kind == "assign" and isinstance(value, cst.Call)
            and fm.refers_to(value.func, *RANDOM_SPLITS)
            and arg_named(value, "generator") is None and len(value.args) < 3
        ):
            return value
    return None


SEEDED_SPLIT = (
    "random_split(...) gets generator=... seeded with rank 0's seed: unseeded, each rank drew "
    "its own split, so the training part of one rank overlapped the validation part of another"
)


def seeded_split(fm: FileModel, call: cst.Call, torch: str) -> cst.Call:
    """``random_split(ds, [n, m], generator=torch.Generator().manual_seed(
    sdp.broadcast_object(torch.initial_seed(), root_rank=0)))``: every rank draws rank 0's split
    (``torch``: how the file spells the torch module)."""
    seed = f"{fm.sdp}.broadcast_object({torch}.initial_seed(), root_rank=0)"
    generator = cst.Arg(
        keyword=cst.Name("generator"),
        value=cst.parse_expression(f"{torch}.Generator().manual_seed({seed})"),
        equal=_EQUAL,
    )
    return call.with_changes(args=append_arg(list(call.args), generator, call))


def new_unseeded_split(
    fm: FileModel, dataset: cst.BaseExpression, seen: set[cst.Call]
) -> cst.Call | None:
    """The unseeded ``random_split`` behind ``dataset``, if any and not in ``seen`` yet (the
    calls ``seeded_split`` rewrites): added to ``seen`` and returned (the caller reports it,
    with ``SEEDED_SPLIT``); None otherwise."""
    split = unseeded_random_split(fm, dataset)
    if split is not None and split not in seen:
        seen.add(split)
        return split
    return None
