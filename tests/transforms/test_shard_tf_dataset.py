from __future__ import annotations

import textwrap

from .helpers import TF_ALREADY_CONVERTED, check_noop, check_transformed, reported, run

ONLY = "shard_tf_dataset"
ALREADY_CONVERTED = TF_ALREADY_CONVERTED
CONVERTED_HEAD = """\
import tensorflow as tf
import sdp_runtime.tensorflow as sdp

sdp.init()
"""


def loop(dataset: str, indent: str = "") -> str:
    """A training loop over ``dataset`` that applies the gradients of a tape."""
    body = f"""\
for x, y in {dataset}:
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
"""
    return textwrap.indent(body, indent)


def convert(body: str, **options: object):
    """``import tensorflow as tf`` + ``body``, converted; returns (output body, result)."""
    result = run("import tensorflow as tf\n" + body, ONLY, **options)
    output = result.output.decode()
    if output.startswith(CONVERTED_HEAD):
        output = output[len(CONVERTED_HEAD) :]
    return output, result


def sharded(result):
    return reported(result, ONLY, manual=False)


def notes(result):
    return reported(result, ONLY, manual=True)


def shard_message(source: str) -> str:
    return (
        f"training data from {source}: .apply(sdp.shard) before shuffle/batch, "
        "each worker reads its own part (the same number of elements on every worker, padded "
        "like DistributedSampler)"
    )


def test_chained_pipeline_is_sharded_after_its_source_and_take_counts_steps_per_worker():
    result = check_transformed(
        """\
        import tensorflow as tf

        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1000).batch(32)
        val = tf.data.Dataset.from_tensor_slices((vx, vy)).batch(32)
        for step, (xb, yb) in enumerate(ds.take(500)):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        for xb, yb in val.take(10):
            model(xb)
        """,
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        ds = tf.data.Dataset.from_tensor_slices((x, y)).apply(sdp.shard).shuffle(1000).batch(32)
        val = tf.data.Dataset.from_tensor_slices((vx, vy)).batch(32)
        for step, (xb, yb) in enumerate(ds.take(500 // sdp.size())):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        for xb, yb in val.take(10):
            model(xb)
        """,
        only=ONLY,
    )
    assert sharded(result) == [
        (3, shard_message("tf.data.Dataset.from_tensor_slices")),
        (5, "take(500) -> take(500 // sdp.size()): each worker does its part of the steps"),
    ]
    assert notes(result) == []


def test_step_by_step_pipeline_from_tfrecords():
    out, result = convert(
        'files = tf.data.Dataset.list_files("data/*.tfrecord", shuffle=False)\n'
        "ds = tf.data.TFRecordDataset(files)\n"
        "ds = ds.map(parse)\n"
        "ds = ds.shuffle(1000)\n"
        "ds = ds.batch(32).repeat()\n" + loop("ds.take(STEPS)")
    )
    assert out == (
        'files = tf.data.Dataset.list_files("data/*.tfrecord", shuffle=False)\n'
        "ds = tf.data.TFRecordDataset(files).apply(sdp.shard)\n"
        "ds = ds.map(parse)\n"
        "ds = ds.shuffle(1000)\n"
        "ds = ds.batch(32).repeat()\n" + loop("ds.take(STEPS // sdp.size())")
    )
    assert sharded(result)[0] == (3, shard_message("tf.data.TFRecordDataset"))


def test_every_import_spelling_of_the_sources():
    check_transformed(
        textwrap.dedent("""\
        import tensorflow as tf
        from tensorflow.data import Dataset
        from tensorflow import data as tfdata

        a = Dataset.from_tensor_slices(xs).batch(8)
        b = tfdata.Dataset.range(1000).map(f).batch(8)
        """)
        + loop("a")
        + loop("b"),
        textwrap.dedent("""\
        import tensorflow as tf
        from tensorflow.data import Dataset
        from tensorflow import data as tfdata
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        a = Dataset.from_tensor_slices(xs).apply(sdp.shard).batch(8)
        b = tfdata.Dataset.range(1000).apply(sdp.shard).map(f).batch(8)
        """)
        + loop("a")
        + loop("b"),
        only=ONLY,
    )


def test_file_names_from_list_files_shuffled_differently_per_worker_are_not_sharded():
    # Each worker's list_files order differs: every-other-file shards would overlap (and a
    # scaled learning rate would then be wrong), so the data is reported, not sharded.
    source = (
        'files = tf.data.Dataset.list_files("data/*.tfrecord")\n'
        "ds = files.interleave(tf.data.TFRecordDataset).map(parse).batch(32)\n" + loop("ds")
    )
    out, result = convert(source)
    assert out == source
    assert sharded(result) == []
    assert notes(result) == [
        (2, "training data not sharded: list_files shuffles the file names differently on each "
            "worker, so the shards would overlap: pass shuffle=False (or the same seed on every "
            "worker), then .apply(sdp.shard)")
    ]


def test_file_names_from_list_files_in_a_fixed_order_are_sharded():
    out, result = convert(
        'files = tf.data.Dataset.list_files("data/*.tfrecord", shuffle=False)\n'
        "ds = files.interleave(tf.data.TFRecordDataset).map(parse).batch(32)\n" + loop("ds")
    )
    assert out.startswith(
        'files = tf.data.Dataset.list_files("data/*.tfrecord", shuffle=False).apply(sdp.shard)\n'
    )
    assert sharded(result) == [(2, shard_message("tf.data.Dataset.list_files"))]
    assert notes(result) == []


def test_tensorflow_datasets_load():
    check_transformed(
        textwrap.dedent("""\
        import tensorflow as tf
        import tensorflow_datasets as tfds

        train = tfds.load("mnist", split="train", as_supervised=True)
        train = train.map(scale).cache().shuffle(10000).batch(128)
        """)
        + loop("train"),
        textwrap.dedent("""\
        import tensorflow as tf
        import tensorflow_datasets as tfds
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        train = tfds.load("mnist", split="train", as_supervised=True).apply(sdp.shard)
        train = train.map(scale).cache().shuffle(10000).batch(128)
        """)
        + loop("train"),
        only=ONLY,
    )


TFDS_SHUFFLED = textwrap.dedent("""\
    import tensorflow_datasets as tfds

    (train, test), info = tfds.load(
        "mnist", split=["train", "test"], with_info=True, shuffle_files=True{config}
    )
    train = train.shuffle(100).batch(32)
    """) + loop("train")


def test_tfds_shuffled_files_are_not_sharded():
    # Each worker reads the files in its own order: the shards would overlap (issue 30).
    out, result = convert(TFDS_SHUFFLED.format(config=""))
    assert "sdp.shard" not in out
    assert sharded(result) == []
    assert notes(result) == [
        (4, "training data not sharded: tfds.load(shuffle_files=True) reads the files in a "
            "different order on each worker, so the shards would overlap: pass "
            "shuffle_files=False or read_config=tfds.ReadConfig(shuffle_seed=<the same on every "
            "worker>), then .apply(sdp.shard)")
    ]


def test_tfds_shuffled_files_with_a_seed_are_sharded():
    config = ",\n        read_config=tfds.ReadConfig(shuffle_seed=42)"
    out, result = convert(TFDS_SHUFFLED.format(config=config))
    assert "train = train.apply(sdp.shard).shuffle(100).batch(32)" in out
    assert sharded(result) == [(8, shard_message("tfds.load"))]
    assert notes(result) == []


def test_from_tensors_is_sharded_once_it_holds_several_elements():
    out, result = convert(
        "rows = tf.data.Dataset.from_tensors((x, y)).unbatch().map(f).shuffle(100).batch(8)\n"
        + loop("rows")
        + "synthetic = tf.data.Dataset.from_tensors((images, labels)).repeat()\n"
        + loop("synthetic.take(100)")
        + "few = tf.data.Dataset.from_tensors(x).repeat(3).take(2).batch(1)\n"
        + loop("few")
    )
    assert out == (
        "rows = tf.data.Dataset.from_tensors((x, y)).unbatch().apply(sdp.shard).map(f).shuffle(100).batch(8)\n"
        + loop("rows")
        + "synthetic = tf.data.Dataset.from_tensors((images, labels)).repeat().apply(sdp.shard)\n"
        + loop("synthetic.take(100 // sdp.size())")
        + "few = tf.data.Dataset.from_tensors(x).repeat(3).apply(sdp.shard).take(2 // sdp.size()).batch(1)\n"
        + loop("few")
    )
    assert notes(result) == []


def test_from_tensors_alone_is_one_element_and_needs_a_person():
    # Sharded as it is, worker 0 would get the only element and the others none (and hang).
    out, result = convert("full = tf.data.Dataset.from_tensors((x, y)).batch(1)\n" + loop("full"))
    assert out == "full = tf.data.Dataset.from_tensors((x, y)).batch(1)\n" + loop("full")
    assert notes(result) == [
        (2, "training data from tf.data.Dataset.from_tensors not sharded: it is one element (the "
            "whole tensors), which only one worker's shard would hold; use from_tensor_slices (or "
            ".unbatch()) and .apply(sdp.shard) before shuffle/batch")
    ]


def test_a_selection_before_shuffle_stays_in_front_of_the_shard():
    out, result = convert(
        "def make_dataset(batch):\n"
        "    return tf.data.Dataset.from_tensor_slices((xs, ys)).skip(100).take(1000).shuffle(1000).batch(batch)\n"
        "\n\n"
        "for epoch in range(3):\n" + loop("make_dataset(32).take(10)", indent="    ")
    )
    assert out == (
        "def make_dataset(batch):\n"
        "    return tf.data.Dataset.from_tensor_slices((xs, ys)).skip(100).take(1000).apply(sdp.shard).shuffle(1000).batch(batch)\n"
        "\n\n"
        "for epoch in range(3):\n" + loop("make_dataset(32).take(10 // sdp.size())", indent="    ")
    )
    assert sharded(result)[1] == (
        7, "take(10) -> take(10 // sdp.size()): each worker does its part of the steps"
    )


def test_a_dataset_read_with_iter_and_next():
    out, _ = convert(
        "ds = tf.data.Dataset.from_tensor_slices((xs, ys)).repeat().batch(32)\n"
        "it = iter(ds)\n"
        "for step in range(STEPS):\n"
        "    x, y = next(it)\n"
        "    with tf.GradientTape() as tape:\n"
        "        loss = loss_fn(y, model(x))\n"
        "    grads = tape.gradient(loss, model.trainable_variables)\n"
        "    opt.apply_gradients(zip(grads, model.trainable_variables))\n"
    )
    assert out.startswith(
        "ds = tf.data.Dataset.from_tensor_slices((xs, ys)).apply(sdp.shard).repeat().batch(32)\n"
        "it = iter(ds)\n"
    )


def next_loop(header: str, iterator: str = "it", indent: str = "", after: str = "") -> str:
    """A training loop ``header`` that pulls its batches with ``next(iterator)``."""
    body = f"""\
{header}
    x, y = next({iterator})
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
{after}"""
    return textwrap.indent(body, indent)


def step_message(before: str, after: str, iterator: str = "it") -> str:
    return f"{before} -> {after}: each worker does its part of the steps (next({iterator}) would run out of its shard)"


def test_a_loop_counting_its_steps_over_next_does_its_part_of_them():
    # Each worker's shard holds 1/N of the batches: STEPS next() calls would raise StopIteration.
    result = check_transformed(
        """\
        import tensorflow as tf

        STEPS = 1000
        train_ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1000).batch(32)
        it = iter(train_ds)
        for step in range(STEPS):
            x, y = next(it)
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        """,
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        STEPS = 1000
        train_ds = tf.data.Dataset.from_tensor_slices((x, y)).apply(sdp.shard).shuffle(1000).batch(32)
        it = iter(train_ds)
        for step in range(STEPS // sdp.size()):
            x, y = next(it)
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        """,
        only=ONLY,
    )
    assert sharded(result) == [
        (4, shard_message("tf.data.Dataset.from_tensor_slices")),
        (6, step_message("range(STEPS)", "range(STEPS // sdp.size())")),
    ]
    assert notes(result) == []
    check_noop(result.output.decode(), only=ONLY)


def test_a_while_loop_counting_its_steps_over_next_does_its_part_of_them():
    result = check_transformed(
        textwrap.dedent("""\
        import tensorflow as tf

        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
        batches = iter(ds)
        step = 0
        """)
        + next_loop("while step < args.steps:", "batches", after="    step += 1\n"),
        textwrap.dedent("""\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        ds = tf.data.Dataset.from_tensor_slices((x, y)).apply(sdp.shard).batch(32)
        batches = iter(ds)
        step = 0
        """)
        + next_loop("while step < args.steps // sdp.size():", "batches", after="    step += 1\n"),
        only=ONLY,
    )
    assert sharded(result)[1] == (
        6, step_message("step < args.steps", "step < args.steps // sdp.size()", "batches")
    )
    check_noop(result.output.decode(), only=ONLY)


def test_step_counts_in_every_usual_spelling_are_divided():
    result = run(
        "import tensorflow as tf\nfrom tqdm import tqdm\n\n"
        "ds = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(BATCH).repeat(EPOCHS)\n"
        "it = iter(ds)\n"
        + next_loop("for step in tqdm(range(0, len(xs) // BATCH * EPOCHS - 1)):")
        + "\n\ndef train(dataset, steps):\n"
        "    for epoch in range(3):\n"
        "        batches = iter(dataset)\n"
        + next_loop("for step in range(steps):", "batches", indent="        ")
        + "\n\ntrain(tf.data.Dataset.range(100).map(f).batch(8), 10)\n"
        + "n = 0\n"
        + "items = iter(tf.data.Dataset.range(100).batch(8).repeat().take(STEPS))\n"
        + next_loop("while STEPS > n:", "items", after="    n = n + 1\n"),
        ONLY,
    )
    assert result.output.decode() == (
        "import tensorflow as tf\nfrom tqdm import tqdm\nimport sdp_runtime.tensorflow as sdp\n\n"
        "sdp.init()\n\n"
        "ds = tf.data.Dataset.from_tensor_slices((xs, ys)).apply(sdp.shard).batch(BATCH).repeat(EPOCHS)\n"
        "it = iter(ds)\n"
        + next_loop("for step in tqdm(range(0, (len(xs) // BATCH * EPOCHS - 1) // sdp.size())):")
        + "\n\ndef train(dataset, steps):\n"
        "    for epoch in range(3):\n"
        "        batches = iter(dataset)\n"
        + next_loop("for step in range(steps // sdp.size()):", "batches", indent="        ")
        + "\n\ntrain(tf.data.Dataset.range(100).apply(sdp.shard).map(f).batch(8), 10)\n"
        + "n = 0\n"
        # A take() after repeat() ends the data again: both counts are divided, and agree.
        + "items = iter(tf.data.Dataset.range(100).apply(sdp.shard).batch(8).repeat().take(STEPS // sdp.size()))\n"
        + next_loop("while STEPS // sdp.size() > n:", "items", after="    n = n + 1\n")
    )
    assert [message for _, message in sharded(result) if "run out" in message] == [
        step_message(
            "range(0, len(xs) // BATCH * EPOCHS - 1)",
            "range(0, (len(xs) // BATCH * EPOCHS - 1) // sdp.size())",
        ),
        step_message("range(steps)", "range(steps // sdp.size())", "batches"),
        step_message("STEPS > n", "STEPS // sdp.size() > n", "items"),
    ]
    assert notes(result) == []
    check_noop(result.output.decode(), only=ONLY)


def test_step_counts_that_cannot_run_out_are_left_alone():
    source = "ds = tf.data.Dataset.from_tensor_slices((xs, ys))"
    shard = ".apply(sdp.shard)"
    cases = [
        # Repeated forever: every worker has as many batches as it asks for.
        (".batch(32).repeat()\nit = iter(ds)\n", next_loop("for step in range(STEPS):")),
        (".repeat(count=None).batch(32)\nit = iter(ds)\n", next_loop("for step in range(STEPS):")),
        # Counted from the sharded dataset itself: per worker already.
        (".batch(32)\nit = iter(ds)\n", next_loop("for step in range(len(ds)):")),
        (".batch(32)\nsteps = int(ds.cardinality())\nit = iter(ds)\n",
         next_loop("for step in range(steps):")),
        (".batch(32)\nit = iter(ds)\nper_epoch = len(ds)\n",
         next_loop("for step in range(per_epoch * 2 // 2):")),
        # A new iterator on every step (the first batch each time).
        (".shuffle(100).batch(32)\n", next_loop("for step in range(STEPS):", "iter(ds)")),
        (".batch(32)\n", next_loop("for step in range(STEPS):\n    it = iter(ds)")),
        # The script handles the end of the data itself (or gives next() a default).
        (".batch(32)\nit = iter(ds)\n",
         "for step in range(STEPS):\n"
         "    try:\n"
         "        x, y = next(it)\n"
         "    except StopIteration:\n"
         "        it = iter(ds)\n"
         "        x, y = next(it)\n" + next_loop("").split("\n", 2)[2]),
        (".batch(32)\nit = iter(ds)\n",
         next_loop("for step in range(STEPS):").replace("next(it)", "next(it, (x0, y0))")),
    ]
    for pipeline, training in cases:
        out, result = convert(source + pipeline + training)
        assert out == source + shard + pipeline + training, training
        assert sharded(result) == [(2, shard_message("tf.data.Dataset.from_tensor_slices"))]
        assert notes(result) == [], training


def test_step_counts_the_converter_cannot_divide_need_a_person():
    def note(header: str, steps: str = "", maybe: str = "") -> str:
        return (
            f"`{header}` counts its own steps over next(it), and each worker's shard of the training "
            f"data holds 1/sdp.size() of the batches: {maybe}run 1/sdp.size() of the steps{steps} or "
            f".repeat() the dataset, or it stops with StopIteration"
        )

    head = "ds = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(32)\nit = iter(ds)\n"
    cases = [
        # Resumed from a checkpoint: which part of the steps is this worker's?
        (head + next_loop("for step in range(start, STEPS):"),
         (4, note("for step in range(start, STEPS)", " (STEPS // sdp.size())"))),
        # A count of the script's own making may count the (sharded) dataset already.
        (head + next_loop("for step in range(steps_from(args)):"),
         (4, note("for step in range(steps_from(args))", " (steps_from(args) // sdp.size())"))),
        (head + "step = 0\n"
         + next_loop("while True:", after="    step += 1\n    if step == STEPS:\n        break\n"),
         (5, note("while True"))),
        (head + next_loop("for x_val, y_val in val_ds:"), (4, note("for x_val, y_val in val_ds"))),
        # A generator may never end.
        ("ds = tf.data.Dataset.from_generator(gen, output_signature=sig).batch(32)\nit = iter(ds)\n"
         + next_loop("for step in range(STEPS):"),
         (4, note("for step in range(STEPS)", " (STEPS // sdp.size())", "if the generator ends, "))),
    ]
    for body, expected in cases:
        out, result = convert(body)
        assert out == body.replace(".batch(32)", ".apply(sdp.shard).batch(32)"), body
        assert notes(result) == [expected], body


def test_the_dataset_given_to_keras_fit_is_sharded_not_the_validation_data():
    check_transformed(
        """\
        import tensorflow as tf

        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(100).batch(32)
        val = tf.data.Dataset.from_tensor_slices((vx, vy)).batch(32)
        model.fit(train, validation_data=val, epochs=2)
        """,
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        train = tf.data.Dataset.from_tensor_slices((x, y)).apply(sdp.shard).shuffle(100).batch(32)
        val = tf.data.Dataset.from_tensor_slices((vx, vy)).batch(32)
        model.fit(train, validation_data=val, epochs=2)
        """,
        only=ONLY,
    )


def test_sources_that_shuffle_and_batch_by_themselves_need_a_person():
    out, result = convert(
        'ds = tf.keras.utils.image_dataset_from_directory("images/", batch_size=32)\n' + loop("ds")
    )
    assert "shard" not in out
    assert notes(result) == [
        (2, "training data from tf.keras.utils.image_dataset_from_directory not sharded: "
            "tf.keras.utils.image_dataset_from_directory shuffles and batches by itself; build it "
            "so that every worker sees the same order, then .apply(sdp.shard)")
    ]


def test_data_the_converter_cannot_follow_needs_a_person():
    out, result = convert(loop("load_data()"))
    assert out == loop("load_data()")
    assert notes(result) == [
        (2, "training data not sharded (built by load_data()): give each worker its own part: "
            ".apply(sdp.shard) right after the source if it is a tf.data pipeline, "
            "sdp.shard(...) if it is arrays")
    ]


def test_an_already_sharded_pipeline_is_not_sharded_twice():
    check_noop(
        textwrap.dedent("""\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()
        ds = tf.data.Dataset.range(100).shard(sdp.size(), sdp.rank()).batch(8)
        """)
        + loop("ds.take(10 // sdp.size())"),
        only=ONLY,
    )
    # Sharded by hand for a fixed number of workers: a person decides.
    source = textwrap.dedent("""\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()
        ds = tf.data.Dataset.from_tensor_slices(x).shard(2, 0).batch(8)
        """) + loop("ds.take(10)")
    result = check_noop(source, only=ONLY)
    assert notes(result) == [
        (5, "the training data is sharded already: make it .apply(sdp.shard)")
    ]


def test_converting_the_output_again_changes_nothing():
    out, result = convert(
        "ds = tf.data.Dataset.from_tensor_slices((x, y))\n"
        "ds = ds.take(1000).shuffle(100).batch(32)\n" + loop("enumerate(ds.take(STEPS))")
    )
    assert out == (
        "ds = tf.data.Dataset.from_tensor_slices((x, y))\n"
        "ds = ds.take(1000).apply(sdp.shard).shuffle(100).batch(32)\n"
        + loop("enumerate(ds.take(STEPS // sdp.size()))")
    )
    check_noop(result.output.decode(), only=ONLY)


def test_datasets_that_do_not_feed_training_are_left_alone():
    check_noop(
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(sdp.size(), sdp.rank()).batch(32)
        test = tf.data.Dataset.from_tensor_slices((tx, ty)).batch(32)
        for x, y in ds:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        for x, y in test.take(5):
            print(model(x))
        preview = list(tf.data.Dataset.range(10).take(3))
        """,
        only=ONLY,
    )


def test_a_script_made_data_parallel_by_hand_is_left_alone():
    # fixtures/tensorflow/already_converted, looked at as if it were this converter's output.
    check_noop(ALREADY_CONVERTED.read_text(), only=ONLY)


# -- issue 22: the right data, at the right place, once ----------------------------------------


def test_each_input_of_a_zip_is_sharded_at_its_source_and_the_zip_is_not():
    out, result = convert(
        "ds_a = tf.data.Dataset.from_tensor_slices(x_a).shuffle(64).batch(8)\n"
        "ds_b = tf.data.Dataset.from_tensor_slices(x_b).shuffle(64).batch(8)\n"
        "train_ds = tf.data.Dataset.zip((ds_a, ds_b))\n" + loop("train_ds")
    )
    assert out.splitlines()[:3] == [
        "ds_a = tf.data.Dataset.from_tensor_slices(x_a).apply(sdp.shard).shuffle(64).batch(8)",
        "ds_b = tf.data.Dataset.from_tensor_slices(x_b).apply(sdp.shard).shuffle(64).batch(8)",
        "train_ds = tf.data.Dataset.zip((ds_a, ds_b))",
    ]
    assert [line for line, _ in sharded(result)] == [2, 3]
    assert all("before shuffle/batch" in message for _, message in sharded(result))


def test_a_zip_of_an_input_sharded_already_shards_only_the_other_input_once():
    out, result = convert(
        "ds_a = tf.data.Dataset.from_tensor_slices(x_a).shard(2, 0).batch(8)\n"
        "ds_b = tf.data.Dataset.from_tensor_slices(x_b).batch(8)\n"
        "ds = tf.data.Dataset.zip((ds_a, ds_b))\n" + loop("ds") + loop("ds.take(3)")
    )
    assert out.count(".apply(sdp.shard)") == 1
    assert "ds_b = tf.data.Dataset.from_tensor_slices(x_b).apply(sdp.shard).batch(8)" in out
    assert "Dataset.zip((ds_a, ds_b))\n" in out


def test_the_shard_goes_after_a_split_of_training_and_test_data():
    # Sharded at the load, each worker would hold half the rows and skip(50_000) would be past
    # the end: an empty test set on every worker.
    out, result = convert(
        "import tensorflow_datasets as tfds\n"
        'ds = tfds.load("mnist", split="train", as_supervised=True)\n'
        "ds = ds.shuffle(10_000, seed=42, reshuffle_each_iteration=False)\n"
        "train = ds.take(50_000).batch(64)\n"
        "test = ds.skip(50_000).batch(256)\n" + loop("train")
    )
    assert "train = ds.take(50_000).apply(sdp.shard).batch(64)" in out
    assert "test = ds.skip(50_000).batch(256)" in out
    assert 'tfds.load("mnist", split="train", as_supervised=True)\n' in out
    ((_, message),) = sharded(result)
    assert "after the split of the training data" in message


def test_a_split_after_an_unseeded_shuffle_is_reported_not_sharded():
    out, result = convert(
        'ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1000)\n'
        "train, test = ds.take(800), ds.skip(800)\n" + loop("train.batch(32)")
    )
    assert "sdp.shard" not in out
    ((line, message),) = reported(result, ONLY, manual=True)
    assert line == 2 and "give it a seed" in message


def test_adapt_reads_the_whole_data_and_the_training_stream_is_sharded_after_it():
    out, result = convert(
        "import keras\n"
        'raw = keras.utils.text_dataset_from_directory("d", subset="training", '
        "validation_split=0.2, seed=1337)\n"
        "vectorize = keras.layers.TextVectorization(max_tokens=100)\n"
        "vectorize.adapt(raw.map(lambda x, y: x))\n"
        "train_ds = raw.map(lambda x, y: (vectorize(x), y)).cache()\n"
        'model.compile(optimizer="adam", loss="mse")\n'
        "model.fit(train_ds, epochs=3)\n"
    )
    assert "vectorize.adapt(raw.map(lambda x, y: x))" in out
    assert "train_ds = raw.apply(sdp.shard).map(lambda x, y: (vectorize(x), y)).cache()" in out
    ((_, message),) = sharded(result)
    assert "by whole batches" in message


def test_batching_utilities_are_sharded_by_batches_only_when_their_order_is_the_same():
    out, result = convert(
        "import keras\n"
        "train_ds = keras.utils.timeseries_dataset_from_array(data[:-10], data[10:], 10)\n"
        "shuffled = keras.utils.image_dataset_from_directory('images')\n"
        'model.compile(optimizer="adam", loss="mse")\n'
        "model.fit(train_ds, epochs=3)\n"
        "model.fit(shuffled, epochs=3)\n"
    )
    assert "data[10:], 10).apply(sdp.shard)" in out
    assert "image_dataset_from_directory('images')\n" in out
    ((line, message),) = reported(result, ONLY, manual=True)
    assert line == 4 and "shuffles and batches by itself" in message


def test_the_older_keras_preprocessing_timeseries_spelling_is_sharded_like_keras_utils():
    out, _ = convert(
        "import tensorflow as tf\n"
        "train_ds = tf.keras.preprocessing.timeseries_dataset_from_array(x[:-5], x[5:], 5)\n"
        'model.compile(optimizer="adam", loss="mse")\n'
        "model.fit(train_ds, epochs=3)\n"
    )
    assert "timeseries_dataset_from_array(x[:-5], x[5:], 5).apply(sdp.shard)" in out


def test_a_helper_that_builds_training_and_test_data_gets_the_training_arrays_split():
    out, result = convert(
        "def make_dataset(x, y, training=False):\n"
        "    ds = tf.data.Dataset.from_tensor_slices((x, y))\n"
        "    if training:\n"
        "        ds = ds.shuffle(1024)\n"
        "    return ds.batch(32)\n"
        "(x_train, y_train), (x_test, y_test) = tf.keras.datasets.mnist.load_data()\n"
        "train_ds = make_dataset(x_train / 255.0, y_train, training=True)\n"
        "test_ds = make_dataset(x_test, y_test)\n" + loop("train_ds")
    )
    assert (
        "train_ds = make_dataset(sdp.shard(x_train / 255.0), sdp.shard(y_train), training=True)"
        in out
    )
    assert "test_ds = make_dataset(x_test, y_test)" in out
    assert "from_tensor_slices((x, y))\n" in out  # the helper itself is unchanged
    assert [line for line, _ in sharded(result)] == [8, 8]


def test_an_unseeded_permutation_before_the_split_becomes_rank_0s():
    out, result = convert(
        "import numpy as np\n"
        "(x, y), _ = tf.keras.datasets.mnist.load_data()\n"
        "idx = np.random.permutation(len(x))\n"
        "x, y = x[idx], y[idx]\n"
        'model.compile(optimizer="adam", loss="mse")\n'
        "model.fit(x[:1000], y[:1000], epochs=1)\n"
    )
    assert "idx = sdp.broadcast_object(np.random.permutation(len(x)), root_rank=0)" in out
    ((line, message),) = sharded(result)
    assert line == 4 and "(rank 0's)" in message
    check_noop("import tensorflow as tf\n" + out, only=ONLY)
    # Seeded everywhere alike: nothing to do.
    out, result = convert(
        "import numpy as np\nnp.random.seed(0)\n"
        "idx = np.random.permutation(len(x))\n"
        'model.compile(optimizer="adam", loss="mse")\n'
        "model.fit(x[idx], y[idx], epochs=1)\n"
    )
    assert "broadcast_object" not in out


def test_in_place_shuffles_and_unseeded_splits_before_the_split_are_reported():
    out, result = convert(
        "import numpy as np\n"
        "from sklearn.model_selection import train_test_split\n"
        "model = tf.keras.Sequential([tf.keras.layers.Dense(1)])\n"
        "x_tr, x_va, y_tr, y_va = train_test_split(x, y, test_size=0.2)\n"
        "idx = np.arange(len(x_tr))\n"
        "np.random.shuffle(idx)\n"
        'model.compile(optimizer="adam", loss="mse")\n'
        "model.fit(x_tr[idx], y_tr[idx], validation_data=(x_va, y_va), epochs=1)\n"
    )
    notes = reported(result, ONLY, manual=True)
    assert [line for line, _ in notes] == [5, 7]
    assert all("seed it" in message for _, message in notes)


def test_a_loop_inside_a_keras_train_step_is_no_training_loop_of_its_own():
    _, result = convert(
        "class GAN(tf.keras.Model):\n"
        "    def train_step(self, data):\n"
        "        for _ in range(2):\n"
        "            with tf.GradientTape() as tape:\n"
        "                loss = self.d(data)\n"
        "            grads = tape.gradient(loss, self.d.trainable_weights)\n"
        "            self.d_opt.apply_gradients(zip(grads, self.d.trainable_weights))\n"
        "        return {'loss': loss}\n"
    )
    assert reported(result, ONLY, manual=True) == []


def test_converted_fixtures_of_issue_22_have_nothing_left_to_say():
    # The engine's fixed-point check runs the transforms over their own output: what they wrote
    # (sdp.shard(x) for a helper or fit, .apply(sdp.shard), broadcast_object) is recognised.
    from pathlib import Path

    from sdp_convert.base import Options
    from sdp_convert.engine import convert as convert_source

    fixtures = Path(__file__).resolve().parents[2] / "fixtures"
    for case in ("keras/gan_fit_images", "tensorflow/zip_two_pipelines", "keras/split_take_skip",
                 "keras/permuted_arrays", "keras/dataset_helper", "keras/sequence_batches",
                 "keras/timeseries_utility", "tensorflow/early_stop_loop",
                 "keras/environment_first", "keras/normalization_adapt_split"):
        converted = (fixtures / case / "expected.py").read_text()
        result = convert_source(converted, Options(recheck=True))
        assert result.output.decode() == converted, case
        # (A manual note the conversion wrote as a marker already, the shared seed of the GAN,
        # is said again, and its marker kept: nothing new.)
        new = [c for c in result.changes
               if not (c.manual and f"# sdp-convert: manual - {c.message}" in converted)]
        assert new == [], (case, new)


ITERATOR = '''\
import numpy as np


class Batches:
    def __init__(self, x, y, size):
        self.x, self.y, self.size = x, y, size

    def __iter__(self):
        order = np.arange(len(self.x))
        np.random.shuffle(order)
        for start in range(0, {stop}, self.size):
            pick = order[start:start + self.size]
            yield self.x[pick], self.y[pick]


'''


def test_a_batch_iterator_class_gets_its_index_array_split_before_its_shuffle():
    out, result = convert(ITERATOR.format(stop="len(order)") + loop("Batches(x, y, 32)"))
    assert "        order = sdp.shard(np.arange(len(self.x)))\n" in out
    assert notes(result) == []
    assert [m for _, m in sharded(result)] == [
        "np.arange(len(self.x)) -> sdp.shard(np.arange(len(self.x))): Batches shuffles this index "
        "array and yields its batches, so each worker takes its own part of the indices (the same "
        "number on every worker) before shuffling it"
    ]
    second = run(result.output.decode(), ONLY)
    assert second.output == result.output and sharded(second) == [] and notes(second) == []


def test_a_batch_iterator_that_counts_its_own_length_gets_a_note_for_a_python_object():
    # range(0, len(self.x)) would run past a split index array: empty batches. A note, and no
    # ``.apply(sdp.shard)`` for an object that has no such method.
    out, result = convert(ITERATOR.format(stop="len(self.x)") + loop("Batches(x, y, 32)"))
    assert "sdp.shard" not in out
    assert notes(result) == [
        (17, "training data not sharded: Batches is a class of this script, not a tf.data "
             "pipeline: every worker reads all of its data; give it each worker's part of its "
             "arrays (sdp.shard(x) of each, in the same order on every worker) or split its index "
             "array with sdp.shard(...) before it shuffles")
    ]


def test_a_preview_take_is_no_train_test_split():
    source = (
        "ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256, seed=1).batch(32)\n"
        "for xb, yb in ds.take(1):\n"
        "    print(xb.shape)\n" + loop("ds")
    )
    out, result = convert(source)
    assert out.startswith(
        "ds = tf.data.Dataset.from_tensor_slices((x, y)).apply(sdp.shard).shuffle(256, seed=1)"
    )
    assert [m for _, m in sharded(result)] == [shard_message("tf.data.Dataset.from_tensor_slices")]


def test_a_take_that_is_evaluated_is_still_a_split():
    out, result = convert(
        "ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256).batch(32)\n"
        "for xb, yb in ds.take(2):\n"
        "    model.evaluate(xb, yb)\n" + loop("ds.skip(2)")
    )
    assert "sdp.shard" not in out
    assert "split after this shuffle" in notes(result)[0][1]


def test_arrays_made_from_an_unseeded_folder_reader_are_split_with_a_note():
    # The features are computed by going through a reader that shuffles the files differently
    # on each worker: splitting them gives overlapping parts, which the report says. A seed
    # (the reader's own, or TensorFlow's) makes the order agree: then nothing is said.
    body = (
        "from tensorflow import keras\n"
        "def features_of(dataset):\n"
        "    xs, ys = [], []\n"
        "    for images, labels in dataset:\n"
        "        xs.append(base.predict(images))\n"
        "        ys.append(labels)\n"
        "    return np.concatenate(xs), np.concatenate(ys)\n"
        "train = keras.utils.image_dataset_from_directory('train', image_size=(8, 8){seed})\n"
        "x, y = features_of(train)\n"
        "model = keras.Sequential([keras.layers.Dense(1)])\n"
        'model.compile(optimizer="adam", loss="mse")\n'
        "model.fit(x, y, epochs=1)\n"
    )
    result = run("import tensorflow as tf\nimport numpy as np\n" + body.format(seed=""))
    assert "sdp.shard(x)" in result.output.decode()  # (wrap_keras_fit's)
    notes = reported(result, ONLY, manual=True)
    assert any(line == 10 and "shuffles without a seed" in message and "overlap" in message
               for line, message in notes), notes
    for seeded in (body.format(seed=", seed=7"),
                   "import numpy as np\ntf.random.set_seed(1)\n" + body.format(seed="")):
        _, result = convert(seeded)
        assert not any("shuffles without a seed" in message
                       for _, message in reported(result, ONLY, manual=True))


def test_next_of_another_pipeline_after_the_step_is_not_training_data():
    # ``A, B = next(test_iter)`` after the step, for samples: the ``for`` rebinds A, B before
    # every step, so that pipeline feeds no training and no note names it.
    body = textwrap.dedent("""\
        train, test = load_pairs()
        test_iter = iter(test)
        for step, (a, b) in enumerate(train):
            with tf.GradientTape() as tape:
                loss = loss_fn(model(a), b)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            if step % 100 == 0:
                a, b = next(test_iter)
                fake = model(a)
                pictures = tf.concat([a, fake, b], axis=0)
                writer.write(pictures)
        """)
    out, result = convert(body)
    assert out == body
    assert notes(result) == [
        (4, "training data not sharded (train is unpacked from load_pairs()): give each worker "
            "its own part: .apply(sdp.shard) right after the source if it is a tf.data pipeline, "
            "sdp.shard(...) if it is arrays")
    ]
    # Pulled before the step, or kept for the next step (no ``for`` rebinds it), it is.
    extra = "    extra = next(test_iter)\n    a = tf.concat([a, extra], 0)\n"
    before = body.replace("    with tf.GradientTape()", extra + "    with tf.GradientTape()", 1)
    kept = body.replace("for step, (a, b) in enumerate(train):",
                        "a, b = next(iter(train))\nfor step in range(1000):")
    for source in (before, kept):
        assert "test is unpacked from load_pairs()" in notes(convert(source)[1])[0][1]
