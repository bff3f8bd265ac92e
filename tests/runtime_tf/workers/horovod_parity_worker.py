"""Run by sdp-run on N ranks: Horovod's TF / Keras API where Horovod's own test suites
(benchmarks/horovod_suites.py) found sdp_runtime lacking, against exact values.

The names of the checks that passed go to ``OUT_DIR/rank<r>.json``; a failing check raises.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import keras
import numpy as np
import sdp_runtime.tensorflow as sdp
import sdp_runtime.tensorflow.keras as hvd_keras
import tensorflow as tf

passed: list[str] = []


def check(fn):
    fn()
    passed.append(fn.__name__)
    return fn


def raises(error, call, contains: str) -> str:
    try:
        call()
    except error as raised:
        assert contains in str(raised), f"{contains!r} not in {raised}"
        return str(raised)
    raise AssertionError(f"{call} did not raise {error.__name__}")


def fit_learning_rates(callbacks, epochs: int = 3, lr: float = 0.4) -> list[float]:
    """The learning rate logged at the end of each epoch of a tiny fit."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(lr)), loss="mse")
    x, y = np.ones((8, 2), np.float32), np.ones((8, 1), np.float32)
    history = model.fit(x, y, batch_size=4, epochs=epochs, verbose=0,
                        callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0),
                                   *callbacks])
    return [round(v, 6) for v in history.history.get("learning_rate", [])]


def main(out_dir: Path) -> None:
    sdp.init()
    n, r = sdp.size(), sdp.rank()

    @check
    def alltoall_reducescatter_grouped_allgather_eager_and_in_tf_function():
        rows = tf.fill([(r + 1) * n, 2], float(r))
        for run in (lambda f: f(), lambda f: tf.function(f)()):
            out, received = run(lambda: sdp.alltoall(rows, splits=[r + 1] * n))
            assert received.numpy().tolist() == [k + 1 for k in range(n)], received
            assert out.numpy().tolist() == [[float(k)] * 2 for k in range(n) for _ in range(k + 1)]
            block = run(lambda: sdp.reducescatter(tf.ones([2 * n + 1, 3]) * (r + 1), op=sdp.Sum))
            rows_here = 3 if r == 0 else 2
            assert block.numpy().tolist() == [[n * (n + 1) / 2] * 3] * rows_here, block
            a, b = run(lambda: sdp.grouped_reducescatter([tf.ones([n]), tf.ones([n], tf.int32)],
                                                         op=sdp.Sum))
            assert a.numpy().tolist() == [float(n)] and b.numpy().tolist() == [n]
        even = sdp.alltoall(tf.range(n) + 10 * r)
        assert even.numpy().tolist() == [10 * k + r for k in range(n)]
        mean = sdp.reducescatter(tf.ones([n]) * (r + 1))  # Average by default
        assert np.allclose(mean.numpy(), [(n + 1) / 2])
        a, b = sdp.grouped_allgather([tf.constant([r]), tf.fill([1, 2], float(r))])
        assert a.numpy().tolist() == list(range(n))
        assert b.numpy().tolist() == [[float(k)] * 2 for k in range(n)]

    @check
    def integers_scale_in_float64_truncated_as_horovod():
        t = sdp.allreduce(tf.constant([3, -3]), op=sdp.Sum, prescale_factor=0.5)
        assert t.dtype == tf.int32 and t.numpy().tolist() == [n, -n], t
        half = sdp.allreduce(tf.constant([3.0], tf.float16), op=sdp.Sum, postscale_factor=0.5)
        assert half.dtype == tf.float16 and half.numpy().tolist() == [1.5 * n], half

    @check
    def tf1_graph_collectives_run_in_the_order_they_were_made_on_every_rank():
        with tf.Graph().as_default():
            a = sdp.allreduce(tf.constant([1.0 * (r + 1)]), op=sdp.Sum)
            b = sdp.allreduce(tf.constant([[2.0]]), op=sdp.Sum)
            c = sdp.allgather(tf.constant([r]))
            with tf.compat.v1.Session() as session:
                fetch = [a, b, c] if r == 0 else [c, b, a]  # a session's own order differs
                out = session.run(fetch)
                out = out if r == 0 else out[::-1]
                assert out[0].tolist() == [n * (n + 1) / 2] and out[1].tolist() == [[2.0 * n]]
                assert out[2].tolist() == list(range(n))
                assert session.run(b).tolist() == [[2.0 * n]]

    @check
    def broadcast_in_place_object_fn_ops_and_build_queries():
        v = tf.Variable([float(r), 1.0])
        (value,) = sdp.broadcast_([v], root_rank=n - 1)
        assert v.numpy().tolist() == [float(n - 1), 1.0] == value.numpy().tolist()
        assert sdp.broadcast_object_fn(root_rank=0)({"r": r}) == {"r": 0}
        assert sdp.size_op().numpy() == n and sdp.rank_op().numpy() == r
        assert sdp.local_size_op().numpy() == n and sdp.local_rank_op().numpy() == r
        assert sdp.process_set_included_op().numpy() == 1 and sdp.is_homogeneous()
        assert not sdp.ccl_built() and not sdp.mpi_enabled() and sdp.gloo_enabled()
        assert sdp.HorovodInternalError is sdp.CommunicationError

    @check
    def the_global_process_set_is_accepted_and_others_refused():
        total = sdp.allreduce(tf.constant(1.0), op=sdp.Sum, process_set=sdp.global_process_set)
        assert total.numpy() == n

        class Subset:
            ranks = [0]

        for call in (
            lambda: sdp.allreduce(tf.constant(1.0), process_set=Subset()),
            lambda: sdp.allgather(tf.constant([1.0]), process_set=Subset()),
            lambda: sdp.broadcast_variables([tf.Variable(1.0)], 0, process_set=Subset()),
            lambda: sdp.DistributedGradientTape(tf.GradientTape(), process_set=Subset()),
            lambda: hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                   process_set=Subset()),
            lambda: sdp.init(process_sets=[Subset()]),
        ):
            raises(sdp.NotProvidedError, call, "process sets are not supported")

    @check
    def names_not_provided_say_what_to_do_instead():
        for module, prefix, name, advice in (
            (sdp, "horovod.tensorflow", "join", "same number of batches"),
            (sdp, "horovod.tensorflow", "SyncBatchNormalization", "BatchNormalization"),
            (sdp, "horovod.tensorflow", "Adasum", "op=Average"),
            (hvd_keras, "horovod.tensorflow.keras", "PartialDistributedOptimizer",
             "DistributedOptimizer"),
            (hvd_keras, "horovod.tensorflow.keras", "elastic", "checkpoint every epoch"),
        ):
            assert not hasattr(module, name)
            message = raises(NotImplementedError, lambda m=module, a=name: getattr(m, a), advice)
            assert message.startswith(f"{prefix}.{name} is not provided"), message
        assert sdp.keras is hvd_keras  # the lazily imported submodule still resolves

    @check
    def keras_collectives_take_horovods_keras_argument_order():
        total = hvd_keras.allreduce(np.array([float(r)]), "a_name", False)  # average=False
        assert total.numpy().tolist() == [n * (n - 1) / 2]
        assert hvd_keras.reducescatter(np.ones((n, 1)), "rs", sdp.Sum).numpy().tolist() == [[n]]

    @check
    def warmup_without_initial_lr_ramps_to_the_optimizers_rate():
        # Horovod <= 0.20: LearningRateWarmupCallback(warmup_epochs=...), no initial_lr.
        old = fit_learning_rates([hvd_keras.callbacks.LearningRateWarmupCallback(warmup_epochs=2)])
        new = fit_learning_rates([hvd_keras.callbacks.LearningRateWarmupCallback(0.4, 2)])
        assert old == new, (old, new)
        assert old[-1] == 0.4 and old[0] == round(0.4 / n * ((n - 1) / 2 + 1), 6), old

    @check
    def schedule_in_both_horovod_call_styles():
        # Horovod 0.21+: (initial_lr, multiplier) with a number: decay from start_epoch on.
        new = fit_learning_rates(
            [hvd_keras.callbacks.LearningRateScheduleCallback(0.4, 0.5, start_epoch=1)])
        assert new == [0.4, 0.4, 0.2], new
        # Horovod <= 0.20: (multiplier, start_epoch=...), initial_lr read from the optimizer, a
        # number a constant factor.
        old = fit_learning_rates(
            [hvd_keras.callbacks.LearningRateScheduleCallback(multiplier=0.5, start_epoch=1)])
        assert old == [0.4, 0.2, 0.2], old
        positional = fit_learning_rates(
            [hvd_keras.callbacks.LearningRateScheduleCallback(lambda e: 0.25, start_epoch=2)])
        assert positional == [0.4, 0.4, 0.1], positional

    @check
    def metric_average_with_device_and_best_model_checkpoint():
        hvd_keras.callbacks.MetricAverageCallback(device="")
        path = out_dir / f"best{r}.weights.h5"
        fit_learning_rates([hvd_keras.callbacks.BestModelCheckpoint(
            str(path), monitor="loss", save_weights_only=True)], epochs=1)
        assert path.exists()

    result = {"rank": r, "size": n, "passed": passed}
    (out_dir / f"rank{r}.json").write_text(json.dumps(result))
    sdp.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
