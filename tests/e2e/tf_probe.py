"""Run a TensorFlow / Keras script and record what this process trained and evaluated on.

    SDP_PROBE_DIR=DIR python tf_probe.py SCRIPT [ARGS...]
    SDP_PROBE_DIR=DIR sdp-run -n 2 tf_probe.py SCRIPT [ARGS...]

Used by ``test_tf_sharding``: the script runs unmodified (``runpy``, as ``__main__``), and this
process writes ``DIR/probe.<pid>.json`` when it ends::

    {"rank": "0", "train": [...], "steps": 8, "fit_batches": 8, "eval": [16, 16]}

``train`` holds one id per training sample of one epoch, in the order seen: the first number of
the sample's first input (the fixtures draw inputs from a continuous distribution, so the ids are
distinct). Keras ``fit``: read from its ``x`` (arrays, a ``tf.data`` dataset iterated once here, or
a ``PyDataset``); custom loops: every element a ``tf.data`` iterator yields in Python during the
first pass over it. ``steps`` is the largest ``iterations`` of the Keras optimizers made;
``fit_batches`` the training batches ``fit`` ran (a callback counts them); ``eval`` the number of
samples in each ``validation_data`` and ``evaluate`` input (``eval_ids`` their ids);
``broadcasts`` the calls of the runtime's ``broadcast_variables`` (by the converted loop or the
Keras callback). What Keras reads itself inside ``fit``/``evaluate`` and what preprocessing layers
read in ``adapt`` is not training data.
"""

from __future__ import annotations

import json
import math
import os
import runpy
import sys
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow import keras

_record: dict[str, Any] = {
    "rank": os.environ.get("RANK", "0"), "train": [], "steps": 0, "fit_batches": 0, "eval": [],
    "broadcasts": 0, "eval_ids": [],
}
_optimizers: list[Any] = []
_quiet = [False]  # True while the probe itself reads a dataset
_inside = [False]  # True inside Keras fit/evaluate
_logged: set[int] = set()  # datasets whose first pass is recorded


def _ids(batch: Any) -> list[str]:
    leaf = np.asarray(tf.nest.flatten(batch)[0])
    rows = leaf.reshape(leaf.shape[0], -1) if leaf.ndim > 1 else leaf.reshape(-1, 1)
    return [f"{float(v):.6g}" for v in rows[:, 0]]


def _read(data: Any, validation_split: float = 0.0) -> tuple[list[str], int]:
    """(ids, number of batches or -1) of one pass over ``data``."""
    _quiet[0] = True
    try:
        if isinstance(data, tf.data.Dataset):
            ids, batches = [], 0
            for element in data:
                ids += _ids(element)
                batches += 1
            return ids, batches
        if isinstance(data, keras.utils.PyDataset):
            ids = []
            for i in range(len(data)):
                ids += _ids(data[i])
            return ids, len(data)
        ids = _ids(data)
        if validation_split:
            ids = ids[: int(math.ceil(len(ids) * (1.0 - validation_split)))]
        return ids, -1
    finally:
        _quiet[0] = False


class _Count(keras.callbacks.Callback):
    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        _record["fit_batches"] += 1


_fit = keras.Model.fit
_evaluate = keras.Model.evaluate


def _fit_probe(self: Any, x: Any = None, y: Any = None, *args: Any, **kwargs: Any) -> Any:
    ids, _ = _read(x, kwargs.get("validation_split", 0.0))
    _record["train"] += ids
    validation = kwargs.get("validation_data")
    if validation is not None:
        data = validation if isinstance(validation, tf.data.Dataset) else validation[0]
        ids = _read(data)[0]
        _record["eval"].append(len(ids))
        _record["eval_ids"] += ids
    kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), _Count()]
    _inside[0] = True  # what Keras iterates itself (validation included) is recorded above
    try:
        return _fit(self, x, y, *args, **kwargs)
    finally:
        _inside[0] = False


def _evaluate_probe(self: Any, x: Any = None, *args: Any, **kwargs: Any) -> Any:
    if _inside[0]:  # fit's own validation
        return _evaluate(self, x, *args, **kwargs)
    ids = _read(x)[0]
    _record["eval"].append(len(ids))
    _record["eval_ids"] += ids
    _inside[0] = True
    try:
        return _evaluate(self, x, *args, **kwargs)
    finally:
        _inside[0] = False


_iter = tf.data.Dataset.__iter__


def _iter_probe(self: Any) -> Any:
    iterator = _iter(self)
    if _quiet[0] or _inside[0] or id(self) in _logged:
        return iterator
    _logged.add(id(self))

    def logged() -> Any:
        for element in iterator:
            if not (_quiet[0] or _inside[0]):
                _record["train"].extend(_ids(element))
            yield element

    return logged()


_optimizer_init = keras.optimizers.Optimizer.__init__


def _optimizer_probe(self: Any, *args: Any, **kwargs: Any) -> None:
    _optimizer_init(self, *args, **kwargs)
    _optimizers.append(self)


def _write() -> None:
    steps = [int(o.iterations.numpy()) for o in _optimizers if hasattr(o, "iterations")]
    _record["steps"] = max(steps, default=0)
    out = os.path.join(os.environ["SDP_PROBE_DIR"], f"probe.{os.getpid()}.json")
    with open(out, "w") as f:
        json.dump(_record, f)


def _count_broadcasts() -> None:
    import sdp_runtime.tensorflow as sdp
    import sdp_runtime.tensorflow.keras.callbacks as callbacks

    original = sdp.broadcast_variables

    def counted(*args: Any, **kwargs: Any) -> Any:
        _record["broadcasts"] += 1
        return original(*args, **kwargs)

    sdp.broadcast_variables = counted
    callbacks.broadcast_variables = counted  # type: ignore[attr-defined]


def _quiet_adapt() -> None:
    """What preprocessing layers read in ``adapt`` is no training data."""
    for name in ("Normalization", "TextVectorization", "StringLookup", "IntegerLookup",
                 "Discretization"):
        cls = getattr(keras.layers, name, None)
        adapt = getattr(cls, "adapt", None)
        if adapt is None:
            continue

        def quiet(self: Any, *args: Any, _adapt: Any = adapt, **kwargs: Any) -> Any:
            _inside[0] = True
            try:
                return _adapt(self, *args, **kwargs)
            finally:
                _inside[0] = False

        cls.adapt = quiet  # type: ignore[union-attr]


def main() -> None:
    _count_broadcasts()
    _quiet_adapt()
    keras.Model.fit = _fit_probe
    keras.Model.evaluate = _evaluate_probe
    tf.data.Dataset.__iter__ = _iter_probe
    keras.optimizers.Optimizer.__init__ = _optimizer_probe
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        _write()


if __name__ == "__main__":
    main()
