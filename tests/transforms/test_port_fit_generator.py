from __future__ import annotations

from .helpers import check_noop, check_transformed, messages

ONLY = "port_fit_generator"
HEAD = """\
import tensorflow as tf
from tensorflow.keras.preprocessing.image import ImageDataGenerator

model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
datagen = ImageDataGenerator(horizontal_flip=True)
"""
CONVERTED_HEAD = HEAD.replace(
    "ImageDataGenerator\n\n",
    "ImageDataGenerator\nimport sdp_runtime.tensorflow as sdp\n\nsdp.init()\n\n",
)


def test_positional_arguments_become_fits_keywords_and_worker_options_go():
    result = check_transformed(
        HEAD + "model.fit_generator(gen, 100, 5, 2, workers=4, use_multiprocessing=True)\n",
        CONVERTED_HEAD
        + "model.fit(gen, steps_per_epoch=100, epochs=5, verbose=2)\n",
        only=ONLY,
    )
    assert messages(result, ONLY) == [
        "fit_generator(...) -> fit(...): Keras 3 removed fit_generator, and fit takes generators; "
        "workers=4, use_multiprocessing=True dropped (Keras 3's fit takes none of them)"
    ]


def test_the_generator_keyword_becomes_x():
    check_transformed(
        HEAD + "model.fit_generator(generator=gen, epochs=3)\n",
        CONVERTED_HEAD
        + "model.fit(x=gen, epochs=3)\n",
        only=ONLY,
    )


def test_the_arrays_an_image_data_generator_flows_are_sharded_for_fit_and_fit_generator():
    for method in ("fit", "fit_generator"):
        result = check_transformed(
            HEAD + f"flow = datagen.flow(x_train, y_train, 32)\nmodel.{method}(flow, epochs=3)\n",
            CONVERTED_HEAD
            + "flow = datagen.flow(sdp.shard(x_train), sdp.shard(y_train), 32)\n"
            "model.fit(flow, epochs=3)\n",
            only=ONLY,
        )
        assert any("each worker augments and trains" in m for m in messages(result, ONLY))


def test_a_flow_it_cannot_read_is_reported_and_left_alone():
    result = check_noop(
        HEAD.replace("import tensorflow as tf\n", "import tensorflow as tf\nimport sdp_runtime.tensorflow as sdp\nsdp.init()\n")
        + "model.fit(datagen.flow([x_a, x_b], y_train), epochs=3)\n",
        only=ONLY,
    )
    (note,) = [c for c in result.changes if c.transform == ONLY]
    assert note.manual and "not sharded" in note.message


def test_a_converted_flow_is_left_alone():
    check_noop(
        HEAD.replace("import tensorflow as tf\n", "import tensorflow as tf\nimport sdp_runtime.tensorflow as sdp\nsdp.init()\n")
        + "model.fit(datagen.flow(sdp.shard(x_train), sdp.shard(y_train)), epochs=3)\n",
        only=ONLY,
    )


# -- ImageDataGenerator iterators of files: sharded at the fit, seeded alike (whole pipeline) ----

FILES = """\
import tensorflow as tf
from tensorflow.keras.preprocessing.image import ImageDataGenerator

def make():
    m = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    m.compile(optimizer=tf.keras.optimizers.Adam(0.001), loss="mse")
    return m

plain = ImageDataGenerator(rescale=1 / 255.0)
flips = ImageDataGenerator(rescale=1 / 255.0, horizontal_flip=True)
{first}
{second}
first_model = make()
first_model.fit(first, validation_data=plain.flow_from_directory("val"), epochs=2)
second_model = make()
second_model.fit(second, epochs=2)
"""


def _whole(first: str, second: str):
    from .helpers import run

    return run(FILES.format(first=first, second=second), recheck=False)


def test_two_fits_on_file_iterators_each_sharded_and_ordered_alike():
    result = _whole(
        'first = plain.flow_from_dataframe(frame, "images", batch_size=8)',
        'second = flips.flow_from_directory("train", batch_size=8, seed=2020)',
    )
    out = result.output.decode()
    # The unseeded one gets rank 0's seed; the seeded one is the same on every worker already.
    assert 'first = plain.flow_from_dataframe(frame, "images", batch_size=8, ' \
        "seed=sdp.shared_seed())" in out
    assert 'second = flips.flow_from_directory("train", batch_size=8, seed=2020)\n' in out
    assert "first_model.fit(sdp.shard(first), " in out
    assert "second_model.fit(sdp.shard(second), " in out
    # Validation data stays whole, unseeded.
    assert 'validation_data=plain.flow_from_directory("val")' in out
    assert "Adam(0.001 * sdp.size())" in out
    assert not messages(result, manual=True)


def test_an_iterator_whose_shuffle_and_seed_are_positional_is_left_whole_with_a_note():
    result = _whole(
        'first = plain.flow_from_directory("train", (32, 32), "rgb", None, "binary", 8, True)',
        'second = flips.flow_from_directory("train", shuffle=False)',
    )
    out = result.output.decode()
    assert "shared_seed" not in out
    assert "first_model.fit(first, " in out
    assert "second_model.fit(sdp.shard(second), " in out  # unshuffled: the same order anywhere
    (note,) = messages(result, "shard_tf_dataset", manual=True)
    assert note.startswith("training data not sharded (built by ImageDataGenerator())")
    # One compile for both fits: its rate is left as it is, with a note.
    assert "Adam(0.001)" in out
