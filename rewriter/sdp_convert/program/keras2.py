"""Keras 2 calls that Keras 3 (TensorFlow 2.16+) no longer takes, found in the original tree.

* ``optimizer.variables()``: a property in Keras 3 (``optimizer.variables``); calling the list
  raises ``TypeError``. Horovod's TF2 recipe writes it
  (``hvd.broadcast_variables(opt.variables(), root_rank=0)``).
* ``model.save("dir")`` (no ``.keras``/``.h5`` extension, also the last part of an
  ``os.path.join``) and ``save_format=``: Keras 3 writes
  only ``.keras`` and ``.h5`` files; a SavedModel directory is ``model.export("dir")``.
* ``metric.reset_states()``: ``reset_state()`` in Keras 3.
* ``model.compile(experimental_run_tf_function=...)``: not an argument of Keras 3.
* ``multi_gpu_model(model, gpus=n)`` (``keras.utils``' until TF 2.4, or a project's copy of it):
  splits each batch over the GPUs of one process; under ``sdp-run`` a process has one GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from .index import nodes_of
from .keras import is_keras_compile, keras_fit_calls, keras_names, optimizer_class
from .scopes import assigned_values
from .syntax import arg_named, code, findall

if TYPE_CHECKING:
    from .model import FileModel

#: Wrappers that return the optimizer they are given (its ``variables`` stay a property).
OPTIMIZER_WRAPPERS = (
    "horovod.tensorflow.DistributedOptimizer",
    "horovod.tensorflow.keras.DistributedOptimizer",
    "horovod.keras.DistributedOptimizer",
    "smdistributed.dataparallel.tensorflow.DistributedOptimizer",
    "smdistributed.dataparallel.tensorflow.keras.DistributedOptimizer",
    "sdp_runtime.tensorflow.DistributedOptimizer",
    "sdp_runtime.tensorflow.keras.DistributedOptimizer",
)

SAVE_EXTENSIONS = (".keras", ".h5", ".hdf5")


def _values(fm: FileModel, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    return assigned_values(fm, expr) if isinstance(expr, cst.Name) else []


def is_keras3_optimizer(fm: FileModel, expr: cst.BaseExpression, depth: int = 0) -> bool:
    """``expr`` holds a Keras optimizer made here (``tf.keras.optimizers.Adam(...)``, not a
    ``legacy`` one), maybe wrapped in a DistributedOptimizer."""
    if depth > 3:
        return False
    if isinstance(expr, cst.Call):
        if any("legacy" in q for q in fm.qualified_names(expr.func)):
            return False
        if optimizer_class(fm, expr) is not None:
            return True
        if fm.refers_to(expr.func, *OPTIMIZER_WRAPPERS) and expr.args:
            return is_keras3_optimizer(fm, expr.args[0].value, depth + 1)
        return False
    values = _values(fm, expr)
    return bool(values) and all(is_keras3_optimizer(fm, v, depth + 1) for v in values)


def optimizer_variables_calls(fm: FileModel) -> list[cst.Call]:
    """``<optimizer>.variables()`` calls (no arguments) of a Keras 3 optimizer."""
    found = []
    for call in fm.method_calls("variables"):
        func = call.func
        if (
            not call.args
            and isinstance(func, cst.Attribute)
            and is_keras3_optimizer(fm, func.value)
        ):
            found.append(call)
    return found


def is_keras_metric(fm: FileModel, expr: cst.BaseExpression) -> bool:
    values = [expr] if isinstance(expr, cst.Call) else _values(fm, expr)
    return bool(values) and all(
        isinstance(v, cst.Call)
        and any(k.startswith("keras.metrics.") for k in keras_names(fm, v.func))
        for v in values
    )


def metric_reset_states_calls(fm: FileModel) -> list[cst.Call]:
    return [
        c for c in fm.method_calls("reset_states")
        if isinstance(c.func, cst.Attribute) and is_keras_metric(fm, c.func.value)
    ]


def keras_models(fm: FileModel) -> set[str]:
    """The code of the receivers of Keras ``compile``/``fit`` calls: the script's models."""
    found = {code(c.func.value) for c in keras_fit_calls(fm)}  # type: ignore[attr-defined]
    found |= {
        code(c.func.value)  # type: ignore[attr-defined]
        for c in fm.method_calls("compile")
        if is_keras_compile(fm, c)
    }
    return found


def directory_saves(fm: FileModel) -> list[cst.Call]:
    """``model.save("dir")`` (a literal path without a Keras 3 extension, or ``save_format=``)
    of a Keras model of this script."""
    models = keras_models(fm)
    found = []
    for call in fm.method_calls("save"):
        func = call.func
        if not isinstance(func, cst.Attribute) or code(func.value) not in models:
            continue
        if arg_named(call, "save_format") is not None:
            found.append(call)
            continue
        path = arg_named(call, "filepath", 0)
        value = path.value if path is not None else None
        if isinstance(value, cst.Call) and fm.refers_to(value.func, "os.path.join") and value.args:
            value = value.args[-1].value  # os.path.join(model_dir, "1"): its last part
        text = value.evaluated_value if isinstance(value, cst.SimpleString) else None
        if isinstance(text, str) and not text.endswith(SAVE_EXTENSIONS):
            found.append(call)
    return found


def run_tf_function_args(fm: FileModel) -> list[cst.Arg]:
    """``experimental_run_tf_function=`` arguments of Keras ``compile`` calls."""
    found = []
    for call in fm.method_calls("compile"):
        arg = arg_named(call, "experimental_run_tf_function")
        if arg is not None and is_keras_compile(fm, call):
            found.append(arg)
    return found


#: ``fit``'s Keras 2 arguments for its data-loading workers, which Keras 3 rejects.
FIT_WORKER_ARGS = ("workers", "use_multiprocessing", "max_queue_size")


def keras2_arguments(fm: FileModel) -> list[tuple[cst.Arg, str]]:
    """Arguments Keras 3 rejects, with what replaces them: ``Adam(lr=...)`` (``learning_rate=``)
    and ``fit(workers=..., use_multiprocessing=..., max_queue_size=...)`` (a ``PyDataset``'s
    own ``workers=``/``use_multiprocessing=``, or a ``tf.data`` pipeline)."""
    found: list[tuple[cst.Arg, str]] = []
    for name in fm.info.calls:
        for call in fm.info.calls[name]:
            if optimizer_class(fm, call) is None or any(
                "legacy" in q for q in fm.qualified_names(call.func)
            ):
                continue
            arg = arg_named(call, "lr")
            if arg is not None:
                found.append((arg, f"{code(call.func)}(lr=...): Keras 3 optimizers take "
                                   "learning_rate= (lr= raises); rename it"))
    for call in keras_fit_calls(fm):
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "fit"):
            continue  # fit_generator: port_fit_generator drops them as it ports the call
        for keyword in FIT_WORKER_ARGS:
            arg = arg_named(call, keyword)
            if arg is not None:
                found.append((arg, f"{keyword}= is not an argument of Keras 3's fit(): remove "
                                   "it (a keras.utils.PyDataset takes workers= and "
                                   "use_multiprocessing= itself)"))
    return found


def multi_gpu_model_calls(fm: FileModel) -> list[cst.Call]:
    """Calls of ``multi_gpu_model(model, gpus=n)``: Keras 2's ``keras.utils.multi_gpu_model``,
    removed in TF 2.4, or a project's copy under that name (imported from its own module): a model
    that splits each batch over ``n`` GPUs of the one process, given the model first and the GPUs
    second or as ``gpus=``."""
    found = []
    for name, calls in fm.info.calls.items():
        if name.rpartition(".")[2] != "multi_gpu_model":
            continue
        for call in calls:
            positional = [a for a in call.args if a.keyword is None and a.star == ""]
            if positional and (len(positional) > 1 or arg_named(call, "gpus") is not None):
                found.append(call)
    return found


def gpu_count(call: cst.Call) -> cst.BaseExpression | None:
    """The GPU count a ``multi_gpu_model`` call is given (``gpus=``, or second)."""
    arg = arg_named(call, "gpus", 1)
    return arg.value if arg is not None else None


def divided_by(fm: FileModel, expr: cst.BaseExpression | None) -> cst.BinaryOperation | None:
    """A division of the file by ``expr``'s code (``batch_size // multi_gpu``): something was
    sized per GPU (a model built for its share of the batch), so the model ``multi_gpu_model``
    split the batch for cannot simply stand in for it."""
    if expr is None or isinstance(expr, (cst.Integer, cst.SimpleString)):
        return None
    spelled = code(expr)
    for op in findall(fm.module, m.BinaryOperation(operator=m.FloorDivide() | m.Divide())):
        if code(op.right) == spelled:  # type: ignore[attr-defined]
            return op  # type: ignore[return-value]
    return None


#: Where Keras 2 kept ``multi_gpu_model`` (gone since TF 2.4: importing it raises).
MULTI_GPU_MODULES = ("keras.utils", "tensorflow.keras.utils", "keras.utils.training_utils",
                     "tensorflow.python.keras.utils")


def unused_multi_gpu_imports(fm: FileModel, replaced: list[cst.Call]) -> list[cst.ImportAlias]:
    """The ``from keras.utils import multi_gpu_model`` names (of ``MULTI_GPU_MODULES``) that
    nothing reads once the ``replaced`` calls are gone: importing them fails on TF 2.4+.
    (The file's ``from`` imports come from its index, ``nodes_of``: no walk per call.)"""
    found = []
    callees = [c.func for c in replaced if isinstance(c.func, cst.Name)]
    for stmt in nodes_of(fm, cst.ImportFrom):
        module = stmt.module  # type: ignore[attr-defined]
        if module is None or code(module) not in MULTI_GPU_MODULES or isinstance(
            stmt.names, cst.ImportStar  # type: ignore[attr-defined]
        ):
            continue
        for alias in stmt.names:  # type: ignore[attr-defined]
            if code(alias.name) != "multi_gpu_model":
                continue
            name = code(alias.asname.name) if alias.asname else "multi_gpu_model"
            reads = [n for n in findall(fm.module, m.Name(name))
                     if not any(isinstance(a, cst.ImportFrom) for a in fm.ancestors(n))]
            if all(any(r is c for c in callees) for r in reads):
                found.append(alias)
    return found
