"""Keras names as data, and the questions about them: optimizer classes, ``compile``, ``fit``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m
from libcst.metadata import QualifiedNameSource

from .index import FileIndex, file_index, imported_names, reaching_values
from .syntax import (
    _EQUAL,
    AddImport,
    arg_named,
    code,
    divided_by_size,
    findall,
    mentions_size,
    replace_arg,
)

if TYPE_CHECKING:
    from collections.abc import Container

    from .model import FileModel

_KERAS_ROOTS = ("tensorflow.keras", "tensorflow.python.keras", "tf_keras", "keras")


# TF 2 re-exports a few Keras modules at top level: ``tf.optimizers.Adam``.
_TF_SHORTCUTS = ("optimizers", "losses", "metrics", "callbacks", "initializers")


def keras_name(qname: str) -> str | None:
    """One name for every spelling of a Keras object: ``keras.optimizers.Adam`` for
    ``tensorflow.keras.optimizers.Adam``, ``tf_keras.optimizers.Adam``,
    ``tensorflow.optimizers.Adam`` (``.legacy`` and ``.experimental`` dropped). None for anything
    else."""
    rest = None
    for root in _KERAS_ROOTS:
        if qname == root or qname.startswith(root + "."):
            rest = qname[len(root) + 1 :]
            break
    else:
        for short in _TF_SHORTCUTS:
            if qname == f"tensorflow.{short}" or qname.startswith(f"tensorflow.{short}."):
                rest = qname[len("tensorflow.") :]
                break
    if rest is None or rest.startswith("src."):
        return None
    parts = [p for p in rest.split(".") if p and p not in ("legacy", "experimental")]
    return ".".join(["keras", *parts])


def keras_names(fm: FileModel, node: cst.CSTNode) -> set[str]:
    """``keras_name`` of every qualified name ``node`` (original) may refer to."""
    return {k for q in fm.qualified_names(node) if (k := keras_name(q))}


#: Keras 3 defaults (keras/src/optimizers/*.py); tf_keras 2 has the same ones.
OPTIMIZER_DEFAULT_LR = {
    "Adam": "0.001",
    "AdamW": "0.001",
    "Adamax": "0.001",
    "Nadam": "0.001",
    "SGD": "0.01",
    "RMSprop": "0.001",
    "Adagrad": "0.001",
    "Adadelta": "0.001",
    "Ftrl": "0.001",
    "Lion": "0.001",
    "Lamb": "0.001",
    "Adafactor": "0.001",
    "Muon": "0.001",
    "ScheduleFreeAdamW": "0.0025",
}


#: ``optimizer="adam"``: ``keras.optimizers.get`` looks the lower-cased class name up.
OPTIMIZER_STRINGS = {name.lower(): name for name in OPTIMIZER_DEFAULT_LR if name != "Lamb"}


#: Keras' ``compile`` default.
DEFAULT_COMPILE_OPTIMIZER = "RMSprop"


#: Schedule -> the arguments that are rates: (name, position, default or None when optional).
_SCHEDULE_RATES: dict[str, tuple[tuple[str, int, str | None], ...]] = {
    "ExponentialDecay": (("initial_learning_rate", 0, None),),
    "InverseTimeDecay": (("initial_learning_rate", 0, None),),
    "CosineDecayRestarts": (("initial_learning_rate", 0, None),),
    "CosineDecay": (("initial_learning_rate", 0, None), ("warmup_target", 4, None)),
    "PolynomialDecay": (("initial_learning_rate", 0, None), ("end_learning_rate", 2, "0.0001")),
    "PiecewiseConstantDecay": (("values", 1, None),),
}


def optimizer_class(fm: FileModel, call: cst.Call) -> str | None:
    """``Adam`` when ``call`` (original) constructs a Keras optimizer, else None."""
    for name in keras_names(fm, call.func):
        parts = name.split(".")
        if len(parts) == 3 and parts[1] == "optimizers" and parts[2] in OPTIMIZER_DEFAULT_LR:
            return parts[2]
    return None


def schedule_class(fm: FileModel, call: cst.Call) -> str | None:
    for name in keras_names(fm, call.func):
        parts = name.split(".")
        if parts[1:3] == ["optimizers", "schedules"] and parts[-1] in _SCHEDULE_RATES:
            return parts[-1]
    return None


def keras_spelling(fm: FileModel, dotted: str, add_import: AddImport) -> str:
    """How this file can spell ``keras.<dotted>`` (``optimizers.Adam``):
    ``tf.keras.optimizers.Adam`` after ``import tensorflow as tf``, ``keras.optimizers.Adam`` after
    ``import keras``, ``Adam`` after ``from keras.optimizers import Adam``. Asks ``add_import`` for
    an import (``add_import(module, name, asname)``) when the file has none."""
    wanted = "keras." + dotted
    best: tuple[int, str] | None = None
    for bound, qualified, _ in imported_names(fm):
        for q in sorted(qualified):
            canonical = "tensorflow" if q == "tensorflow" else keras_name(q)
            if canonical is None:
                continue
            if canonical == "tensorflow":
                found = (3, f"{bound}.{wanted}")
            elif wanted == canonical or wanted.startswith(canonical + "."):
                rest = wanted[len(canonical) :]
                found = (rest.count("."), bound + rest)
            else:
                continue
            if best is None or found < best:
                best = found
    if best is not None:
        return best[1]
    root = "tensorflow.keras" if any(
        q.startswith("tensorflow.keras.") for q in fm.info.calls
    ) else "keras"
    module, _, name = f"{root}.{dotted}".rpartition(".")
    package, _, first = module.rpartition(".")
    # The import must not take a name the file already uses for something else (``from keras.src
    # import optimizers``, a project's own ``optimizers.py``): it would change what that name means
    # everywhere, and a second pass would take the file's own calls for Keras ones.
    taken = {bound for _, bound in file_index(fm).bindings}
    if first not in taken:
        add_import(package, first)
        return f"{first}.{name}"
    top, asname = ("tensorflow", "tf") if root == "tensorflow.keras" else ("keras", None)
    bound = asname or top
    if bound not in taken:
        add_import(top, asname=asname)
        return f"{bound}{root[len(top):]}.{dotted}"  # keras.optimizers.Adam, tf.keras...
    alias = f"keras_{first}"
    while alias in taken:
        alias = "_" + alias
    add_import(package, first, asname=alias)
    return f"{alias}.{name}"


def is_keras_compile(fm: FileModel, call: cst.Call) -> bool:
    """``<model>.compile(...)`` (original): a method called ``compile`` on something that is not an
    imported module (``re.compile``, ``torch.compile``) and takes Keras' arguments."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "compile"):
        return False
    if _is_imported(fm, func.value):
        return False
    keywords = {a.keyword.value for a in call.args if a.keyword}
    return bool(keywords & {"optimizer", "loss", "metrics"}) or (
        bool(call.args)
        and not call.args[0].keyword
        and _is_optimizer_like(fm, call.args[0].value)
    )


_FIT_KEYWORDS = frozenset(
    {"epochs", "callbacks", "validation_data", "validation_split", "steps_per_epoch", "verbose",
     "batch_size", "initial_epoch", "validation_steps"}
)


def keras_fit_calls(fm: FileModel) -> list[cst.Call]:
    """``<model>.fit(...)`` calls (original) of a Keras model: on something ``compile`` is called
    on, or with Keras' own arguments (so that ``scaler.fit(x)`` of scikit-learn is left alone)."""
    compiled = {
        code(c.func.value)  # type: ignore[attr-defined]
        for c in fm.method_calls("compile")
        if is_keras_compile(fm, c)
    }
    found = []
    for call in (*fm.method_calls("fit"), *fm.method_calls("fit_generator")):
        func = call.func
        assert isinstance(func, cst.Attribute)
        if _is_imported(fm, func.value):
            continue
        keywords = {a.keyword.value for a in call.args if a.keyword}
        if code(func.value) in compiled or keywords & _FIT_KEYWORDS:
            found.append(call)
    return found


def _is_optimizer_like(fm: FileModel, expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.SimpleString):
        return expr.evaluated_value.lower() in OPTIMIZER_STRINGS if isinstance(
            expr.evaluated_value, str
        ) else False
    return isinstance(expr, cst.Call) and optimizer_class(fm, expr) is not None


def _is_imported(fm: FileModel, expr: cst.BaseExpression) -> bool:
    found = fm.raw_qualified_names(expr)
    return any(q.source in (QualifiedNameSource.IMPORT, QualifiedNameSource.BUILTIN) for q in found)


def compile_optimizer_arg(call: cst.Call) -> cst.Arg | None:
    """The ``optimizer`` argument of a ``compile`` call (keyword or first positional)."""
    for arg in call.args:
        if arg.keyword and arg.keyword.value == "optimizer":
            return arg
    if call.args and call.args[0].keyword is None and not call.args[0].star:
        return call.args[0]
    return None


def optimizer_from_string(
    fm: FileModel, name: str, learning_rate: cst.BaseExpression | None,
    add_import: AddImport,
) -> cst.Call | None:
    """``"adam"`` -> ``tf.keras.optimizers.Adam(learning_rate=...)`` in this file's spelling."""
    cls = OPTIMIZER_STRINGS.get(name.lower())
    if cls is None:
        return None
    func = cst.parse_expression(keras_spelling(fm, f"optimizers.{cls}", add_import))
    args = [cst.Arg(learning_rate, keyword=cst.Name("learning_rate"), equal=_EQUAL)] if (
        learning_rate is not None
    ) else []
    return cst.Call(func=func, args=args)


#: Positions of ``Model.fit``'s parameters (Keras 3 and 2 alike).
_FIT_POSITIONS = {"x": 0, "y": 1, "verbose": 4, "callbacks": 5, "sample_weight": 10}
#: ``Model.fit_generator(generator, steps_per_epoch, epochs, ...)`` (Keras 2; gone in Keras 3).
FIT_GENERATOR_PARAMETERS = (
    "generator", "steps_per_epoch", "epochs", "verbose", "callbacks", "validation_data",
    "validation_steps", "validation_freq", "class_weight", "max_queue_size", "workers",
    "use_multiprocessing", "shuffle", "initial_epoch",
)


def is_fit_generator(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "fit_generator"


def fit_arg(call: cst.Call, name: str) -> cst.Arg | None:
    """The argument of ``fit`` (or ``fit_generator``, whose ``generator`` is fit's ``x``) bound
    to the parameter ``name``."""
    if is_fit_generator(call):
        if name == "y" or name == "sample_weight":
            return None
        name = "generator" if name == "x" else name
        known = name in FIT_GENERATOR_PARAMETERS
        return arg_named(call, name, FIT_GENERATOR_PARAMETERS.index(name) if known else None)
    return arg_named(call, name, _FIT_POSITIONS.get(name))


def generator_flow(fm: FileModel, fit: cst.Call) -> cst.Call | None:
    """The ``ImageDataGenerator(...).flow(x, y, ...)`` call whose batches ``fit`` trains on."""
    return _generator_call(fm, fit, ("flow",))


#: ``ImageDataGenerator`` methods that make an iterator of batches (a Keras ``PyDataset``, a
#: ``Sequence`` in tf_keras) over files, with the positions of their ``shuffle`` and ``seed``.
IMAGE_ITERATORS = {"flow_from_directory": (6, 7), "flow_from_dataframe": (10, 11)}


def image_iterator(fm: FileModel, fit: cst.Call) -> cst.Call | None:
    """The ``ImageDataGenerator(...).flow_from_directory(...)`` (or ``flow_from_dataframe``)
    call whose iterator ``fit`` trains on as its ``x`` (``train_gen = gen.flow_from_directory(
    ...)``; ``fit(train_gen)``), followed through the bindings that reach ``fit``; else None."""
    if fit_arg(fit, "y") is not None:
        return None
    return _generator_call(fm, fit, tuple(IMAGE_ITERATORS))


def _generator_call(fm: FileModel, fit: cst.Call, methods: tuple[str, ...]) -> cst.Call | None:
    """The ``<ImageDataGenerator>.<method>(...)`` call that ``fit``'s ``x`` is."""
    x = fit_arg(fit, "x")
    if x is None:
        return None
    index = file_index(fm)
    for value in reaching_values(index, x.value, fit):
        if not (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in methods
        ):
            continue
        for receiver in reaching_values(index, value.func.value, value):
            if isinstance(receiver, cst.Call) and any(
                k.endswith(".ImageDataGenerator") for k in keras_names(fm, receiver.func)
            ):
                return value
    return None


def iterator_seeded(call: cst.Call) -> bool | None:
    """Whether the ``flow_from_*`` ``call`` gives its order a seed (or does not shuffle): True,
    False, or None when positional arguments reach past ``shuffle`` (not read)."""
    shuffle_at, seed_at = IMAGE_ITERATORS[call.func.attr.value]  # type: ignore[attr-defined]
    positional = [a for a in call.args if a.keyword is None]
    if any(a.star for a in call.args) or len(positional) > shuffle_at:
        return None
    shuffle = arg_named(call, "shuffle")
    if shuffle is not None and code(shuffle.value) == "False":
        return True
    return arg_named(call, "seed", seed_at) is not None


def keras_own_train_step(
    fm: FileModel, index: FileIndex, receiver: cst.BaseExpression, call: cst.Call,
    custom: Container[str] = (), depth: int = 0,
) -> bool:
    """The model compiled by ``call`` is a ``keras.Sequential``, a functional ``keras.Model``,
    or a loaded, cloned or applications model: it trains with Keras' own ``train_step``. So does
    a model made by a class of this file that defines no ``train_step`` (nor do its bases, down
    to ``keras.Model``; ``custom``: the names of the classes that define one), or returned by
    a function of this file whose every return is such a model (``get_model()`` returning
    ``keras.Model(inputs, outputs)``)."""
    for value in reaching_values(index, receiver, call):
        if not isinstance(value, cst.Call):
            continue
        if any(k.rsplit(".", 1)[-1] in ("Sequential", "Model", "load_model", "clone_model")
               or k.startswith("keras.applications.") for k in keras_names(fm, value.func)):
            return True
        binding = (index.reaching(value.func.value, value)
                   if isinstance(value.func, cst.Name) and depth < 4 else None)
        if binding is None or binding.kind != "def":
            continue
        if isinstance(binding.stmt, cst.ClassDef):
            return _plain_model_class(fm, index, binding.stmt, custom, depth + 1)
        if isinstance(binding.stmt, cst.FunctionDef):
            returns = [r for r in findall(binding.stmt.body, m.Return())
                       if _function_of(fm, r) is binding.stmt]
            return bool(returns) and all(
                r.value is not None
                and keras_own_train_step(fm, index, r.value, r, custom, depth + 1)
                for r in returns)
    return False


def _plain_model_class(
    fm: FileModel, index: FileIndex, cls: cst.ClassDef, custom: Container[str], depth: int
) -> bool:
    """``cls`` is a Keras model class with Keras' own ``train_step``: no class on the way from
    it to ``keras.Model`` defines one (its bases are ``keras.Model`` or classes of this file)."""
    if cls.name.value in custom or depth > 4 or not cls.bases or any(
        isinstance(s, cst.FunctionDef) and s.name.value == "train_step"
        for s in cls.body.body
    ):
        return False
    for base in cls.bases:
        if any(k.rsplit(".", 1)[-1] in ("Model", "Sequential")
               for k in keras_names(fm, base.value)):
            continue
        binding = (index.reaching(base.value.value, cls)
                   if isinstance(base.value, cst.Name) else None)
        if binding is None or not isinstance(binding.stmt, cst.ClassDef) or not (
            _plain_model_class(fm, index, binding.stmt, custom, depth + 1)
        ):
            return False
    return True


def _function_of(fm: FileModel, node: cst.CSTNode) -> cst.CSTNode | None:
    return next((a for a in fm.ancestors(node)
                 if isinstance(a, (cst.FunctionDef, cst.Lambda))), None)


def per_worker_save_freq(
    fm: FileModel, original: cst.Call, updated: cst.Call
) -> tuple[cst.Call, tuple[cst.CSTNode, str] | None]:
    """``ModelCheckpoint(save_freq=<batches>)`` -> ``max(1, <batches> // sdp.size())``, and what
    to report where (the transform reports it): each worker runs 1/N of the batches, so rank 0's
    checkpoint comes as often as before. Other calls, ``save_freq="epoch"`` and a frequency that
    mentions ``size()`` come back as they are, with nothing to report."""
    names = keras_names(fm, original.func)
    if not any(k.endswith("callbacks.ModelCheckpoint") for k in names):
        return updated, None
    arg, original_arg = arg_named(updated, "save_freq"), arg_named(original, "save_freq")
    if arg is None or original_arg is None or isinstance(
        original_arg.value, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)
    ) or mentions_size(fm, original_arg.value):
        return updated, None
    sdp, value = fm.sdp, code(arg.value)
    note = (f"save_freq={value} -> max(1, {value} // {sdp}.size()): each worker runs its part of "
            "the batches")
    return replace_arg(updated, arg, cst.parse_expression(
        f"max(1, {code(divided_by_size(arg.value, sdp))})")), (original_arg, note)


def hidden_fit_arguments(original: cst.Call, sdp: str) -> list[str]:
    """``fit(x, y, **fit_kwargs)``: what the dict may hold that the conversion would set
    (``callbacks``, ``verbose``, ``steps_per_epoch``); given again as keywords they would fail
    (``got multiple values for keyword argument``), so what the call does not name is left to a
    person: what to do about each."""
    todo = []
    if fit_arg(original, "callbacks") is None:
        todo.append(
            f"put {sdp}.keras.callbacks.BroadcastGlobalVariablesCallback(0) and "
            f"{sdp}.keras.callbacks.MetricAverageCallback() first in its callbacks "
            f"(callbacks that write files on rank 0 only)"
        )
    if fit_arg(original, "verbose") is None:
        todo.append("set verbose=0 on the workers other than rank 0")
    if arg_named(original, "steps_per_epoch") is None:
        todo.append(f"divide a steps_per_epoch it holds by {sdp}.size()")
    return todo
