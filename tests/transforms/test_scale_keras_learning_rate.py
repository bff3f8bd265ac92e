from __future__ import annotations

import pytest

from .helpers import TF_ALREADY_CONVERTED, check_noop, check_transformed, messages, reported, run

ONLY = "scale_keras_learning_rate"
ALREADY_CONVERTED = TF_ALREADY_CONVERTED
HEAD = "import tensorflow as tf\n"
# A custom training step applying the gradients of a tape: the file is a TensorFlow training script.
# over a tf.data dataset (shard_tf_dataset would shard it): the rate is scaled.
TAIL = """\
for x in tf.data.Dataset.from_tensor_slices(data).batch(8):
    with tf.GradientTape() as tape:
        loss = model(x)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
"""
CONVERTED_HEAD = """\
import tensorflow as tf
import sdp_runtime.tensorflow as sdp

sdp.init()
"""


def convert(body: str, **options: object):
    """``body`` after ``import tensorflow as tf``, converted; returns (output body, result)."""
    result = run(HEAD + body + TAIL, ONLY, **options)
    output = result.output.decode()
    if output.startswith(CONVERTED_HEAD):
        output = output[len(CONVERTED_HEAD) :]
    return output.removesuffix(TAIL), result


def scaled(result):
    return [(c.line, c.col, c.message) for c in result.changes if c.transform == ONLY and not c.manual]


def notes(result):
    return reported(result, ONLY, manual=True)


def test_every_import_spelling_of_a_keras_optimizer():
    result = check_transformed(
        """\
        import tensorflow as tf
        from tensorflow import keras
        import keras as k3
        from tensorflow.keras.optimizers import Adam
        from tensorflow.keras import optimizers as opts
        import tensorflow.keras.optimizers.legacy as legacy

        a = tf.keras.optimizers.SGD(0.1, momentum=0.9)
        b = keras.optimizers.RMSprop(learning_rate=args.lr)
        c = k3.optimizers.Adagrad(learning_rate=0.01)
        d = tf.optimizers.Adam(1e-3)
        e = Adam(learning_rate=lr)
        f = opts.Nadam(0.002)
        g = legacy.Adam(0.001)
        h = tf.keras.optimizers.experimental.AdamW(3e-4, weight_decay=0.1)
        for x in tf.data.Dataset.from_tensor_slices(data).batch(8):
            with tf.GradientTape() as tape:
                loss = model(x)
            grads = tape.gradient(loss, model.trainable_variables)
            a.apply_gradients(zip(grads, model.trainable_variables))
        """,
        """\
        import tensorflow as tf
        from tensorflow import keras
        import keras as k3
        from tensorflow.keras.optimizers import Adam
        from tensorflow.keras import optimizers as opts
        import tensorflow.keras.optimizers.legacy as legacy
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        a = tf.keras.optimizers.SGD(0.1 * sdp.size(), momentum=0.9)
        b = keras.optimizers.RMSprop(learning_rate=args.lr * sdp.size())
        c = k3.optimizers.Adagrad(learning_rate=0.01 * sdp.size())
        d = tf.optimizers.Adam(1e-3 * sdp.size())
        e = Adam(learning_rate=lr * sdp.size())
        f = opts.Nadam(0.002 * sdp.size())
        g = legacy.Adam(0.001 * sdp.size())
        h = tf.keras.optimizers.experimental.AdamW(3e-4 * sdp.size(), weight_decay=0.1)
        for x in tf.data.Dataset.from_tensor_slices(data).batch(8):
            with tf.GradientTape() as tape:
                loss = model(x)
            grads = tape.gradient(loss, model.trainable_variables)
            a.apply_gradients(zip(grads, model.trainable_variables))
        """,
        only=ONLY,
    )
    assert scaled(result) == [
        (8, 5, "SGD: learning rate 0.1 * sdp.size()"),
        (9, 5, "RMSprop: learning rate args.lr * sdp.size()"),
        (10, 5, "Adagrad: learning rate 0.01 * sdp.size()"),
        (11, 5, "Adam: learning rate 1e-3 * sdp.size()"),
        (12, 5, "Adam: learning rate lr * sdp.size()"),
        (13, 5, "Nadam: learning rate 0.002 * sdp.size()"),
        (14, 5, "Adam: learning rate 0.001 * sdp.size()"),
        (15, 5, "AdamW: learning rate 3e-4 * sdp.size()"),
    ]


def test_positional_keyword_and_legacy_lr_keep_the_users_expression():
    out, _ = convert(
        "a = tf.keras.optimizers.Adam(3e-4, beta_1=0.8)\n"
        "b = tf.keras.optimizers.SGD(learning_rate=base + 0.1, momentum=0.9)\n"
        "c = tf.keras.optimizers.SGD(lr=MAX_LR / 25)\n"
        "d = tf.keras.optimizers.Adam(learning_rate=hi if fast else lo)\n"
        "opt = tf.keras.optimizers.Adam(\n"
        "    learning_rate=cfg['lr'],  # tuned\n"
        "    epsilon=1e-7,\n"
        ")\n"
    )
    assert out == (
        "a = tf.keras.optimizers.Adam(3e-4 * sdp.size(), beta_1=0.8)\n"
        "b = tf.keras.optimizers.SGD(learning_rate=(base + 0.1) * sdp.size(), momentum=0.9)\n"
        "c = tf.keras.optimizers.SGD(lr=MAX_LR / 25 * sdp.size())\n"
        "d = tf.keras.optimizers.Adam(learning_rate=(hi if fast else lo) * sdp.size())\n"
        "opt = tf.keras.optimizers.Adam(\n"
        "    learning_rate=cfg['lr'] * sdp.size(),  # tuned\n"
        "    epsilon=1e-7,\n"
        ")\n"
    )


@pytest.mark.parametrize(
    ("cls", "default"),
    [("Adam", "0.001"), ("AdamW", "0.001"), ("SGD", "0.01"), ("RMSprop", "0.001"),
     ("Adagrad", "0.001"), ("Adadelta", "0.001"), ("Adamax", "0.001"), ("Nadam", "0.001"),
     ("Ftrl", "0.001"), ("Lion", "0.001")],
)
def test_default_learning_rate_is_written_out_and_scaled(cls, default):
    out, result = convert(f"opt = tf.keras.optimizers.{cls}(weight_decay=0.01)\n")
    assert out == (
        f"opt = tf.keras.optimizers.{cls}(learning_rate={default} * sdp.size(), weight_decay=0.01)\n"
    )
    assert messages(result, ONLY) == [f"{cls}: default learning rate {default} written out, * sdp.size()"]


def test_a_learning_rate_schedule_gets_its_rates_scaled():
    out, result = convert(
        "schedule = tf.keras.optimizers.schedules.ExponentialDecay(\n"
        "    initial_learning_rate=0.1, decay_steps=100, decay_rate=0.9)\n"
        "opt = tf.keras.optimizers.SGD(learning_rate=schedule, momentum=0.9)\n"
        "poly = tf.keras.optimizers.schedules.PolynomialDecay(0.1, 1000)\n"
        "b = tf.keras.optimizers.Adam(poly)\n"
        "c = tf.keras.optimizers.Adam(tf.keras.optimizers.schedules.PiecewiseConstantDecay(\n"
        "    [100, 200], [0.1, 0.01, 0.001]))\n"
        "cos = tf.keras.optimizers.schedules.CosineDecay(0.01, 1000, warmup_target=0.1, warmup_steps=100)\n"
        "d = tf.keras.optimizers.Adam(learning_rate=cos)\n"
    )
    assert out == (
        "schedule = tf.keras.optimizers.schedules.ExponentialDecay(\n"
        "    initial_learning_rate=0.1 * sdp.size(), decay_steps=100, decay_rate=0.9)\n"
        "opt = tf.keras.optimizers.SGD(learning_rate=schedule, momentum=0.9)\n"
        "poly = tf.keras.optimizers.schedules.PolynomialDecay(0.1 * sdp.size(), 1000, "
        "end_learning_rate=0.0001 * sdp.size())\n"
        "b = tf.keras.optimizers.Adam(poly)\n"
        "c = tf.keras.optimizers.Adam(tf.keras.optimizers.schedules.PiecewiseConstantDecay(\n"
        "    [100, 200], [0.1 * sdp.size(), 0.01 * sdp.size(), 0.001 * sdp.size()]))\n"
        "cos = tf.keras.optimizers.schedules.CosineDecay(0.01 * sdp.size(), 1000, "
        "warmup_target=0.1 * sdp.size(), warmup_steps=100)\n"
        "d = tf.keras.optimizers.Adam(learning_rate=cos)\n"
    )
    assert [(line, message) for line, _, message in scaled(result)] == [
        (2, "ExponentialDecay: initial_learning_rate * sdp.size()"),
        (5, "PolynomialDecay: initial_learning_rate, end_learning_rate * sdp.size()"),
        (7, "PiecewiseConstantDecay: values * sdp.size()"),
        (9, "CosineDecay: initial_learning_rate, warmup_target * sdp.size()"),
    ]


def test_schedules_whose_rates_cannot_be_read_need_a_person():
    out, result = convert(
        "class WarmUp(tf.keras.optimizers.schedules.LearningRateSchedule):\n"
        "    def __call__(self, step):\n"
        "        return 0.1 * tf.minimum(1.0, step / 100)\n"
        "a = tf.keras.optimizers.Adam(WarmUp())\n"
        "b = tf.keras.optimizers.SGD(tf.keras.optimizers.schedules.PiecewiseConstantDecay(bounds, rates))\n"
    )
    assert "sdp.size()" not in out
    assert notes(result) == [
        (5, "custom LearningRateSchedule: scale the rates it returns by sdp.size()"),
        (6, "PiecewiseConstantDecay: scale each of its values by sdp.size() (not a literal list)"),
    ]


def test_string_optimizers_in_compile_become_objects_in_the_files_keras_spelling():
    fit = "model.fit(x_train, y_train, epochs=1)\n"
    for head, keras in [
        ("import tensorflow as tf\n\nmodel = tf.keras.Sequential([])\n", "tf.keras"),
        ("from tensorflow import keras\n\nmodel = keras.Sequential([])\n", "keras"),
        ("import keras\n\nmodel = keras.Sequential([])\n", "keras"),
    ]:
        before = head + (
            'model.compile(optimizer="adam", loss="mse")\n'
            'model.compile("sgd", "mse")\n'
            'model.compile(optimizer="Adadelta", loss="mse")\n'
            'model.compile(loss="mse")\n'
        ) + fit
        after = head.replace("\n\n", "\nimport sdp_runtime.tensorflow as sdp\n\nsdp.init()\n\n") + (
            f"model.compile(optimizer={keras}.optimizers.Adam(learning_rate=0.001 * sdp.size()), loss=\"mse\")\n"
            f"model.compile({keras}.optimizers.SGD(learning_rate=0.01 * sdp.size()), \"mse\")\n"
            f"model.compile(optimizer={keras}.optimizers.Adadelta(learning_rate=0.001 * sdp.size()), loss=\"mse\")\n"
            f"model.compile(optimizer={keras}.optimizers.RMSprop(learning_rate=0.001 * sdp.size()), loss=\"mse\")\n"
        ) + fit
        result = check_transformed(before, after, only=ONLY)
        assert messages(result, ONLY) == [
            f'optimizer "adam" -> {keras}.optimizers.Adam(learning_rate=0.001 * sdp.size()) so that '
            "its learning rate can be scaled",
            f'optimizer "sgd" -> {keras}.optimizers.SGD(learning_rate=0.01 * sdp.size()) so that '
            "its learning rate can be scaled",
            f'optimizer "Adadelta" -> {keras}.optimizers.Adadelta(learning_rate=0.001 * sdp.size()) '
            "so that its learning rate can be scaled",
            f"default optimizer -> {keras}.optimizers.RMSprop(learning_rate=0.001 * sdp.size()) so "
            "that its learning rate can be scaled",
        ]


def test_an_optimizer_name_it_does_not_know_needs_a_person():
    result = check_transformed(
        'import tensorflow as tf\n\nmodel = tf.keras.Sequential([])\n'
        'model.compile(optimizer="novograd", loss="mse")\nmodel.fit(x_train, y_train)\n',
        'import tensorflow as tf\nimport sdp_runtime.tensorflow as sdp\n\nsdp.init()\n\n'
        'model = tf.keras.Sequential([])\n'
        'model.compile(optimizer="novograd", loss="mse")\nmodel.fit(x_train, y_train)\n',
        only=ONLY,
    )
    assert notes(result) == [
        (4, 'optimizer "novograd": unknown to the converter, scale its learning rate by sdp.size()')
    ]


def test_sqrt_scaling():
    out, result = convert(
        "a = tf.keras.optimizers.SGD(0.1)\n"
        "b = tf.keras.optimizers.Adam()\n"
        "s = tf.keras.optimizers.schedules.ExponentialDecay(0.1, 100, 0.9)\n"
        "c = tf.keras.optimizers.SGD(s)\n",
        lr_scaling="sqrt",
    )
    assert out == (
        "a = tf.keras.optimizers.SGD(0.1 * sdp.size() ** 0.5)\n"
        "b = tf.keras.optimizers.Adam(learning_rate=0.001 * sdp.size() ** 0.5)\n"
        "s = tf.keras.optimizers.schedules.ExponentialDecay(0.1 * sdp.size() ** 0.5, 100, 0.9)\n"
        "c = tf.keras.optimizers.SGD(s)\n"
    )
    assert messages(result, ONLY) == [
        "SGD: learning rate 0.1 * sdp.size() ** 0.5",
        "Adam: default learning rate 0.001 written out, * sdp.size() ** 0.5",
        "ExponentialDecay: initial_learning_rate * sdp.size() ** 0.5",
    ]


def test_no_scaling_leaves_every_learning_rate_alone():
    result = check_transformed(
        """\
        import tensorflow as tf
        opt = tf.keras.optimizers.SGD(0.1)
        s = tf.keras.optimizers.schedules.ExponentialDecay(0.1, 100, 0.9)
        adam = tf.keras.optimizers.Adam(s)
        model.compile(optimizer="adam", loss="mse")
        model.fit(x_train, y_train)
        """,
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()
        opt = tf.keras.optimizers.SGD(0.1)
        s = tf.keras.optimizers.schedules.ExponentialDecay(0.1, 100, 0.9)
        adam = tf.keras.optimizers.Adam(s)
        model.compile(optimizer="adam", loss="mse")
        model.fit(x_train, y_train)
        """,
        only=ONLY,
        lr_scaling="none",
    )
    assert messages(result, ONLY) == []


def test_learning_rates_set_while_training_need_a_person():
    out, result = convert(
        "opt = tf.keras.optimizers.SGD(0.1)\n"
        "opt.learning_rate = 0.05\n"
        "opt.lr.assign(0.01)\n"
        "model.optimizer.learning_rate.assign(0.02)\n"
        "tf.keras.backend.set_value(model.optimizer.lr, 0.001)\n"
        "cb = tf.keras.callbacks.LearningRateScheduler(lambda epoch: 0.1 * 0.9 ** epoch)\n"
        "config.lr = 0.3\n"
    )
    # Only the constructor is rewritten; the values set later are left for a person.
    assert out == (
        "opt = tf.keras.optimizers.SGD(0.1 * sdp.size())\n"
        "opt.learning_rate = 0.05\n"
        "opt.lr.assign(0.01)\n"
        "model.optimizer.learning_rate.assign(0.02)\n"
        "tf.keras.backend.set_value(model.optimizer.lr, 0.001)\n"
        "cb = tf.keras.callbacks.LearningRateScheduler(lambda epoch: 0.1 * 0.9 ** epoch)\n"
        "config.lr = 0.3\n"
    )
    note = "learning rate set while training: scale the new value by sdp.size()"
    assert notes(result) == [
        (3, note),
        (4, note),
        (5, note),
        (6, note),
        (7, "LearningRateScheduler sets the learning rate while training: multiply the rates it "
            "returns by sdp.size()"),
    ]


def test_already_scaled_learning_rates_are_left_alone():
    check_noop(
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp
        from sdp_runtime.tensorflow import size as world

        sdp.init()
        lr = args.lr * sdp.size()
        a = tf.keras.optimizers.SGD(lr)
        b = tf.keras.optimizers.SGD(learning_rate=args.lr * world())
        c = tf.keras.optimizers.Adam(0.001 * sdp.size() ** 0.5)
        initial = 0.1 * sdp.size()
        s = tf.keras.optimizers.schedules.ExponentialDecay(initial, 100, 0.9)
        d = tf.keras.optimizers.Adam(s)
        e = tf.keras.optimizers.Adam(tf.keras.optimizers.schedules.PolynomialDecay(
            0.1 * sdp.size(), 100, end_learning_rate=0.0001 * sdp.size()))
        model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate=0.001 * sdp.size()), loss="mse")
        model.fit(x_train, y_train)
        """,
        only=ONLY,
    )


def test_converting_the_output_again_changes_nothing():
    result = check_transformed(
        """\
        import tensorflow as tf
        lr = 0.1
        opt = tf.keras.optimizers.SGD(lr, momentum=0.9)
        s = tf.keras.optimizers.schedules.PolynomialDecay(0.1, 1000)
        adam = tf.keras.optimizers.Adam(s)
        model.compile(loss="mse")
        model.fit(x_train, y_train)
        """,
        """\
        import tensorflow as tf
        import sdp_runtime.tensorflow as sdp

        sdp.init()
        lr = 0.1
        opt = tf.keras.optimizers.SGD(lr * sdp.size(), momentum=0.9)
        s = tf.keras.optimizers.schedules.PolynomialDecay(0.1 * sdp.size(), 1000, end_learning_rate=0.0001 * sdp.size())
        adam = tf.keras.optimizers.Adam(s)
        model.compile(optimizer=tf.keras.optimizers.RMSprop(learning_rate=0.001 * sdp.size()), loss="mse")
        model.fit(x_train, y_train)
        """,
        only=ONLY,
    )
    check_noop(result.output.decode(), only=ONLY)


def test_other_libraries_optimizers_and_unrelated_calls_are_left_alone():
    check_noop(
        """\
        import re
        import tensorflow as tf
        import tensorflow_addons as tfa
        import sdp_runtime.tensorflow as sdp

        sdp.init()
        pattern = re.compile("a+")
        opt = tfa.optimizers.AdamW(weight_decay=1e-4, learning_rate=1e-3)
        lr = tf.Variable(0.1)
        for x in tf.data.Dataset.from_tensor_slices(data).batch(8):
            with tf.GradientTape() as tape:
                loss = model(x)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        """,
        only=ONLY,
    )


def test_a_script_made_data_parallel_by_hand_is_left_alone():
    # fixtures/tensorflow/already_converted, looked at as if it were this converter's output.
    check_noop(ALREADY_CONVERTED.read_text(), only=ONLY)


def test_the_optimizer_import_takes_no_name_the_file_uses_for_something_else():
    # ``from keras import optimizers`` here would rebind the file's own ``optimizers`` (Keras'
    # private ``keras.src`` package, which the converter leaves alone): a second pass would then
    # take ``optimizers.AdamW(...)`` for a Keras optimizer and scale it.
    result = check_transformed(
        """\
        from keras.models import Sequential
        from keras.layers import Dense
        from keras.src import optimizers

        model = Sequential([Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        model.fit(x, y, epochs=3)
        opt = optimizers.AdamW(learning_rate=0.1)
        """,
        """\
        from keras.models import Sequential
        from keras.layers import Dense
        from keras.src import optimizers
        import keras
        import sdp_runtime.tensorflow as sdp

        sdp.init()

        model = Sequential([Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.01 * sdp.size()), loss="mse")
        model.fit(x, y, epochs=3)
        opt = optimizers.AdamW(learning_rate=0.1)
        """,
        only=ONLY,
    )
    check_noop(result.output.decode(), only=ONLY)
    # A project's own ``optimizers`` module, and ``keras`` taken as well: an alias.
    result = check_transformed(
        """\
        from keras.models import Sequential
        import keras_hub as keras
        import optimizers

        model = Sequential([])
        model.compile(optimizer="adam", loss="mse")
        model.fit(x, y, epochs=3)
        """,
        """\
        from keras.models import Sequential
        import keras_hub as keras
        import optimizers
        import sdp_runtime.tensorflow as sdp
        from keras import optimizers as keras_optimizers

        sdp.init()

        model = Sequential([])
        model.compile(optimizer=keras_optimizers.Adam(learning_rate=0.001 * sdp.size()), loss="mse")
        model.fit(x, y, epochs=3)
        """,
        only=ONLY,
    )
    check_noop(result.output.decode(), only=ONLY)


def test_an_optimizer_given_its_arguments_as_a_dict_needs_a_person():
    # The dict may hold the learning rate: written out as well, it would fail the call.
    out, result = convert(
        'opt = tf.keras.optimizers.Adam(**config["optimizer"])\n'
        "sgd = tf.keras.optimizers.SGD(momentum=0.9, **extra, learning_rate=0.1)\n"
    )
    assert out == (
        'opt = tf.keras.optimizers.Adam(**config["optimizer"])\n'
        "sgd = tf.keras.optimizers.SGD(momentum=0.9, **extra, learning_rate=0.1 * sdp.size())\n"
    )
    assert notes(result) == [
        (2, "Adam(**config[\"optimizer\"]): scale the learning rate it holds (or Keras' default, "
            "0.001) by sdp.size()"),
    ]
    check_noop(result.output.decode(), only=ONLY)


def test_a_schedule_object_on_data_left_unsplit_gets_exact_advice():
    # The data is not split (the converter cannot follow load_pairs()): the rate stays, and the
    # note says what to scale in a schedule object: the rate given to it, and its step counts
    # made from the length of the data load_pairs() returns with it.
    loop = """\
for x in train:
    with tf.GradientTape() as tape:
        loss = model(x)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
"""
    source = ("import tensorflow as tf\nimport schedules\n\ntrain, n_batches = load_pairs()\n"
              "sched = schedules.Warmup(args.lr, args.epochs * n_batches)\n"
              "opt = tf.keras.optimizers.Adam(learning_rate=sched)\n" + loop)
    assert notes(run(source, ONLY)) == [
        (6, "Adam: sched left as it is: the training data is not split between the workers (see "
            "the data's note); once each worker trains on its own part of the data, scale the "
            "rate given to schedules.Warmup(...) (args.lr) by sdp.size(), and divide its step "
            "counts made from n_batches by sdp.size() too if they still count all of the data "
            "then (each worker runs 1/sdp.size() of an epoch's steps)")
    ]
    # A Keras schedule: its initial rate, named; no length of the data, no step counts to divide.
    keras = source.replace("schedules.Warmup(args.lr, args.epochs * n_batches)",
                           "tf.keras.optimizers.schedules.ExponentialDecay(0.1, 1000, 0.9)")
    assert notes(run(keras, ONLY))[0][1].endswith(
        "scale the rate given to tf.keras.optimizers.schedules.ExponentialDecay(...) (0.1) by "
        "sdp.size()")
    # A plain rate keeps the plain advice.
    plain = source.replace("learning_rate=sched", "learning_rate=args.lr")
    assert notes(run(plain, ONLY))[0][1].endswith(
        "; scale it by sdp.size() once each worker trains on its own part of the data")
