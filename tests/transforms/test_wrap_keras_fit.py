from __future__ import annotations

import textwrap

from sdp_convert.base import Options
from sdp_convert.engine import convert as engine_convert

from .helpers import TF_ALREADY_CONVERTED, check_noop, check_transformed, messages, reported, run

ONLY = "wrap_keras_fit"
ALREADY_CONVERTED = TF_ALREADY_CONVERTED
HEAD = """\
import tensorflow as tf

model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
"""
CONVERTED_HEAD = """\
import tensorflow as tf
import sdp_runtime.tensorflow as sdp

sdp.init()

model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
"""
CALLBACKS = (
    "[sdp.keras.callbacks.BroadcastGlobalVariablesCallback(0), "
    "sdp.keras.callbacks.MetricAverageCallback()]"
)
VERBOSE = "verbose=1 if sdp.rank() == 0 else 0"
ADDED = (
    "callbacks BroadcastGlobalVariablesCallback(0) (rank 0's initial weights on every worker) "
    "and MetricAverageCallback() (metrics averaged across workers) added first"
)
QUIET = "progress output on rank 0 only (verbose=0 on the other workers)"
WRAPPED = "optimizer wrapped in sdp.keras.DistributedOptimizer: gradients averaged across workers"


def convert(body: str, **options: object):
    """``HEAD`` + ``body``, converted; returns (output body, result)."""
    result = run(HEAD + body, ONLY, **options)
    output = result.output.decode()
    if output.startswith(CONVERTED_HEAD):
        output = output[len(CONVERTED_HEAD) :]
    return output, result


def changes(result):
    return reported(result, ONLY, manual=False)


def notes(result):
    return reported(result, ONLY, manual=True)


def test_compile_and_fit_made_data_parallel():
    result = check_transformed(
        """\
        import tensorflow as tf

        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.Adam(0.001), loss="mse")
        model.fit(dataset, epochs=3, steps_per_epoch=100, validation_data=val, validation_steps=10)
        """,
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        model.compile(optimizer=sdp.keras.DistributedOptimizer(tf.keras.optimizers.Adam(0.001)), loss="mse")
        model.fit(dataset, epochs=3, steps_per_epoch=100 // sdp.size(), validation_data=val, validation_steps=10, """
        + f"callbacks={CALLBACKS}, {VERBOSE})\n",
        only=ONLY,
    )
    assert changes(result) == [
        (5, WRAPPED),
        (6, ADDED),
        (6, QUIET),
        (6, "steps_per_epoch=100 -> // sdp.size(): each worker's shard has its part of the batches"),
    ]


def test_steps_per_epoch_kept_for_data_the_converter_does_not_split():
    # `dataset` comes from nowhere the converter can see: dividing the steps would make every
    # worker train on the first 1/N of the same batches.
    out, result = convert(
        'model.compile(optimizer="sgd", loss="mse")\n'
        "model.fit(dataset, verbose=0, callbacks=[], steps_per_epoch=100)\n"
    )
    assert out.splitlines()[1:] == [
        f"model.fit(dataset, verbose=0, callbacks={CALLBACKS}, steps_per_epoch=100)"
    ]
    assert not [m for _, m in changes(result) if "steps_per_epoch" in m]


def test_every_import_spelling_of_the_optimizer():
    check_transformed(
        """\
        import tensorflow as tf
        import keras
        from tensorflow.keras.optimizers import Adam

        a = keras.Sequential([keras.layers.Dense(1)])
        a.compile(Adam(0.01), "mse")
        a.compile(optimizer=tf.optimizers.SGD(0.1), loss="mse")
        a.compile(optimizer=keras.optimizers.RMSprop(), loss="mse")
        a.fit(dataset, verbose=0, callbacks=[])
        """,
        f"""\
        import tensorflow as tf
        import keras
        from tensorflow.keras.optimizers import Adam
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        a = keras.Sequential([keras.layers.Dense(1)])
        a.compile(sdp.keras.DistributedOptimizer(Adam(0.01)), "mse")
        a.compile(optimizer=sdp.keras.DistributedOptimizer(tf.optimizers.SGD(0.1)), loss="mse")
        a.compile(optimizer=sdp.keras.DistributedOptimizer(keras.optimizers.RMSprop()), loss="mse")
        a.fit(dataset, verbose=0, callbacks={CALLBACKS})
        """,
        only=ONLY,
    )


def test_string_and_default_optimizers_become_objects_with_a_scaled_learning_rate():
    # With scale_keras_learning_rate, which runs first and scales the object's learning rate.
    source = textwrap.dedent(
        """\
        import tensorflow as tf
        from tensorflow import keras

        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
        model = keras.Sequential([keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        model.compile(loss="mse")
        model.fit(dataset, verbose=0, callbacks=[])
        """
    )
    options = Options(
        only=frozenset({"add_runtime_init", "scale_keras_learning_rate", ONLY}),
        recheck=True,
        line_length=10_000,  # the transforms' own lines (helpers.run does the same)
    )
    result = engine_convert(source, options)
    assert result.output.decode() == textwrap.dedent(
        f"""\
        import tensorflow as tf
        from tensorflow import keras
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
        model = keras.Sequential([keras.layers.Dense(1)])
        model.compile(optimizer=sdp.keras.DistributedOptimizer(keras.optimizers.Adam(learning_rate=0.001 * sdp.size())), loss="mse")
        model.compile(optimizer=sdp.keras.DistributedOptimizer(keras.optimizers.RMSprop(learning_rate=0.001 * sdp.size())), loss="mse")
        model.fit(dataset, verbose=0, callbacks={CALLBACKS})
        """
    )
    # On its own (--skip scale_keras_learning_rate), the object keeps Keras' default rate.
    out, result = convert(
        'model.compile(optimizer="adam", loss="mse")\n'
        'model.compile(loss="mse")\n'
        'model.compile(optimizer="novograd", loss="mse")\n'
        "model.fit(dataset, verbose=0, callbacks=[])\n"
    )
    assert out == (
        "model.compile(optimizer=sdp.keras.DistributedOptimizer(tf.keras.optimizers.Adam()), loss=\"mse\")\n"
        "model.compile(optimizer=sdp.keras.DistributedOptimizer(tf.keras.optimizers.RMSprop()), loss=\"mse\")\n"
        'model.compile(optimizer="novograd", loss="mse")\n'
        f"model.fit(dataset, verbose=0, callbacks={CALLBACKS})\n"
    )
    assert changes(result)[:4] == [
        (4, 'optimizer "adam" -> tf.keras.optimizers.Adam()'),
        (4, WRAPPED),
        (5, "Keras' default optimizer made explicit: tf.keras.optimizers.RMSprop()"),
        (5, WRAPPED),
    ]
    assert notes(result) == [
        (6, 'optimizer "novograd": wrap it in sdp.keras.DistributedOptimizer by hand (the '
            "converter does not know this name)")
    ]


def test_callbacks_are_added_first_to_a_list_a_variable_or_a_missing_argument():
    out, result = convert(
        'model.compile(optimizer="sgd", loss="mse")\n'
        "model.fit(dataset, verbose=0)\n"
        "model.fit(dataset, verbose=0, callbacks=[tf.keras.callbacks.EarlyStopping(patience=2)])\n"
        "callbacks = [tf.keras.callbacks.ReduceLROnPlateau()]\n"
        "model.fit(dataset, verbose=0, callbacks=callbacks)\n"
        "model.fit(dataset, verbose=0, callbacks=extra + [stop])\n"
    )
    assert out.splitlines()[1:] == [
        f"model.fit(dataset, verbose=0, callbacks={CALLBACKS})",
        "model.fit(dataset, verbose=0, callbacks=[sdp.keras.callbacks.BroadcastGlobalVariablesCallback(0), "
        "sdp.keras.callbacks.MetricAverageCallback(), tf.keras.callbacks.EarlyStopping(patience=2)])",
        "callbacks = [tf.keras.callbacks.ReduceLROnPlateau()]",
        f"model.fit(dataset, verbose=0, callbacks={CALLBACKS} + callbacks)",
        f"model.fit(dataset, verbose=0, callbacks={CALLBACKS} + (extra + [stop]))",
    ]
    assert [line for line, message in changes(result) if message == ADDED] == [5, 6, 8, 9]


def test_a_list_written_one_callback_a_line_keeps_its_layout():
    out, _ = convert(
        'model.compile(optimizer="sgd", loss="mse")\n'
        "model.fit(\n"
        "    dataset,\n"
        "    callbacks=[  # stop early\n"
        "        tf.keras.callbacks.EarlyStopping(patience=2),  # on val_loss\n"
        "    ],\n"
        ")\n"
    )
    assert out.split("\n", 1)[1] == (
        "model.fit(\n"
        "    dataset,\n"
        "    callbacks=[  # stop early\n"
        "        sdp.keras.callbacks.BroadcastGlobalVariablesCallback(0),\n"
        "        sdp.keras.callbacks.MetricAverageCallback(),\n"
        "        tf.keras.callbacks.EarlyStopping(patience=2),  # on val_loss\n"
        "    ],\n"
        f"    {VERBOSE},\n"
        ")\n"
    )


def test_callbacks_that_write_files_run_on_rank_0_only():
    result = check_transformed(
        """\
        from tensorflow import keras
        from tensorflow.keras.callbacks import EarlyStopping, ModelCheckpoint

        model = keras.Sequential([keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        ckpt = ModelCheckpoint("best.keras", save_best_only=True)
        callbacks = [EarlyStopping(patience=3), ckpt]
        callbacks.append(keras.callbacks.TensorBoard("logs"))
        model.fit(ds, epochs=10, verbose=2, callbacks=callbacks)
        model.fit(
            ds,
            verbose=0,
            callbacks=[
                EarlyStopping(patience=2),
                keras.callbacks.CSVLogger("log.csv"),
            ],
        )
        model.fit(ds, verbose=0, callbacks=[keras.callbacks.BackupAndRestore("backup")])
        """,
        f"""\
        from tensorflow import keras
        from tensorflow.keras.callbacks import EarlyStopping, ModelCheckpoint
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        model = keras.Sequential([keras.layers.Dense(1)])
        model.compile(optimizer=sdp.keras.DistributedOptimizer(keras.optimizers.Adam()), loss="mse")
        ckpt = ModelCheckpoint("best.keras", save_best_only=True)
        callbacks = [EarlyStopping(patience=3)] + ([ckpt] if sdp.rank() == 0 else [])
        if sdp.rank() == 0:
            callbacks.append(keras.callbacks.TensorBoard("logs"))
        model.fit(ds, epochs=10, verbose=2 if sdp.rank() == 0 else 0, callbacks={CALLBACKS} + callbacks)
        model.fit(
            ds,
            verbose=0,
            callbacks=[
                sdp.keras.callbacks.BroadcastGlobalVariablesCallback(0),
                sdp.keras.callbacks.MetricAverageCallback(),
                EarlyStopping(patience=2),
            ] + ([keras.callbacks.CSVLogger("log.csv")] if sdp.rank() == 0 else []),
        )
        model.fit(ds, verbose=0, callbacks={CALLBACKS} + ([keras.callbacks.BackupAndRestore("backup")] if sdp.rank() == 0 else []))
        """,
        only=ONLY,
    )
    assert [c for c in changes(result) if "rank 0 only" in c[1]] == [
        (7, "ckpt on rank 0 only (writes files)"),
        (8, 'keras.callbacks.TensorBoard("logs") added on rank 0 only (it writes files)'),
        (9, QUIET),
        (13, 'keras.callbacks.CSVLogger("log.csv") on rank 0 only (writes files)'),
        (18, 'keras.callbacks.BackupAndRestore("backup") on rank 0 only (writes files)'),
    ]
    assert notes(result) == [
        (18, "BackupAndRestore runs on rank 0 only: to resume, every worker must restore the same "
             "backup (e.g. restore on all, write on rank 0)")
    ]


def test_verbose_keeps_its_value_on_rank_0():
    out, _ = convert(
        'model.compile(optimizer="sgd", loss="mse")\n'
        "model.fit(dataset, callbacks=[])\n"
        "model.fit(dataset, callbacks=[], verbose=2)\n"
        "model.fit(dataset, callbacks=[], verbose=args.verbose + 1)\n"
        "model.fit(dataset, callbacks=[], verbose=0)\n"
    )
    cb = f"callbacks={CALLBACKS}"
    assert out.splitlines()[1:] == [
        f"model.fit(dataset, {cb}, {VERBOSE})",
        f"model.fit(dataset, {cb}, verbose=2 if sdp.rank() == 0 else 0)",
        f"model.fit(dataset, {cb}, verbose=args.verbose + 1 if sdp.rank() == 0 else 0)",
        f"model.fit(dataset, {cb}, verbose=0)",
    ]


def test_steps_per_epoch_is_divided_and_validation_steps_kept():
    out, _ = convert(
        "ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)\n"
        'model.compile(optimizer="sgd", loss="mse")\n'
        "model.fit(ds, verbose=0, callbacks=[], steps_per_epoch=len(x) // BATCH, validation_steps=5)\n"
        "model.fit(ds, verbose=0, callbacks=[], steps_per_epoch=n - 1)\n"
        "model.fit(ds, verbose=0, callbacks=[], steps_per_epoch=None)\n"
    )
    cb = f"callbacks={CALLBACKS}"
    assert out.splitlines()[2:] == [
        f"model.fit(ds, verbose=0, {cb}, steps_per_epoch=len(x) // BATCH // sdp.size(), validation_steps=5)",
        f"model.fit(ds, verbose=0, {cb}, steps_per_epoch=(n - 1) // sdp.size())",
        f"model.fit(ds, verbose=0, {cb}, steps_per_epoch=None)",
    ]


def test_numpy_arrays_given_to_fit_are_strided_and_reported():
    out, result = convert(
        'model.compile(optimizer="sgd", loss="mse")\n'
        "model.fit(x_train, y_train, 32, 3, sample_weight=w, verbose=0, callbacks=[])\n"
        "model.fit(x=features, y=labels, batch_size=32, verbose=0, callbacks=[])\n"
        "model.fit([x_a, x_b], y_train, verbose=0, callbacks=[])\n"
    )
    cb = f"callbacks={CALLBACKS}"
    assert out.splitlines()[1:] == [
        "model.fit(sdp.shard(x_train), sdp.shard(y_train), 32, 3, "
        f"sample_weight=sdp.shard(w), verbose=0, {cb})",
        "model.fit(x=sdp.shard(features), y=sdp.shard(labels), "
        f"batch_size=32, verbose=0, {cb})",
        f"model.fit(sdp.shard([x_a, x_b]), sdp.shard(y_train), verbose=0, {cb})",
    ]
    assert [c for c in changes(result) if "sample" in c[1]] == [
        (5, "x_train, y_train, w: each worker trains on every sdp.size()-th sample from sdp.rank() "
            "on, padded like DistributedSampler so that every worker runs the same number of "
            "steps (batch_size is per worker)"),
        (6, "features, labels: each worker trains on every sdp.size()-th sample from sdp.rank() "
            "on, padded like DistributedSampler so that every worker runs the same number of "
            "steps (batch_size is per worker)"),
        (7, "[x_a, x_b], y_train: each worker trains on every sdp.size()-th sample from "
            "sdp.rank() on, padded like DistributedSampler so that every worker runs the same "
            "number of steps (batch_size is per worker)"),
    ]
    # A list of inputs (a multi-input model) is split row by row, every array alike.
    assert notes(result) == []


def test_a_model_whose_train_step_averages_its_gradients_keeps_its_optimizer():
    result = check_transformed(
        """\
        import tensorflow as tf
        from tensorflow import keras


        class MyModel(keras.Model):
            def train_step(self, data):
                x, y = data
                with tf.GradientTape() as tape:
                    loss = self.compute_loss(y=y, y_pred=self(x, training=True))
                gradients = tape.gradient(loss, self.trainable_variables)
                self.optimizer.apply(gradients, self.trainable_variables)
                return {"loss": loss}


        model = MyModel()
        model.compile(optimizer="adam", loss="mse")
        model.fit(dataset, epochs=2, verbose=0)
        """,
        f"""\
        import tensorflow as tf
        from tensorflow import keras
        import sdp_runtime.tensorflow as sdp

        sdp.init()


        class MyModel(keras.Model):
            def train_step(self, data):
                x, y = data
                with tf.GradientTape() as tape:
                    loss = self.compute_loss(y=y, y_pred=self(x, training=True))
                gradients = tape.gradient(loss, self.trainable_variables)
                self.optimizer.apply(gradients, self.trainable_variables)
                return {{"loss": loss}}


        model = MyModel()
        model.compile(optimizer="adam", loss="mse")
        model.fit(dataset, epochs=2, verbose=0, callbacks={CALLBACKS})
        """,
        only=ONLY,
    )
    assert changes(result)[0] == (
        16, "optimizer not wrapped: MyModel.train_step averages its gradients "
            "(DistributedGradientTape) already"
    )


def test_a_subclassed_model_with_a_string_optimizer_converts_in_one_pass():
    # No Keras name is *called* before the conversion writes keras.optimizers.Adam(...): the
    # fit must be converted in the first pass all the same, or a second pass would change it.
    source = """\
        import keras
        import tensorflow as tf


        class MyModel(keras.Model):
            def train_step(self, data):
                x, y = data
                with tf.GradientTape() as tape:
                    loss = self.compute_loss(y=y, y_pred=self(x, training=True))
                gradients = tape.gradient(loss, self.trainable_variables)
                self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
                return {"loss": loss}


        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
        model = MyModel(inputs, outputs)
        model.compile(optimizer="adam", loss="mse")
        model.fit(ds, epochs=1)
        """
    result = run(source)  # the whole pipeline; convert() checks that a second pass changes nothing
    assert result.output.decode().endswith(
        "model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.001 * sdp.size()), loss=\"mse\")\n"
        f"model.fit(ds, epochs=1, callbacks={CALLBACKS}, {VERBOSE})\n"
    )
    check_noop(result.output.decode())


def test_converting_the_output_again_changes_nothing():
    out, result = convert(
        'model.compile(optimizer="adam", loss="mse")\n'
        'ckpt = tf.keras.callbacks.ModelCheckpoint("m.keras")\n'
        "model.fit(x, y, epochs=2, steps_per_epoch=10, callbacks=[ckpt])\n"
    )
    assert out.splitlines() == [
        'model.compile(optimizer=sdp.keras.DistributedOptimizer(tf.keras.optimizers.Adam()), loss="mse")',
        'ckpt = tf.keras.callbacks.ModelCheckpoint("m.keras")',
        "model.fit(sdp.shard(x), sdp.shard(y), epochs=2, "
        f"steps_per_epoch=10 // sdp.size(), callbacks={CALLBACKS} + ([ckpt] if sdp.rank() == 0 "
        f"else []), {VERBOSE})",
    ]
    check_noop(result.output.decode(), only=ONLY)


def test_unrelated_fit_and_compile_calls_are_left_alone():
    check_noop(
        """\
        import re
        import tensorflow as tf
        from sklearn.preprocessing import StandardScaler
        import sdp_runtime.tensorflow as sdp

        sdp.init()
        scaler = StandardScaler()
        scaler.fit(x_raw)
        pattern = re.compile("a+")
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        model.compile(optimizer=sdp.keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1 * sdp.size())), loss="mse")
        model.fit(ds, callbacks=[sdp.keras.callbacks.BroadcastGlobalVariablesCallback(0)], verbose=0)
        model.fit(
            ds,
            steps_per_epoch=100 // sdp.size(),
            callbacks=[sdp.keras.callbacks.BroadcastGlobalVariablesCallback(0)],
            verbose=2 if sdp.rank() == 0 else 0,
        )
        model.evaluate(x_test, y_test)
        model.predict(x_test)
        """,
        only=ONLY,
    )


def test_a_script_made_data_parallel_by_hand_is_left_alone():
    # fixtures/tensorflow/already_converted, looked at as if it were this converter's output.
    check_noop(ALREADY_CONVERTED.read_text(), only=ONLY)


def test_fit_given_keyword_arguments_as_a_dict_is_left_to_a_person_for_what_it_may_hold():
    # ``fit_kwargs`` may hold callbacks and verbose (here it does): given again as keywords they
    # would fail the call, and a second pass, not seeing them past ``**``, added them again.
    out, result = convert(
        'model.compile(optimizer="adam", loss="mse")\n'
        'fit_kwargs = {"callbacks": [callback], "verbose": 0}\n'
        "model.fit(x, y, epochs=3, **fit_kwargs)\n"
        "model.fit(x, y, **fit_kwargs, callbacks=[], verbose=2, steps_per_epoch=10)\n"
    )
    assert out.splitlines() == [
        'model.compile(optimizer=sdp.keras.DistributedOptimizer(tf.keras.optimizers.Adam()), loss="mse")',
        'fit_kwargs = {"callbacks": [callback], "verbose": 0}',
        "model.fit(sdp.shard(x), sdp.shard(y), epochs=3, **fit_kwargs)",
        "model.fit(sdp.shard(x), sdp.shard(y), **fit_kwargs, "
        f"callbacks={CALLBACKS}, verbose=2 if sdp.rank() == 0 else 0, "
        "steps_per_epoch=10 // sdp.size())",
    ]
    assert notes(result) == [
        (6, "fit(**fit_kwargs): the converter cannot see what it holds: put "
            "sdp.keras.callbacks.BroadcastGlobalVariablesCallback(0) and "
            "sdp.keras.callbacks.MetricAverageCallback() first in its callbacks (callbacks that "
            "write files on rank 0 only); set verbose=0 on the workers other than rank 0; divide "
            "a steps_per_epoch it holds by sdp.size()"),
    ]
    check_noop(result.output.decode(), only=ONLY)


def test_fit_with_arrays_and_no_labels_is_split_too():
    # Autoencoders, VAEs, GANs with their own train_step: fit(x) with x an array (or a tuple or
    # dict of arrays) is no dataset; every worker would train on all of it.
    out, result = convert(
        "import numpy as np\n"
        "(x_train, _), (x_test, _) = tf.keras.datasets.mnist.load_data()\n"
        'digits = np.expand_dims(np.concatenate([x_train, x_test]), -1).astype("float32") / 255\n'
        'model.compile(optimizer="adam")\n'
        "model.fit(digits, epochs=30, batch_size=128, verbose=0, callbacks=[])\n"
        "model.fit(x=(x_train, x_test[:10]), sample_weight=w, verbose=0, callbacks=[])\n"
        "model.fit({'image': x_train / 255.0}, validation_split=0.1, verbose=0, callbacks=[])\n"
    )
    lines = out.splitlines()
    assert "model.fit(sdp.shard(digits), epochs=30, batch_size=128, verbose=0" in lines[-3]
    assert lines[-2].startswith(
        "model.fit(x=sdp.shard((x_train, x_test[:10])), sample_weight=sdp.shard(w),"
    )
    assert lines[-1].startswith("model.fit(sdp.shard({'image': x_train / 255.0}),")
    assert notes(result) == []
    reported = [c for c in changes(result) if "sample" in c[1]]
    assert [line for line, _ in reported] == [8, 9, 10]
    assert reported[-1][1].endswith(
        "validation_split takes its part of each worker's shard (the validation metrics are "
        "averaged across workers)"
    )


def test_fit_with_something_that_is_not_an_array_is_not_split_here():
    out, result = convert(
        'model.compile(optimizer="adam", loss="mse")\n'
        "model.fit(make_batches(), epochs=3, verbose=0, callbacks=[])\n"
        "model.fit(train_ds, epochs=3, verbose=0, callbacks=[])\n"
    )
    assert "sdp.shard" not in out


def test_a_keras_sequence_of_the_script_is_split_by_batches():
    out, result = convert(
        "class Batches(tf.keras.utils.Sequence):\n"
        "    def __len__(self):\n        return 10\n"
        "    def __getitem__(self, i):\n        return xs[i], ys[i]\n"
        'model.compile(optimizer="adam", loss="mse")\n'
        "train = Batches()\n"
        "model.fit(train, epochs=3, verbose=0, callbacks=[])\n"
    )
    assert out.splitlines()[-1].startswith("model.fit(sdp.shard(train), epochs=3,")
    assert (
        11,
        "train: each worker reads every sdp.size()-th batch of the Sequence from sdp.rank() on, "
        "padded so that every worker runs the same number of steps",
    ) in changes(result)


def test_early_stopping_sees_averaged_metrics():
    # MetricAverageCallback runs before the script's callbacks, however the list is built, so
    # EarlyStopping and ReduceLROnPlateau decide on the same (averaged) numbers on every worker.
    out, _ = convert(
        'model.compile(optimizer="adam", loss="mse")\n'
        "stop = [tf.keras.callbacks.EarlyStopping(patience=2)]\n"
        "stop.append(tf.keras.callbacks.ReduceLROnPlateau())\n"
        "model.fit(x, y, callbacks=stop, verbose=0)\n"
        "model.fit(x, y, callbacks=[tf.keras.callbacks.EarlyStopping(patience=2)], verbose=0)\n"
    )
    for line in out.splitlines()[-2:]:
        average = line.index("sdp.keras.callbacks.MetricAverageCallback()")
        stopping = line.index("EarlyStopping") if "EarlyStopping" in line else line.index("stop")
        assert average < stopping


def test_a_checkpoint_every_n_batches_comes_every_n_over_size_batches_of_each_worker():
    result = run(
        """\
        import tensorflow as tf

        def main():
            model.compile(optimizer="sgd", loss="mse")
            every = tf.keras.callbacks.ModelCheckpoint("c.weights.h5", save_freq=200)
            epochly = tf.keras.callbacks.ModelCheckpoint("e.weights.h5", save_freq="epoch")
            model.fit(x, y, callbacks=[every, epochly])
        """,
        "wrap_keras_fit",
    )
    out = result.output.decode()
    assert 'ModelCheckpoint("c.weights.h5", save_freq=max(1, 200 // sdp.size()))' in out
    assert 'ModelCheckpoint("e.weights.h5", save_freq="epoch")' in out
    assert "save_freq=200 -> max(1, 200 // sdp.size()): each worker runs its part of the " \
        "batches" in messages(result, "wrap_keras_fit")


CUSTOM_MODEL = """\
import tensorflow as tf
from tensorflow import keras

class CustomModel(keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compiled_loss(y, self(x, training=True))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}
"""


def test_a_plain_sequential_beside_a_custom_train_step_class_gets_no_train_step_note():
    result = run(
        CUSTOM_MODEL + """
def main():
    plain = keras.models.Sequential()
    plain.add(keras.layers.Dense(1))
    plain.compile(optimizer="adam", loss="mse")
    plain.fit(x, y)
    inputs = keras.Input(shape=(4,))
    functional = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    functional.compile(optimizer="adam", loss="mse")
    functional.fit(x, y)
""",
    )
    assert not [m for m in messages(result, "wrap_keras_fit") if "train_step" in m]
    assert messages(result, "wrap_keras_fit").count(
        "optimizer wrapped in sdp.keras.DistributedOptimizer: gradients averaged across workers"
    ) == 2


CUSTOM_STEP = CUSTOM_MODEL + """
class TicketModel(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, inputs):
        return self.dense(inputs)

class WiderTicketModel(TicketModel):
    pass

def get_model():
    inputs = keras.Input(shape=(4,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    return model

def get_either(custom):
    inputs = keras.Input(shape=(4,))
    if custom:
        return CustomModel(inputs, keras.layers.Dense(1)(inputs))
    return get_model()
"""


def test_models_of_factories_and_subclasses_without_train_step_are_plain_ones():
    # get_model() returns a functional keras.Model, TicketModel and its subclass define no
    # train_step: Keras' own train_step trains them, so their optimizers are wrapped with no
    # note; get_either() may return a CustomModel: there the note stays (wrapped, as before).
    compiles = "".join(
        f'model = {made}\nmodel.compile(optimizer="adam", loss="mse")\nmodel.fit(x, y)\n'
        for made in ("get_model()", "TicketModel()", "WiderTicketModel()", "get_either(flag)")
    )
    result = run(CUSTOM_STEP + compiles, ONLY)
    said = messages(result, ONLY)
    assert said.count(WRAPPED) == 4
    noted = [(line, m) for line, m in notes(result) if "train_step" in m]
    assert [line for line, _ in noted] == [CUSTOM_STEP.count("\n") + 11], noted
    assert "CustomModel.train_step averages its gradients already: if this model is one" in (
        noted[0][1])


SEQUENCE = """\
import numpy as np
from tensorflow import keras

class Batches(keras.utils.Sequence):
    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y
        self.indices = np.arange(len(x))
{init}
    def __len__(self):
        return len(self.x) // 8

    def __getitem__(self, i):
        return self.x[self.indices[8 * i : 8 * i + 8]], self.y[self.indices[8 * i : 8 * i + 8]]

    def on_epoch_end(self):
        np.random.shuffle(self.indices)

model = keras.Sequential([keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
model.fit(Batches(x, y), epochs=3)
"""


def test_a_sequence_reshuffled_at_each_epoch_end_is_sharded_without_a_note():
    # sdp.shard calls on_epoch_end with numpy's generator seeded alike on every worker.
    result = run(SEQUENCE.format(init=""), recheck=False)
    out = result.output.decode()
    assert "model.fit(sdp.shard(Batches(x, y))" in out
    assert "SGD(0.1 * sdp.size())" in out
    assert not messages(result, manual=True)


def test_a_sequence_shuffled_when_made_keeps_its_note():
    for init in ("        np.random.shuffle(self.indices)\n", "        self.on_epoch_end()\n"):
        result = run(SEQUENCE.format(init=init), recheck=False)
        assert [m.split(",")[0] for m in messages(result, manual=True)] == [
            "Batches reorders its batches without a seed"
        ], init
