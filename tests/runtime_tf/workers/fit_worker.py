"""Run by sdp-run on N ranks: Keras ``model.fit`` with the distributed optimizer and callbacks.

Every rank starts from different random weights and trains on its own shard with batch
``GLOBAL_BATCH / N``; the union of the ranks' batches at each step is the one-process batch
``GLOBAL_BATCH``, so the final weights must equal those of the run on one process. Writes the
weights, the averaged and local epoch losses and the passed checks to ``OUT_DIR/rank<r>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import keras
import numpy as np
import sdp_runtime.tensorflow.keras as sdp
import tensorflow as tf

GLOBAL_BATCH = 8
SAMPLES = 32
EPOCHS = 2


def make_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)]
    )


def shard(n: int, r: int) -> np.ndarray:
    """Rows rank ``r`` sees: at step s, all ranks together see rows [s*G, (s+1)*G)."""
    batch = GLOBAL_BATCH // n
    starts = range(r * batch, SAMPLES, GLOBAL_BATCH)
    return np.concatenate([np.arange(start, start + batch) for start in starts])


class LocalLogs(keras.callbacks.Callback):
    """Keeps this rank's own epoch loss, seen before MetricAverageCallback averages it."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def on_epoch_end(self, epoch, logs=None):
        self.losses.append(float(logs["loss"]))


class LearningRates(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.rates: list[float] = []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(self.model.optimizer.learning_rate))


def main(out_dir: Path) -> None:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    sdp.init()
    r, n = sdp.rank(), sdp.size()
    passed: list[str] = []

    rng = np.random.default_rng(123)
    x = rng.normal(size=(SAMPLES, 5)).astype(np.float32)
    y = (x @ rng.normal(size=(5, 1)) + 0.1).astype(np.float32)
    rows = shard(n, r)
    batch, steps = GLOBAL_BATCH // n, SAMPLES // GLOBAL_BATCH

    model = make_model(seed=r)  # different initial weights on every rank
    optimizer = sdp.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9))
    model.compile(optimizer=optimizer, loss="mse", metrics=["mae"])
    local = LocalLogs()
    history = model.fit(
        x[rows],
        y[rows],
        batch_size=batch,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        callbacks=[
            sdp.callbacks.BroadcastGlobalVariablesCallback(0),
            local,
            sdp.callbacks.MetricAverageCallback(),
        ],
    )
    assert int(optimizer.iterations.numpy()) == EPOCHS * steps

    if r == 0:
        path = out_dir / "model.keras"
        model.save(path)
        plain = keras.models.load_model(path)
        assert type(plain.optimizer) is keras.optimizers.SGD, type(plain.optimizer).__mro__
        assert not sdp.optimizer.is_distributed(plain.optimizer)
        for a, b in zip(plain.weights, model.weights, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        for a, b in zip(plain.optimizer.variables, optimizer.variables, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        again = sdp.load_model(path)
        assert sdp.optimizer.is_distributed(again.optimizer)
        assert isinstance(again.optimizer, keras.optimizers.SGD)
        assert again.optimizer.get_config() == plain.optimizer.get_config()
        passed.append("save_and_load")

    # Warmup from initial_lr/n to initial_lr over 2 epochs of 4 steps, batch by batch.
    warm = make_model(seed=0)
    warm.compile(optimizer=sdp.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    rates = LearningRates()
    warm.fit(
        x[rows],
        y[rows],
        batch_size=batch,
        epochs=3,
        shuffle=False,
        verbose=0,
        callbacks=[sdp.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=2), rates],
    )
    expected = [
        0.1 * min(1.0, (1 + (e + (b + 1) / steps) * (n - 1) / 2) / n)
        for e in range(3)
        for b in range(steps)
    ]
    np.testing.assert_allclose(rates.rates, expected, rtol=1e-6)
    passed.append("warmup")

    # Horovod's step schedule: x0.5 per epoch (staircase) from epoch 1 on, in epochs 1-2 (a number
    # decays from start_epoch: 0.1 * 0.5 ** (epoch - 1), as in Horovod 0.23 and later), then a
    # per-batch function of the fractional epoch from epoch 3 on; epoch 0 keeps the optimizer's
    # own rate.
    sched = make_model(seed=0)
    sched.compile(optimizer=sdp.DistributedOptimizer(keras.optimizers.SGD(0.2)), loss="mse")
    rates = LearningRates()
    sched.fit(
        x[rows],
        y[rows],
        batch_size=batch,
        epochs=4,
        shuffle=False,
        verbose=0,
        callbacks=[
            sdp.callbacks.LearningRateScheduleCallback(0.1, 0.5, start_epoch=1, end_epoch=3),
            sdp.callbacks.LearningRateScheduleCallback(
                0.1, lambda epoch: 1.0 / (1.0 + epoch), start_epoch=3, staircase=False
            ),
            rates,
        ],
    )
    expected = (
        [0.2] * steps + [0.1] * steps + [0.05] * steps
        + [0.1 / (1.0 + 3 + b / steps) for b in range(steps)]
    )
    np.testing.assert_allclose(rates.rates, expected, rtol=1e-6)
    passed.append("schedule")

    result = {
        "rank": r,
        "size": n,
        "passed": passed,
        "weights": [w.numpy().tolist() for w in model.weights],
        "loss": history.history["loss"],
        "local_loss": local.losses,
    }
    (out_dir / f"rank{r}.json").write_text(json.dumps(result))
    sdp.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
