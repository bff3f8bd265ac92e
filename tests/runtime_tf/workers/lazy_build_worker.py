"""Run by sdp-run on N ranks (or alone): ``fit`` with ``BroadcastGlobalVariablesCallback`` on
models Keras builds only in the first training step, and ``barrier()``.

Each model kind starts from different random weights on every rank (seed = rank) and trains on
the rank's own rows; after ``fit`` the trainable weights must be equal on all ranks. Writes the
passed checks and the weights to ``OUT_DIR/rank<r>.json``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import keras
import numpy as np
import sdp_runtime.tensorflow as sdp
import tensorflow as tf


class Subclassed(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.drop = keras.layers.Dropout(0.3)
        self.out = keras.layers.Dense(1)

    def call(self, x, training=False):
        return self.out(self.drop(self.hidden(x), training=training))


def functional() -> keras.Model:
    inputs = keras.Input((5,))
    h = keras.layers.Dense(8, activation="relu")(inputs)
    h = keras.layers.Dropout(0.3)(h)
    return keras.Model(inputs, keras.layers.Dense(1)(h))


MODELS = {
    # the minimal case: variables (Dropout's seed) but no trainable variables yet
    "sequential_dropout": lambda: keras.Sequential(
        [keras.layers.Dense(4), keras.layers.Dropout(0.5), keras.layers.Dense(1)]
    ),
    "sequential_batchnorm": lambda: keras.Sequential(
        [keras.layers.Dense(8), keras.layers.BatchNormalization(), keras.layers.Dense(1)]
    ),
    "sequential_noise_flip": lambda: keras.Sequential(
        [keras.layers.GaussianNoise(0.1), keras.layers.Dense(6), keras.layers.Dense(1)]
    ),
    "subclassed": Subclassed,
    "functional": functional,
}


def main(out_dir: Path) -> None:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    sdp.init()
    r, n = sdp.rank(), sdp.size()
    rng = np.random.default_rng(7)
    x = rng.normal(size=(48, 5)).astype(np.float32)
    y = (x @ rng.normal(size=(5, 1))).astype(np.float32)
    rows = np.arange(r, 48, n)
    passed: list[str] = []
    weights: dict[str, list] = {}
    for name, make in MODELS.items():
        keras.utils.set_random_seed(100 + r)  # different initial weights on every rank
        model = make()
        optimizer = sdp.keras.DistributedOptimizer(keras.optimizers.Adam(0.01))
        model.compile(optimizer=optimizer, loss="mse")
        data = tf.data.Dataset.from_tensor_slices((x[rows], y[rows])).batch(8 // n)
        model.fit(
            data,
            epochs=2,
            verbose=0,
            callbacks=[sdp.keras.callbacks.BroadcastGlobalVariablesCallback(0)],
        )
        assert int(optimizer.iterations.numpy()) == 2 * len(rows) // (8 // n), name
        weights[name] = [v.numpy().tolist() for v in model.trainable_variables]
        passed.append(name)

    # barrier(): rank 0 writes late; every rank reads it after the barrier.
    shared = out_dir / "written_by_rank0.txt"
    if r == 0:
        time.sleep(1.0)
        shared.write_text("from rank 0")
    sdp.barrier()
    assert shared.read_text() == "from rank 0"
    passed.append("barrier")

    (out_dir / f"rank{r}.json").write_text(
        json.dumps({"rank": r, "size": n, "passed": passed, "weights": weights})
    )
    sdp.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
