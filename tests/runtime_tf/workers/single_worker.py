"""Run as a plain ``python script.py`` (no launcher): one process must behave as no wrapper at all.

Also checks that importing the package prints nothing and pulls in nothing heavy.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

HEAVY = {"pandas", "scipy", "matplotlib", "jax", "sklearn", "horovod", "tf_keras"}


def main(out_dir: Path) -> None:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    before = set(sys.modules)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        import sdp_runtime.tensorflow as sdp
        import sdp_runtime.tensorflow.keras as sdp_keras
    assert printed.getvalue() == "", printed.getvalue()
    new = {m.split(".")[0] for m in set(sys.modules) - before}
    assert not new & HEAVY, new & HEAVY
    assert not sdp.is_initialized()
    passed = ["quiet_light_import"]

    sdp.init()
    assert (sdp.size(), sdp.rank(), sdp.local_rank(), sdp.local_size()) == (1, 0, 0, 1)
    x = tf.constant([1.5, -2.25, 3.0])
    compiled_allreduce = tf.function(sdp.allreduce)
    for fn in (sdp.allreduce, compiled_allreduce):
        assert np.array_equal(fn(x).numpy(), x.numpy())
    assert np.array_equal(sdp.allreduce(x, op=sdp.Sum).numpy(), x.numpy())
    assert np.array_equal(sdp.allgather(x).numpy(), x.numpy())
    assert np.array_equal(sdp.broadcast(x, 0).numpy(), x.numpy())
    assert sdp.broadcast_object("a") == "a" and sdp.allgather_object(1) == [1]
    passed.append("collectives_are_identities")

    # Training with the wrappers on one process is bit-for-bit training without them.
    rng = np.random.default_rng(0)
    data = rng.normal(size=(16, 3)).astype(np.float32)
    target = data.sum(1, keepdims=True)

    def model() -> keras.Model:
        keras.utils.set_random_seed(5)
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])

    def fit(distributed: bool) -> list[np.ndarray]:
        m = model()
        opt = keras.optimizers.Adam(0.01)
        callbacks = []
        if distributed:
            opt = sdp_keras.DistributedOptimizer(opt)
            callbacks = [
                sdp_keras.callbacks.BroadcastGlobalVariablesCallback(0),
                sdp_keras.callbacks.MetricAverageCallback(),
            ]
        m.compile(optimizer=opt, loss="mse")
        m.fit(data, target, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
        return [w.numpy() for w in m.weights]

    for a, b in zip(fit(False), fit(True), strict=True):
        np.testing.assert_array_equal(a, b)
    passed.append("fit_unchanged")

    def tape_step(distributed: bool, compiled: bool) -> list[np.ndarray]:
        m = model()
        opt = keras.optimizers.SGD(0.1)

        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((m(data) - target) ** 2)
            if distributed:
                tape = sdp.DistributedGradientTape(tape)
            opt.apply_gradients(
                zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables, strict=True)
            )

        (tf.function(step) if compiled else step)()
        return [w.numpy() for w in m.weights]

    for compiled in (False, True):
        for a, b in zip(tape_step(False, compiled), tape_step(True, compiled), strict=True):
            np.testing.assert_array_equal(a, b)
    passed.append("tape_unchanged")

    (out_dir / "rank0.json").write_text(json.dumps({"rank": 0, "size": 1, "passed": passed}))
    sdp.shutdown()
    assert not sdp.is_initialized()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
