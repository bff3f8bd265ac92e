"""Run by sdp-run on N ranks: training steps compiled with XLA (``jit_compile=True``).

Three ways to train, each from weights every rank draws differently (the broadcast makes them
equal) on rank ``r``'s part of every global batch of ``GLOBAL_BATCH`` rows:

* ``fit``: Keras' own ``train_step`` with ``compile(jit_compile=True)`` and ``SDP_TF_XLA=split``
  (the default on a GPU): on N > 1 ranks the runtime splits the step (forward/backward and update
  in two XLA functions, the allreduce between them); evaluation keeps XLA;
* ``fit_auto``: the same with the default ``SDP_TF_XLA=auto``, which on these CPU-only processes
  runs the training step without XLA;
* ``fit_custom_step``: a model whose ``train_step`` uses a ``DistributedGradientTape``; on N > 1
  ranks the runtime runs the step without XLA;
* ``tape_step``: a custom loop whose step is ``tf.function(jit_compile=sdp.size() == 1)``, what
  sdp-convert makes of ``tf.function(jit_compile=True)`` around a wrapped tape.

Writes the final weights of each, what the runtime reported, and the checks that passed, to
``OUT_DIR/rank<r>.json``; the test compares N ranks with one rank training on the whole batch.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import keras
import numpy as np
import sdp_runtime.tensorflow as sdp
import sdp_runtime.tensorflow.keras as sdp_keras
import tensorflow as tf
from sdp_runtime.tensorflow.keras import xla

GLOBAL_BATCH = 8
SAMPLES = 32
EPOCHS = 2

passed: list[str] = []


def make_model(seed: int, cls: type = keras.Sequential) -> keras.Model:
    keras.utils.set_random_seed(seed)
    layers = [keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(1)]
    if cls is keras.Sequential:
        return keras.Sequential([keras.Input((5,)), *layers])
    inputs = keras.Input((5,))
    return cls(inputs, layers[1](layers[0](inputs)))


class TapeModel(keras.Model):
    """A ``train_step`` of the user's, as sdp-convert leaves it: the tape is distributed."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        tape = sdp.DistributedGradientTape(tape)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
        return {"loss": loss}


def rows(n: int, r: int) -> np.ndarray:
    batch = GLOBAL_BATCH // n
    starts = range(r * batch, SAMPLES, GLOBAL_BATCH)
    return np.concatenate([np.arange(start, start + batch) for start in starts])


def weights(model: keras.Model) -> list:
    return [w.numpy().tolist() for w in model.weights]


def main(out_dir: Path) -> None:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    sdp.init()
    r, n = sdp.rank(), sdp.size()
    rng = np.random.default_rng(7)
    x = rng.normal(size=(SAMPLES, 5)).astype(np.float32)
    y = (x @ rng.normal(size=(5, 1)) - 0.2).astype(np.float32)
    mine = rows(n, r)
    batch = GLOBAL_BATCH // n
    result: dict = {"rank": r, "size": n}

    # -- Keras' own train_step: split (forced, as on a GPU), then auto (off without a GPU) -------
    for case, mode in (("fit", "split"), ("fit_auto", "auto")):
        os.environ["SDP_TF_XLA"] = mode
        model = make_model(seed=r)
        model.compile(
            optimizer=sdp_keras.DistributedOptimizer(keras.optimizers.Adam(0.01)),
            loss="mse",
            metrics=["mae"],
            jit_compile=True,
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(
                x[mine], y[mine], batch_size=batch, epochs=EPOCHS, shuffle=False, verbose=0,
                callbacks=[sdp_keras.callbacks.BroadcastGlobalVariablesCallback(0),
                           sdp_keras.callbacks.MetricAverageCallback()],
            )  # fmt: skip
        result[f"{case}_warnings"] = [
            str(w.message) for w in caught if w.category is xla.XlaWarning
        ]
        prepared = getattr(model, xla._PREPARED, None)
        assert model.jit_compile is True  # evaluate/predict still compile with XLA
        if n > 1:
            assert prepared is model.train_function, "the train function was not rebuilt"
            step = model.train_function
            split = getattr(model, xla._STEP)
            if mode == "split":  # both XLA functions were traced and ran
                assert isinstance(split, xla.SplitTrainStep) and split.model is model, split
                assert split.gradients.experimental_get_tracing_count() >= 1
                assert split.apply.experimental_get_tracing_count() >= 1
            else:
                assert not isinstance(split, xla.SplitTrainStep), split
            # A second prepare (a second fit) keeps the function.
            assert xla.prepare_train_function(model) is None and model.train_function is step
        else:
            assert prepared is None, "one process must keep Keras' own train function"
        model.evaluate(x, y, verbose=0)
        passed.append(case)
        result[case] = weights(model)
    del os.environ["SDP_TF_XLA"]
    try:
        xla.prepare_train_function(model, mode="sometimes")
    except ValueError as error:
        assert "auto, split, off" in str(error), error
    else:
        raise AssertionError("an unknown SDP_TF_XLA mode must be refused")

    # -- a train_step of the user's, with a DistributedGradientTape ----------------------------
    custom = make_model(seed=r, cls=TapeModel)
    custom.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", jit_compile=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        custom.fit(
            x[mine], y[mine], batch_size=batch, epochs=EPOCHS, shuffle=False, verbose=0,
            callbacks=[sdp_keras.callbacks.BroadcastGlobalVariablesCallback(0)],
        )  # fmt: skip
    result["custom_warnings"] = [str(w.message) for w in caught if w.category is xla.XlaWarning]
    if n > 1:
        assert getattr(custom, xla._PREPARED, None) is custom.train_function
    passed.append("fit_custom_step")
    result["fit_custom_step"] = weights(custom)

    # -- a custom loop: tf.function(jit_compile=sdp.size() == 1), as sdp-convert writes it ------
    looped = make_model(seed=0)  # as in a converted script: broadcast after the first step
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)

    @tf.function(jit_compile=sdp.size() == 1)
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((looped(xb, training=True) - yb) ** 2)
        tape = sdp.DistributedGradientTape(tape)
        grads = tape.gradient(loss, looped.trainable_variables)
        optimizer.apply_gradients(zip(grads, looped.trainable_variables, strict=True))
        return loss

    data = tf.data.Dataset.from_tensor_slices((x[mine], y[mine])).batch(batch)
    first = True
    for _ in range(EPOCHS):
        for xb, yb in data:
            train_step(xb, yb)
            if first:
                sdp.broadcast_variables(looped.variables, root_rank=0)
                sdp.broadcast_variables(optimizer.variables, root_rank=0)
                first = False
    passed.append("tape_step")
    result["tape_step"] = weights(looped)

    result["passed"] = passed
    (out_dir / f"rank{r}.json").write_text(json.dumps(result))
    sdp.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
