"""program.tfshards, program.datasets (arrays), program.permutations, program.flow
(decided_per_rank), program.syntax (the import block with environment settings)."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from sdp_convert.program.datasets import holds_arrays, in_keras_train_step
from sdp_convert.program.flow import decided_per_rank
from sdp_convert.program.permutations import unseeded_orders
from sdp_convert.program.syntax import end_of_import_block, first_import_block_end
from sdp_convert.program.tfshards import data_sharded_for, tf_training_data

from .helpers import code, find, probe

LOOP = """\
for x, y in {ds}:
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
"""


def _uses(source: str) -> list[tuple[str, str | None]]:
    t = probe("import tensorflow as tf\nimport numpy as np\n" + source)
    return [(code(t, u.where).splitlines()[0], u.sharded_by) for u in tf_training_data(t)]


def test_training_data_says_who_shards_it_for_each_loop_and_fit():
    assert _uses(
        "ds = tf.data.Dataset.from_tensor_slices((a, b)).batch(8)\n" + LOOP.format(ds="ds")
    ) == [("for x, y in ds:", "converter")]
    assert _uses(
        "ds = tf.data.Dataset.from_tensor_slices((a, b)).shard(2, 0).batch(8)\n"
        + LOOP.format(ds="ds")
    ) == [("for x, y in ds:", "script")]
    assert _uses("model.compile(loss='mse')\nmodel.fit(make_batches(), epochs=2)\n") == [
        ("model.fit(make_batches(), epochs=2)", None)
    ]
    assert _uses(
        "model.compile(loss='mse')\nmodel.fit(np.zeros((8, 2)), epochs=2)\n"
    ) == [("model.fit(np.zeros((8, 2)), epochs=2)", "converter")]


def test_data_sharded_for_answers_at_the_fit_and_inside_the_loop():
    t = probe(
        "import tensorflow as tf\n"
        "train = tf.data.Dataset.from_tensor_slices((a, b)).batch(8)\n"
        + LOOP.format(ds="train")
        + "model.compile(loss='mse')\nmodel.fit(generator(), epochs=1)\n"
    )
    apply = find(t, m.Call(func=m.Attribute(attr=m.Name("apply_gradients"))))
    fit = find(t, m.Call(func=m.Attribute(attr=m.Name("fit"))))
    assert data_sharded_for(t, apply) is True
    assert data_sharded_for(t, fit) is False
    assert data_sharded_for(t, t.module.body[0]) is None


def test_holds_arrays_follows_assignments_and_containers():
    t = probe(
        "import numpy as np\nimport tensorflow as tf\n"
        "(x_train, y_train), _ = tf.keras.datasets.mnist.load_data()\n"
        "digits = np.expand_dims(x_train, -1).astype('float32') / 255\n"
        "idx = perm()\n"
        "a, b = digits[idx], y_train\n"
        "ds = tf.data.Dataset.from_tensor_slices(digits)\n"
        "use(digits, (a, b), {'x': a}, ds, gen(), [a, ds])\n"
    )
    call = find(t, m.Call(func=m.Name("use")))
    assert isinstance(call, cst.Call)
    got = [holds_arrays(t, arg.value, call) for arg in call.args]
    assert got == [True, True, True, False, False, False]


def test_decided_per_rank_separates_losses_from_counters_and_configuration():
    t = probe(
        "import tensorflow as tf\n"
        "best = 1.0\nsteps = 0\n"
        "for epoch in range(args.epochs):\n"
        "    loss = train()\n"
        "    steps += 1\n"
        "    if loss < best:\n"
        "        counter = 0\n"
        "    check(epoch > 3, steps >= args.max_steps, loss < best, counter == 0, len(x) > 2)\n"
    )
    call = find(t, m.Call(func=m.Name("check")))
    assert isinstance(call, cst.Call)
    assert [decided_per_rank(t, a.value) for a in call.args] == [False, False, True, True, False]


def test_decided_per_rank_follows_an_unpacked_return_of_the_files_function():
    # ``loss, done = one_step(x)``: ``done`` is the optimizer's step count, the same on every
    # rank; ``loss`` is computed from the model.
    t = probe(
        "import tensorflow as tf\n"
        "def fit(batches, opt, steps):\n"
        "    def one_step(x):\n"
        "        loss = model(x)\n"
        "        done = opt.iterations\n"
        "        return loss, done - 1\n"
        "    for x in batches:\n"
        "        loss, done = one_step(x)\n"
        "        check(done >= steps, loss < 0.1)\n"
    )
    call = find(t, m.Call(func=m.Name("check")))
    assert isinstance(call, cst.Call)
    assert [decided_per_rank(t, a.value) for a in call.args] == [False, True]


def test_unseeded_orders_finds_draws_behind_the_split_arrays_only():
    t = probe(
        "import numpy as np\n"
        "x = load()\n"
        "idx = np.random.permutation(len(x))\n"
        "noise = np.random.rand(3)\n"
        "rng = np.random.default_rng()\n"
        "order = rng.permutation(10)\n"
        "seeded = np.random.default_rng(0).permutation(10)\n"
        "use(x[idx], x[order], x[seeded])\n"
    )
    call = find(t, m.Call(func=m.Name("use")))
    assert isinstance(call, cst.Call)
    found = unseeded_orders(t, [a.value for a in call.args])
    assert sorted(code(t, c) for c in found.permutations) == [
        "np.random.permutation(len(x))", "rng.permutation(10)"
    ]
    assert found.notes == []


def test_a_loop_in_a_keras_train_step_is_recognised():
    t = probe(
        "import tensorflow as tf\n"
        "class GAN(tf.keras.Model):\n"
        "    def train_step(self, data):\n"
        "        for _ in range(2):\n"
        "            with tf.GradientTape() as tape:\n"
        "                loss = self.d(data)\n"
        "            grads = tape.gradient(loss, self.d.trainable_weights)\n"
        "            self.opt.apply_gradients(zip(grads, self.d.trainable_weights))\n"
        "        return {}\n"
        + LOOP.format(ds="ds")
    )
    loops = [n for n in m.findall(t.module, m.For())]
    assert [in_keras_train_step(t, loop) for loop in loops] == [True, False]


def test_the_import_block_runs_on_through_environment_settings():
    t = probe(
        '"""Doc."""\nimport os\n\nos.environ["KERAS_BACKEND"] = "tensorflow"\n'
        'os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")\nimport keras\n\nx = 1\n'
    )
    assert code(t, end_of_import_block(t.module)) == "import keras"
    assert code(t, first_import_block_end(t.module)) == "import os"
    plain = probe("import torch\nimport os\nx = 1\n")
    assert end_of_import_block(plain.module) is first_import_block_end(plain.module)
