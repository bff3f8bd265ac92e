"""Run by sdp-run on N ranks: every TF collective, eager and in tf.function, against exact values.

Each check raises on a wrong value; the names of the checks that passed go to
``OUT_DIR/rank<r>.json`` so that the test can tell that all of them ran.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import keras
import numpy as np
import sdp_runtime.tensorflow as sdp
import tensorflow as tf
import torch
from sdp_runtime.tensorflow import bridge, collectives

DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64]
OPS = [sdp.ReduceOp.AVERAGE, sdp.ReduceOp.SUM, sdp.ReduceOp.MIN, sdp.ReduceOp.MAX]
CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
BASE = np.arange(1, 7, dtype=np.float64).reshape(2, 3)

passed: list[str] = []


def check(fn):
    fn()
    passed.append(fn.__name__)
    return fn


def as_np(t) -> np.ndarray:
    t = tf.convert_to_tensor(t)
    if t.dtype == tf.bfloat16:
        t = tf.cast(t, tf.float32)
    return t.numpy().astype(np.float64)


def equal(actual, expected, what: str, atol: float = 0.0) -> None:
    a, e = as_np(actual), np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape or not np.allclose(a, e, rtol=0, atol=atol):
        raise AssertionError(f"rank {sdp.rank()} {what}: got {a.tolist()}, expected {e.tolist()}")


def same_everywhere(arrays: list[np.ndarray], what: str) -> None:
    gathered = sdp.allgather_object([np.asarray(a) for a in arrays])
    for r, other in enumerate(gathered):
        for a, b in zip(gathered[0], other, strict=True):
            if not np.array_equal(a, b):
                raise AssertionError(f"{what}: rank {r} differs from rank 0")


def rank_input(op, r: int) -> np.ndarray:
    """Small integers, so every dtype holds the inputs and the results exactly."""
    if op is sdp.ReduceOp.AVERAGE:
        return BASE * 2 * (r + 1)  # sum is size*(size+1)*BASE: divisible by size
    if op is sdp.ReduceOp.SUM:
        return BASE * (r + 1)
    return BASE * (r + 1) * (-1) ** r


def expected_reduce(op, n: int) -> np.ndarray:
    inputs = np.stack([rank_input(op, r) for r in range(n)])
    return {
        sdp.ReduceOp.AVERAGE: inputs.mean(0),
        sdp.ReduceOp.SUM: inputs.sum(0),
        sdp.ReduceOp.MIN: inputs.min(0),
        sdp.ReduceOp.MAX: inputs.max(0),
    }[op]


def main(out_dir: Path) -> None:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    sdp.init()
    sdp.init()  # a second init is allowed, as in Horovod
    r, n = sdp.rank(), sdp.size()

    @check
    def basics():
        import os

        assert sdp.is_initialized()
        assert (r, n) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
        assert (sdp.local_rank(), sdp.local_size()) == (r, n)

    def reduce_every_op(inputs):
        return [sdp.allreduce(x, op=op) for x, op in zip(inputs, OPS, strict=True)]

    @check
    def allreduce_every_dtype_and_op():
        for mode, fn in (("eager", reduce_every_op), ("tf.function", tf.function(reduce_every_op))):
            for dtype in DTYPES:  # one trace per dtype
                inputs = [tf.constant(rank_input(op, r), dtype=dtype) for op in OPS]
                for x, y, op in zip(inputs, fn(inputs), OPS, strict=True):
                    assert y.dtype == dtype and y.shape == x.shape
                    equal(y, expected_reduce(op, n), f"{mode} {dtype.name} {op}")
                    equal(x, rank_input(op, r), f"{mode} {dtype.name} input kept")

    @check
    def allreduce_scalar_and_horovod_spellings():
        total = sum(range(1, n + 1))
        equal(sdp.allreduce(tf.constant(float(r + 1)), average=False), total, "average=False")
        equal(sdp.allreduce(tf.constant(float(r + 1)), op=sdp.Sum), total, "op=Sum")
        equal(sdp.allreduce(tf.constant(2.0 * (r + 1))), n + 1, "default average")
        equal(sdp.oob_allreduce(tf.constant(2.0 * (r + 1))), n + 1, "oob_allreduce")
        scaled = sdp.allreduce(
            tf.constant([float(r + 1)]), op=sdp.Sum, prescale_factor=2.0, postscale_factor=0.5
        )
        equal(scaled, [total], "prescale/postscale")
        fp16 = sdp.allreduce(tf.constant([0.1 * (r + 1)] * 4), compression=sdp.Compression.fp16)
        assert fp16.dtype == tf.float32
        equal(fp16, [0.1 * (n + 1) / 2] * 4, "fp16 compression", atol=1e-3)

    @check
    def inputs_are_never_written():
        v = tf.Variable([1.0, 2.0])
        sdp.allreduce(v, op=sdp.Sum)
        sdp.broadcast(v, root_rank=0)

        @tf.function
        def twice():
            # The constant feeds the collective directly: writing into it would change the
            # second result.
            c = tf.constant([1.0, 2.0])
            a = sdp.allreduce(c, op=sdp.Sum)
            b = sdp.allreduce(c, op=sdp.Sum)
            return a, b, sdp.allreduce(v, op=sdp.Sum)

        for _ in range(2):
            a, b, c = twice()
            equal(a, [n, 2 * n], "constant once")
            equal(b, [n, 2 * n], "constant twice")
            equal(c, [n, 2 * n], "variable")
        equal(v, [1.0, 2.0], "variable kept")

    @check
    def earlier_results_stay_valid():
        """Results are views of reused buffers: one still held must never be overwritten."""
        total = n * (n + 1) / 2
        compiled_sum = tf.function(lambda x: sdp.allreduce(x, op=sdp.Sum))
        kept = []
        for fn in (lambda x: sdp.allreduce(x, op=sdp.Sum), compiled_sum):
            for i in range(6):  # more calls than buffers kept per dtype
                kept.append(fn(tf.fill([1000], float(i * (r + 1)))))
        for i, result in enumerate(kept):
            equal(result, np.full([1000], (i % 6) * total), f"result {i}")
        v = tf.Variable(tf.zeros([1000]))
        v.assign(sdp.allreduce(tf.fill([1000], 1.0)))
        for _ in range(3):
            sdp.allreduce(tf.fill([1000], 5.0))
            compiled_sum(tf.fill([1000], 5.0))
        equal(v, np.ones([1000]), "variable assigned from a result")

    @check
    def xla_is_refused_clearly():
        @tf.function(jit_compile=True)
        def compiled(x):
            return sdp.allreduce(x)

        try:
            compiled(tf.ones([2]))
        except RuntimeError as error:
            assert "jit_compile=False" in str(error), error
        else:
            raise AssertionError("allreduce under XLA should raise")

    @check
    def tf_function_hands_over_eagerly_on_the_tensors_device():
        """In a tf.function the collective is one py_function running the eager DLPack path
        on the device the op is placed on (CPU here; a GPU's for GPU gradients)."""
        fn = tf.function(lambda ts: sdp.grouped_allreduce(ts, op=sdp.Sum))
        inputs = [tf.fill([5], float(r + 1)), tf.fill([3, 2], float(r)), tf.constant([r, 1])]
        graph = fn.get_concrete_function(inputs).graph
        kinds = {op.type for op in graph.get_operations()}
        assert "EagerPyFunc" in kinds and not kinds & {"PyFunc", "PyFuncStateless"}, kinds
        collectives.trace = []
        try:
            out = fn(inputs)
        finally:
            seen, collectives.trace = collectives.trace, None
        # int32 apart (py_function has no GPU kernel for it: it would pull the rest to the host)
        assert seen == [[(CPU0, "float32"), (CPU0, "float32")], [(CPU0, "int32")]], seen
        equal(out[0], np.full([5], n * (n + 1) / 2), "float32 on the device")
        equal(out[2], [n * (n - 1) / 2, n], "int32 on the device")
        assert all(t.backing_device == CPU0 for t in out)

    @check
    def dlpack_layout_and_gpu_numbering():
        """What the GPU path relies on, checked where it can be: DLPack's struct layout (the
        device index is rewritten in place) and TF's GPU numbering after set_visible_devices."""
        for tensor in (torch.arange(6.0).reshape(2, 3), tf.reshape(tf.range(6.0), [2, 3])):
            capsule = (
                torch.utils.dlpack.to_dlpack(tensor)
                if isinstance(tensor, torch.Tensor)
                else tf.experimental.dlpack.to_dlpack(tensor)
            )
            data, device_type, device_id, ndim = bridge.dlpack_fields(capsule)
            assert (device_type, device_id, ndim) == (1, 0, 2)  # kDLCPU
            bridge._set_dlpack_device_id(capsule, 0)
            view = torch.from_dlpack(capsule)
            assert view.data_ptr() == data and view.tolist() == [[0, 1, 2], [3, 4, 5]]
        # One visible GPU (the local rank's): TF's GPU:0 is torch's cuda:<ordinal>.
        assert bridge.gpu_ordinals(["/physical_device:GPU:3"], 1) == [3]
        two = ["/physical_device:GPU:0", "/physical_device:GPU:1"]
        assert bridge.gpu_ordinals(two, 2) == [0, 1]
        assert bridge.gpu_ordinals(["/physical_device:GPU:0"], 2) is None  # virtual GPUs
        # This torch has no CUDA: a TF GPU tensor would reach it through host memory.
        assert bridge.torch_gpu_index(0) is (0 if torch.cuda.is_available() else None)

    def grouped_sum(tensors):
        return sdp.grouped_allreduce(tensors, op=sdp.Sum)

    @check
    def grouped_allreduce_mixed_dtypes_none_and_slices():
        def inputs():
            return [
                tf.constant(BASE * (r + 1), tf.float32),
                tf.constant([r + 1, 10 * (r + 1)], tf.int64),
                tf.fill([3, 1], tf.cast(r + 1, tf.float64)),
                tf.constant(BASE[0] * (r + 1), tf.float32),
                tf.zeros([0, 4]),
            ]

        total = n * (n + 1) / 2
        for mode, fn in (("eager", grouped_sum), ("tf.function", tf.function(grouped_sum))):
            out = fn(inputs())
            equal(out[0], BASE * total, f"{mode} f32")
            equal(out[1], [total, 10 * total], f"{mode} i64")
            equal(out[2], np.full([3, 1], total), f"{mode} f64")
            equal(out[3], BASE[0] * total, f"{mode} f32 second")
            assert out[4].shape == (0, 4)
        out = sdp.grouped_allreduce([None, tf.ones([2]), None])
        assert out[0] is None and out[2] is None
        equal(out[1], [1, 1], "with None")

    @tf.function
    def gather_fn(x):
        return sdp.allgather(x)

    @check
    def allgather_uneven_first_dims():
        for dtype in (tf.float32, tf.int64, tf.bfloat16):
            x = tf.fill([r + 1, 2], tf.cast(r, dtype))
            expected = np.concatenate([np.full([k + 1, 2], k) for k in range(n)])
            equal(sdp.allgather(x), expected, f"eager {dtype.name}")
            y = gather_fn(x)
            assert y.shape.as_list() == [expected.shape[0], 2]
            equal(y, expected, f"tf.function {dtype.name}")
        equal(sdp.allgather(tf.constant(float(r))), np.arange(n), "scalar")

    @tf.function
    def broadcast_fn(x, root):
        return sdp.broadcast(x, root_rank=root)

    @check
    def broadcast_from_each_root():
        for root in range(n):
            for dtype in (tf.float32, tf.int32, tf.bool, tf.bfloat16):
                x = tf.cast(tf.fill([2, 2], r % 2 + r), dtype)
                expected = as_np(tf.cast(tf.fill([2, 2], root % 2 + root), dtype))
                equal(sdp.broadcast(x, root), expected, f"eager root {root} {dtype.name}")
                equal(broadcast_fn(x, root), expected, f"tf.function root {root} {dtype.name}")

    @check
    def objects():
        assert sdp.broadcast_object({"rank": r, "list": [r]}, root_rank=n - 1) == {
            "rank": n - 1,
            "list": [n - 1],
        }
        assert sdp.allgather_object(("r", r)) == [("r", k) for k in range(n)]

    def small_model(seed: int) -> keras.Model:
        keras.utils.set_random_seed(seed)
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)]
        )
        return model

    @check
    def broadcast_keras_model_optimizer_and_tf_variables():
        model = small_model(seed=100 + r)
        optimizer = keras.optimizers.Adam(0.01)
        optimizer.build(model.trainable_variables)
        for i, var in enumerate(optimizer.variables):  # make rank-specific optimizer state
            var.assign(tf.cast(tf.fill(var.shape, r + i), var.dtype))
        plain = [tf.Variable(tf.fill([3], float(r))), tf.Variable(r, dtype=tf.int64)]
        everything = list(model.variables) + list(optimizer.variables) + plain
        before = sdp.allgather_object([as_np(v) for v in everything])
        # model.variables twice: duplicates are sent once.
        sdp.broadcast_variables(model.variables, root_rank=0)
        sdp.broadcast_variables(list(optimizer.variables) + plain + model.variables, 0)
        after = [as_np(v) for v in everything]
        for a, b in zip(after, before[0], strict=True):
            assert np.array_equal(a, b), "not rank 0's values"
        assert int(optimizer.iterations.numpy()) == 0

        @tf.function
        def bcast_in_function(variables):
            sdp.broadcast_variables(variables, root_rank=n - 1)

        v = tf.Variable([float(r), 2.0 * r])
        bcast_in_function([v])
        equal(v, [n - 1, 2 * (n - 1)], "broadcast_variables in tf.function")

    def data(rank: int) -> tuple[tf.Tensor, tf.Tensor]:
        rng = np.random.default_rng(7 + rank)
        x = rng.normal(size=(8, 4)).astype(np.float32)
        return tf.constant(x), tf.constant(x.sum(1, keepdims=True) * 0.5)

    @check
    def tape_training_matches_union_batch():
        """Ranks start from different weights; after broadcast and 3 averaged steps they agree,
        and equal a local run on the union of every rank's batches."""
        loss_fn = keras.losses.MeanSquaredError()
        for compiled in (False, True):
            model = small_model(seed=r)
            optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
            optimizer.build(model.trainable_variables)
            sdp.broadcast_variables(model.variables + optimizer.variables, root_rank=0)

            def step(x, y, model=model, optimizer=optimizer):
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                tape = sdp.DistributedGradientTape(tape)
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
                return loss

            step = tf.function(step) if compiled else step
            x, y = data(r)
            for _ in range(3):
                step(x, y)
            weights = [w.numpy() for w in model.weights]
            same_everywhere(weights, f"weights compiled={compiled}")

            reference = small_model(seed=0)
            ref_opt = keras.optimizers.SGD(0.1, momentum=0.9)
            xs, ys = zip(*(data(k) for k in range(n)), strict=True)
            x_all, y_all = tf.concat(xs, 0), tf.concat(ys, 0)
            for _ in range(3):
                with tf.GradientTape() as tape:
                    loss = loss_fn(y_all, reference(x_all, training=True))
                grads = tape.gradient(loss, reference.trainable_variables)
                ref_opt.apply_gradients(zip(grads, reference.trainable_variables, strict=True))
            for a, b in zip(weights, reference.weights, strict=True):
                np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-6)

    @check
    def tape_analytic_none_nested_and_sparse():
        w = tf.Variable([1.0, 2.0, 3.0])
        unused = tf.Variable(5.0)
        table = tf.Variable(tf.zeros([5, 2]))
        # Rank r looks up rows r and r+1 (twice row r): sparse gradient rows from every rank.
        ids = tf.constant([r % 5, r % 5, (r + 1) % 5])
        dense_expected = np.zeros([5, 2])
        for k in range(n):
            for i in (k % 5, k % 5, (k + 1) % 5):
                dense_expected[i] += 1.0 / n

        def grads(sparse_as_dense):
            with tf.GradientTape() as tape:
                loss = (r + 1) * tf.reduce_sum(w * w) + tf.reduce_sum(tf.gather(table, ids))
            tape = sdp.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
            return tape.gradient(loss, {"w": w, "rest": [unused, table]})

        for compiled in (False, True):
            for sparse_as_dense in (False, True):
                fn = tf.function(grads) if compiled else grads
                g = fn(sparse_as_dense)
                what = f"compiled={compiled} sparse_as_dense={sparse_as_dense}"
                # d/dw (r+1) w^2 = 2 (r+1) w, averaged: (n+1) w
                equal(g["w"], (n + 1) * np.array([1.0, 2.0, 3.0]), what)
                assert g["rest"][0] is None, what
                sparse = g["rest"][1]
                assert isinstance(sparse, tf.IndexedSlices) != sparse_as_dense, what
                equal(tf.convert_to_tensor(sparse), dense_expected, what, atol=1e-6)

        with tf.GradientTape() as tape:
            loss = (r + 1) * tf.reduce_sum(w * w)
        summed = sdp.DistributedGradientTape(tape, op=sdp.Sum).gradient(loss, w)
        equal(summed, n * (n + 1) * np.array([1.0, 2.0, 3.0]), "op=Sum, single source")
        with sdp.DistributedGradientTape(tf.GradientTape()) as tape:
            loss = (r + 1) * tf.reduce_sum(w * w)
        assert isinstance(tape, tf.GradientTape)
        equal(tape.gradient(loss, w), (n + 1) * np.array([1.0, 2.0, 3.0]), "wrapped fresh tape")

    @check
    def distributed_optimizer_custom_loop():
        for compiled in (False, True):
            v = tf.Variable([0.0, 0.0])
            opt = sdp.DistributedOptimizer(keras.optimizers.SGD(1.0))
            assert isinstance(opt, keras.optimizers.SGD)

            def apply(v=v, opt=opt):
                opt.apply_gradients([(tf.constant([2.0 * (r + 1), -4.0 * (r + 1)]), v)])

            (tf.function(apply) if compiled else apply)()
            equal(v, [-(n + 1), 2 * (n + 1)], f"keras optimizer compiled={compiled}")

        legacy_v = tf.Variable([0.0])
        legacy = sdp.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
        legacy.minimize(lambda: 2.0 * (r + 1) * legacy_v[0], var_list=[legacy_v])
        equal(legacy_v, [-(n + 1)], "tf.compat.v1 optimizer")

    @check
    def sharded_sequence_reshuffles_alike():
        # A Sequence that reshuffles with the unseeded global generators, which differ per rank:
        # sdp.shard seeds them alike for on_epoch_end, and gives each rank its own state back.
        import random

        class Reshuffled(keras.utils.PyDataset):
            def __init__(self):
                super().__init__()
                self.order = np.arange(12)

            def __len__(self):
                return 6

            def __getitem__(self, i):
                return self.order[2 * i : 2 * i + 2], self.order[2 * i : 2 * i + 2]

            def on_epoch_end(self):
                np.random.shuffle(self.order)
                random.shuffle(self.order)

        np.random.seed(100 + r)
        random.seed(100 + r)
        own = sdp.allgather_object(float(np.random.random()))
        assert len(set(own)) == n, "the ranks' generators should differ here"
        seed = sdp.shared_seed()
        assert sdp.allgather_object(seed) == [seed] * n
        sharded = sdp.shard(Reshuffled())
        mine = []
        for _ in range(2):
            sharded.on_epoch_end()
            mine += [sharded[i][0].tolist() for i in range(len(sharded))]
        every = sdp.allgather_object(mine)
        batches = [b for rank_batches in every for b in rank_batches]
        assert sorted(x for b in batches for x in b) == sorted(list(range(12)) * 2), batches
        after = sdp.allgather_object(float(np.random.random()))
        assert len(set(after)) == n, "the ranks' own generator states were not given back"
        # Keras's ImageDataGenerator iterators (flow_from_directory's class shares this code):
        # seeded with sdp.shared_seed(), they shuffle alike on every epoch.
        from tensorflow.keras.preprocessing.image import ImageDataGenerator

        images = np.arange(24, dtype="float32").reshape(24, 1, 1, 1)
        flow = ImageDataGenerator().flow(
            images, np.arange(24), batch_size=3, seed=sdp.shared_seed()
        )
        sharded, mine = sdp.shard(flow), []
        for _ in range(3):  # every sample in each epoch (the first batch again as padding)
            mine.append([x for i in range(len(sharded)) for x in sharded[i][1].tolist()])
            sharded.on_epoch_end()
        every = sdp.allgather_object(mine)
        for epoch in range(3):
            seen = {x for rank_epochs in every for x in rank_epochs[epoch]}
            assert seen == set(range(24)), (epoch, sorted(seen))

    result = {"rank": r, "size": n, "passed": passed}
    (out_dir / f"rank{r}.json").write_text(json.dumps(result))
    sdp.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
