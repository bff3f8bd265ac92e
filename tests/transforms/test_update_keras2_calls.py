"""update_keras2_calls: Keras 2 spellings that fail on Keras 3."""

from __future__ import annotations

from .helpers import messages, run

ONLY = "update_keras2_calls"
TAPE = """\
import tensorflow as tf

model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(model(x))
grads = tape.gradient(loss, model.trainable_variables)
opt.apply_gradients(zip(grads, model.trainable_variables))
"""


def test_optimizer_variables_called_becomes_the_property():
    result = run(
        TAPE.replace("model = ", "opt = tf.optimizers.Adam(0.001)\nmodel = ")
        + "print(len(opt.variables()))\n",
        ONLY,
    )
    assert "print(len(opt.variables))" in result.output.decode()
    assert messages(result, ONLY) == ["opt.variables() -> opt.variables (a property in Keras 3)"]


def test_through_a_horovod_distributed_optimizer_in_a_migrated_script():
    result = run(
        """\
        import tensorflow as tf
        import horovod.tensorflow.keras as hvd

        hvd.init()
        opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01))
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        model.compile(optimizer=opt, loss="mse")
        model.fit(x, y, epochs=1)
        hvd.broadcast_variables(opt.variables(), root_rank=0)
        """
    )
    assert "hvd.broadcast_variables(opt.variables, root_rank=0)" in result.output.decode()


def test_legacy_and_unknown_optimizers_are_left_alone():
    result = run(
        TAPE.replace(
            "model = ", "opt = tf.keras.optimizers.legacy.Adam(0.001)\nmodel = "
        ) + "print(opt.variables(), other.variables())\n",
        ONLY,
    )
    assert "print(opt.variables(), other.variables())" in result.output.decode()
    assert messages(result, ONLY) == []


def test_keras3_replacements_are_named_in_notes():
    result = run(
        TAPE
        + """\
train_loss = tf.keras.metrics.Mean(name="train_loss")
train_loss.reset_states()
model.compile(optimizer="adam", loss="mse", experimental_run_tf_function=False)
model.fit(x, y, epochs=1)
model.save("export_dir")
model.save("model.keras")
model.save("model.h5", save_format="h5")
checkpoint.save("ckpt/prefix")
""",
        ONLY,
    )
    notes = messages(result, ONLY, manual=True)
    assert "train_loss.reset_state()\n" in result.output.decode()
    assert "train_loss.reset_states() -> train_loss.reset_state() (Keras 3's name)" in messages(
        result, ONLY)
    assert notes == [
        "experimental_run_tf_function= is not an argument of Keras 3's compile(): remove it "
        "(run_eagerly=True runs eagerly)",
        'model.save("export_dir"): Keras 3 saves only .keras and .h5 files; for a SavedModel '
        "directory write model.export(...) (or tf.saved_model.save), else give the path a .keras "
        "extension",
        'model.save("model.h5", save_format="h5"): Keras 3 saves only .keras and .h5 files; for a '
        "SavedModel directory write model.export(...) (or tf.saved_model.save), else give the "
        "path a .keras extension",
    ]


def test_keras2_arguments_keras3_rejects_are_noted_at_the_argument():
    result = run(
        """\
        import tensorflow as tf

        def main():
            model.compile(optimizer=tf.keras.optimizers.Adam(lr=0.001), loss="mse")
            model.fit(x, y, epochs=2, workers=4, use_multiprocessing=True)
            legacy = tf.keras.optimizers.legacy.SGD(lr=0.1)
        """,
    )
    notes = [(c.line, c.message.split(":")[0].split("=")[0]) for c in result.changes
             if c.transform == "update_keras2_calls" and c.manual]
    assert notes == [(4, "tf.keras.optimizers.Adam(lr"), (5, "workers"),
                     (5, "use_multiprocessing")]


MULTI_GPU = """\
import numpy as np
from tensorflow import keras
{imports}

template = keras.Sequential([keras.layers.Dense(4)])
model = multi_gpu_model(template, {gpus}) if n_gpus > 1 else template
model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
model.fit(np.zeros((64, 8)), np.zeros((64, 4)), batch_size=16)
"""


def test_multi_gpu_model_becomes_the_model_and_its_keras_import_goes():
    result = run(MULTI_GPU.format(
        imports="from tensorflow.keras.utils import multi_gpu_model, to_categorical",
        gpus="gpus=n_gpus"), ONLY)
    out = result.output.decode()
    assert "model = template if n_gpus > 1 else template" in out
    assert "from tensorflow.keras.utils import to_categorical\n" in out
    assert "multi_gpu_model" not in out
    assert messages(result, ONLY) == [
        "multi_gpu_model import removed: nothing uses it now, and TensorFlow 2.4+ has no "
        "keras.utils.multi_gpu_model",
        "multi_gpu_model(template, gpus=n_gpus) -> template: under sdp-run each process has one "
        "GPU (multi_gpu_model split each batch over the GPUs of one process)",
    ]


def test_a_projects_own_multi_gpu_model_is_replaced_and_its_import_kept():
    result = run(MULTI_GPU.format(imports="from utils.parallel import multi_gpu_model",
                                  gpus="n_gpus"), ONLY)
    out = result.output.decode()
    assert "model = template if n_gpus > 1 else template" in out
    assert "from utils.parallel import multi_gpu_model\n" in out  # the project's module: kept


def test_a_multi_gpu_model_still_read_elsewhere_keeps_its_import():
    source = MULTI_GPU.format(imports="from keras.utils import multi_gpu_model",
                              gpus="gpus=2") + "print(multi_gpu_model.__doc__)\n"
    out = run(source, ONLY).output.decode()
    assert "from keras.utils import multi_gpu_model\n" in out
    assert "model = template if n_gpus > 1 else template" in out


def test_a_model_built_for_one_gpus_share_of_the_batch_gets_a_note_and_stays():
    # The template was sized for batch_size // n_gpus (a layer that fixes its batch): the whole
    # batch a process gets would not fit it, so the converter does not swap the models.
    source = MULTI_GPU.format(imports="from keras.utils import multi_gpu_model",
                              gpus="gpus=n_gpus").replace(
        "template = keras.Sequential([keras.layers.Dense(4)])",
        "template = build(batch_size=32 // n_gpus)")
    result = run(source, ONLY)
    out = result.output.decode()
    assert "multi_gpu_model(template, gpus=n_gpus) if n_gpus > 1" in out
    assert "from keras.utils import multi_gpu_model\n" in out
    assert [c.manual for c in result.changes if c.transform == ONLY] == [True]
    assert messages(result, ONLY) == [
        "multi_gpu_model(template, gpus=n_gpus): under sdp-run each process sees one GPU, where "
        "this builds a model for n_gpus (it fails); use template itself, built for the batch each "
        "process trains on: 32 // n_gpus sized it for one GPU's share",
    ]
