from __future__ import annotations

from .helpers import TF_ALREADY_CONVERTED, check_noop, check_transformed, reported, run

ONLY = "disable_step_xla"

HEAD = """\
import tensorflow as tf

model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.SGD(0.1)
"""
HEAD_AFTER = """\
import tensorflow as tf
import sdp_runtime.tensorflow as sdp

sdp.init()

model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.SGD(0.1)
"""
STEP_BODY = """\
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss
"""
LOOP = """\


for x, y in dataset:
    train_step(x, y)
"""
MESSAGE = (
    "train_step(): jit_compile={old} -> {new}: XLA cannot compile the gradient allreduce, so the "
    "step compiles with XLA on one process only"
)


def changes(result):
    return reported(result, ONLY, manual=False)


def test_a_decorated_step_compiles_with_xla_on_one_process_only():
    result = check_transformed(
        HEAD + "\n\n@tf.function(jit_compile=True)\ndef train_step(x, y):\n" + STEP_BODY + LOOP,
        HEAD_AFTER + "\n\n@tf.function(jit_compile=sdp.size() == 1)\ndef train_step(x, y):\n"
        + STEP_BODY + LOOP,
        only=ONLY,
    )
    assert changes(result) == [(7, MESSAGE.format(old="True", new="sdp.size() == 1"))]


def test_a_step_compiled_by_a_call_a_method_or_a_decorator_factory():
    # tf.function(step, jit_compile=True), under another spelling of tf.function.
    check_transformed(
        HEAD.replace("import tensorflow as tf\n", "import tensorflow as tf\nfrom tensorflow import function\n")
        + "\n\ndef step(x, y):\n" + STEP_BODY
        + "\n\ntrain_step = function(step, jit_compile=True)\n" + LOOP,
        HEAD_AFTER.replace("import tensorflow as tf\n", "import tensorflow as tf\nfrom tensorflow import function\n")
        + "\n\ndef step(x, y):\n" + STEP_BODY
        + "\n\ntrain_step = function(step, jit_compile=sdp.size() == 1)\n" + LOOP,
        only=ONLY,
    )
    # tf.function(jit_compile=True)(step)
    check_transformed(
        HEAD + "\n\ndef step(x, y):\n" + STEP_BODY
        + "\n\ntrain_step = tf.function(jit_compile=True)(step)\n" + LOOP,
        HEAD_AFTER + "\n\ndef step(x, y):\n" + STEP_BODY
        + "\n\ntrain_step = tf.function(jit_compile=sdp.size() == 1)(step)\n" + LOOP,
        only=ONLY,
    )
    # A trainer's method, compiled in __init__.
    method = (
        "\n\nclass Trainer:\n"
        "    def __init__(self):\n"
        "        self.step = tf.function(self._step, jit_compile={})\n\n"
        "    def _step(self, x, y):\n"
        + "\n".join("    " + line for line in STEP_BODY.splitlines())
        + "\n\n    def fit(self, dataset):\n"
        "        for x, y in dataset:\n"
        "            self.step(x, y)\n"
    )
    result = check_transformed(
        HEAD + method.format("True"), HEAD_AFTER + method.format("sdp.size() == 1"), only=ONLY
    )
    assert changes(result)[0][1].startswith("_step(): jit_compile=True -> sdp.size() == 1")


def test_a_jit_compile_expression_is_kept_and_limited_to_one_process():
    for old, new in [
        ("args.xla", "args.xla and sdp.size() == 1"),
        ("use_xla or on_gpu", "(use_xla or on_gpu) and sdp.size() == 1"),
        ("True if xla else False", "(True if xla else False) and sdp.size() == 1"),
        ("(a or b)", "(a or b) and sdp.size() == 1"),
    ]:
        result = check_transformed(
            HEAD + f"\n\n@tf.function(jit_compile={old})\ndef train_step(x, y):\n" + STEP_BODY + LOOP,
            HEAD_AFTER + f"\n\n@tf.function(jit_compile={new})\ndef train_step(x, y):\n"
            + STEP_BODY + LOOP,
            only=ONLY,
        )
        assert changes(result) == [(7, MESSAGE.format(old=old, new=new))]


def test_a_step_whose_tape_or_update_is_in_a_helper_of_the_file():
    source = HEAD + """

def apply(grads):
    optimizer.apply_gradients(zip(grads, model.trainable_variables))


@tf.function(jit_compile=True)
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    apply(tape.gradient(loss, model.trainable_variables))
""" + LOOP
    result = run(source, only=ONLY)
    assert "@tf.function(jit_compile=sdp.size() == 1)" in result.output.decode()
    assert len(changes(result)) == 1


def test_functions_that_do_not_train_keep_xla():
    check_noop(
        HEAD_AFTER + """

@tf.function(jit_compile=True)
def evaluate(x, y):
    return tf.reduce_mean((model(x) - y) ** 2)


@tf.function(jit_compile=True)
def penalty(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = model(x)
    return tf.reduce_sum(tape.gradient(out, x) ** 2)


@tf.function
def train_step(x, y):
""" + STEP_BODY + LOOP,
        only=ONLY,
    )


def test_xla_already_off_or_limited_and_keras_compile_are_left_alone():
    for value in ("False", "None", "sdp.size() == 1", "args.xla and sdp.size() == 1"):
        check_noop(
            HEAD_AFTER + f"\n\n@tf.function(jit_compile={value})\ndef train_step(x, y):\n"
            + STEP_BODY + LOOP,
            only=ONLY,
        )
    # Keras fit: the runtime keeps XLA around its allreduce itself.
    fit = HEAD + 'model.compile(optimizer, loss="mse", jit_compile=True)\nmodel.fit(dataset)\n'
    result = run(fit, only=ONLY)
    assert "jit_compile=True" in result.output.decode() and changes(result) == []


def test_converting_the_output_again_changes_nothing():
    first = run(HEAD + "\n\n@tf.function(jit_compile=True)\ndef train_step(x, y):\n" + STEP_BODY + LOOP)
    assert b"jit_compile=sdp.size() == 1" in first.output
    check_noop(first.output.decode())


def test_a_script_made_data_parallel_by_hand_is_left_alone():
    check_noop(TF_ALREADY_CONVERTED.read_text(), only=ONLY)
