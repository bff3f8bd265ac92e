"""Keras ``fit`` under XLA: the gradient allreduce cannot be compiled, the rest of the step can.

Keras compiles its whole training step with XLA when ``compile(jit_compile=True)`` asks for it, or
when ``jit_compile="auto"`` (the default) finds a GPU. The runtime's collectives are Python
callbacks (``tf.py_function``) that XLA cannot compile, so on several processes the step is
rebuilt, once, when training begins (the callbacks of :mod:`.callbacks` call
:func:`prepare_train_function`), in one of two ways:

* **split**: forward, loss, gradients and metrics in one XLA function, ``optimizer.apply`` in a
  second; the gradients leave the first, are averaged across processes, and enter the second.
  The step keeps XLA for everything but the communication. Needs Keras' own ``train_step`` and a
  :func:`DistributedOptimizer` as the model's optimizer.
* **off**: the training step runs as a ``tf.function`` without XLA.

Which one (``SDP_TF_XLA``, default ``auto``): split where TensorFlow sees a GPU (where Keras' own
``"auto"`` turns XLA on because it is faster there), off on CPU-only processes (XLA measured
slower there, ``benchmarks/results/tf_xla.md``), off whatever the setting for a ``train_step`` of
the user's (e.g. one with a ``DistributedGradientTape``) or an optimizer wrapped in something
else (Keras' ``LossScaleOptimizer``). Evaluation and prediction keep XLA (they do not
communicate). Rank 0 says once what was done (:class:`XlaWarning`).

On one process nothing changes: the collectives are identities there and XLA compiles them away.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import keras
import tensorflow as tf

from sdp_runtime import _comm
from sdp_runtime.tensorflow.collectives import grouped_allreduce
from sdp_runtime.tensorflow.keras.optimizer import apply_reduced, capture_apply, is_distributed

#: Attributes a prepared model keeps its train function and its step under.
_PREPARED = "_sdp_xla_train_function"
_STEP = "_sdp_xla_step"
#: What ``SDP_TF_XLA`` / ``prepare_train_function(mode=)`` may say.
MODES = ("auto", "split", "off")
_warned: set[str] = set()


class XlaWarning(UserWarning):
    """What the runtime did about XLA in a training step (shown once per process, on rank 0)."""


class SplitTrainStep:
    """Keras' ``train_step`` in two XLA functions, with the gradient allreduce between them.

    The first function traces the model's own ``train_step`` while the optimizer only records
    what it is asked to apply (:func:`capture_apply`), and returns the step's logs and the
    gradients; the second applies the averaged gradients. Called inside Keras' train function,
    which then runs without XLA itself.

    Arguments:
        model: a compiled Keras model whose optimizer is a :func:`DistributedOptimizer`.

    Example:
        >>> step = SplitTrainStep(model)
        >>> logs = step(data)  # inside a tf.function
    """

    def __init__(self, model: keras.Model) -> None:
        self.model = model
        self.optimizer = model.optimizer
        self.keras_step = model.train_step
        self.variables: Any = None
        self.gradients = tf.function(self._gradients, jit_compile=True, reduce_retracing=True)
        self.apply = tf.function(self._apply, jit_compile=True, reduce_retracing=True)

    def _gradients(self, data: Any) -> tuple[Any, list[Any]]:
        with capture_apply(self.optimizer) as calls:
            logs = self.keras_step(data)
        if not calls:  # no trainable weights: Keras warned, nothing to apply
            return logs, []
        if len(calls) > 1:
            raise RuntimeError("train_step applied gradients more than once; cannot split it")
        grads, self.variables = calls[0]
        return logs, grads

    def _apply(self, grads: list[Any]) -> None:
        apply_reduced(self.optimizer, grads, self.variables)

    @tf.autograph.experimental.do_not_convert
    def __call__(self, data: Any) -> Any:
        logs, grads = self.gradients(data)
        if grads:
            grads = grouped_allreduce(grads, **self.optimizer._sdp_options)
            self.apply(grads)
        return logs


def prepare_train_function(model: keras.Model, mode: str | None = None) -> str | None:
    """Make ``model``'s train function run the runtime's collectives outside XLA, if it uses XLA.

    Does nothing on one process, for a model that does not use XLA (``jit_compile`` false, or
    ``run_eagerly``), or whose train function it already prepared. Otherwise rebuilds the train
    function, split (XLA kept around the allreduce) or without XLA, as the module docstring says.
    Called by the runtime's callbacks at ``on_train_begin``; call it yourself (after
    ``compile``) if ``fit`` has none of them.

    Arguments:
        model: a compiled Keras model.
        mode: ``"auto"`` (split with a GPU, off without), ``"split"`` or ``"off"``; default: the
            ``SDP_TF_XLA`` environment variable, else ``"auto"``. A ``train_step`` of the user's
            or an optimizer that is not a :func:`DistributedOptimizer` itself is always off.

    Returns:
        ``"split"``, ``"off"``, or ``None`` when nothing was changed.

    Example:
        >>> model.compile(optimizer=sdp.keras.DistributedOptimizer(opt), jit_compile=True)
        >>> sdp.keras.prepare_train_function(model)
        'split'
    """
    mode = (mode or os.environ.get("SDP_TF_XLA") or "auto").strip().lower()
    if mode not in MODES:
        raise ValueError(f"SDP_TF_XLA / mode must be one of {', '.join(MODES)}, not {mode!r}")
    if _comm.size() == 1 or model.run_eagerly or not model.jit_compile:
        return None
    current = model.train_function
    if current is not None and getattr(model, _PREPARED, None) is current:
        return None
    keras_step = getattr(type(model), "train_step", None) is _keras_train_step()
    if not keras_step:
        why = f"{type(model).__name__} defines its own train_step"
    elif not is_distributed(model.optimizer):
        why = (
            f"its optimizer ({type(model.optimizer).__name__}) is not a "
            "sdp.keras.DistributedOptimizer itself"
        )
    elif mode == "off":
        why = "SDP_TF_XLA=off"
    elif mode == "auto" and not tf.config.list_logical_devices("GPU"):
        why = (
            "this process has no GPU, and on CPUs XLA measured slower than no XLA "
            "(SDP_TF_XLA=split keeps XLA around the allreduce)"
        )
    else:
        _inform(
            "split",
            "model.fit with XLA on several processes: forward and backward pass in one XLA "
            "function, the optimizer update in another, the gradient allreduce between them "
            "(XLA cannot compile it)",
        )
        _rebuild(model, SplitTrainStep(model))
        return "split"
    _inform(
        f"off: {why}",
        f"model.fit on several processes: the training step runs without XLA (jit_compile "
        f"still holds for evaluate/predict) because {why}; XLA cannot compile the gradient "
        f"allreduce",
    )
    _rebuild(model, model.train_step)
    return "off"


def _rebuild(model: keras.Model, step: Any) -> None:
    """Remake Keras' train function around ``step``, its outer ``tf.function`` without XLA."""
    jit = model.jit_compile
    # Keras reads both when it makes the function: an instance attribute shadows train_step
    # for that moment only (object's own setattr, so Keras does not track it).
    object.__setattr__(model, "train_step", step)
    model.jit_compile = False
    try:
        model.make_train_function(force=True)
    finally:
        object.__delattr__(model, "train_step")
        model.jit_compile = jit
    object.__setattr__(model, _PREPARED, model.train_function)
    object.__setattr__(model, _STEP, step)


def _keras_train_step() -> Any:
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    return TensorFlowTrainer.train_step


def _inform(key: str, message: str) -> None:
    if key in _warned or _comm.rank() != 0:
        return
    _warned.add(key)
    warnings.warn(f"sdp_runtime: {message}", XlaWarning, stacklevel=3)
