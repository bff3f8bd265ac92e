"""program.keras, optimizers, loaders, index, training, datasets: the framework questions."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
import pytest
from sdp_convert.program.datasets import trace_dataset, training_dataset_uses
from sdp_convert.program.index import file_index, reaching_values
from sdp_convert.program.keras import keras_fit_calls, keras_name, optimizer_class
from sdp_convert.program.loaders import is_distributed_sampler, kwargs_literal, sets_epoch
from sdp_convert.program.optimizers import optimizer_class as torch_optimizer_class
from sdp_convert.program.training import training_facts

from .helpers import code, find, probe


@pytest.mark.parametrize(
    ("qname", "normal"),
    [
        ("tensorflow.keras.optimizers.Adam", "keras.optimizers.Adam"),
        ("tf_keras.optimizers.SGD", "keras.optimizers.SGD"),
        ("tensorflow.optimizers.Adam", "keras.optimizers.Adam"),
        ("keras.src.optimizers.adam.Adam", None),
        ("torch.optim.Adam", None),
    ],
)
def test_keras_names_are_one_spelling(qname, normal):
    assert keras_name(qname) == normal


def test_optimizer_classes_however_imported():
    t = probe(
        "import tensorflow as tf\nfrom keras.optimizers import SGD\n"
        "a = tf.keras.optimizers.Adam(0.1)\nb = SGD(0.1)\nc = make(0.1)\n"
    )
    calls = [find(t, m.Call(), text) for text in ("tf.keras.optimizers.Adam(0.1)", "SGD(0.1)",
                                                  "make(0.1)")]
    assert [optimizer_class(t, c) for c in calls] == ["Adam", "SGD", None]
    t = probe("import torch.optim as optim\nfrom torch.optim.lr_scheduler import StepLR\n"
              "o = optim.AdamW(p)\ns = StepLR(o, 1)\n")
    assert torch_optimizer_class(t, find(t, m.Call(), "optim.AdamW(p)")) == "AdamW"
    assert torch_optimizer_class(t, find(t, m.Call(), "StepLR(o, 1)")) is None


def test_fit_calls_are_found_on_compiled_models_only():
    t = probe(
        "import keras\nmodel = keras.Sequential([])\nmodel.compile(optimizer='adam', loss='mse')\n"
        "model.fit(x, y)\nscaler.fit(x)\n"
    )
    assert [code(t, c) for c in keras_fit_calls(t)] == ["model.fit(x, y)"]


def test_index_follows_plain_bindings():
    t = probe("lr = 0.1\nrate = lr\nopt = SGD(rate)\n")
    index = file_index(t)
    use = [n for n in m.findall(t.module, m.Name("rate"))][-1]
    assert isinstance(use, cst.Name)
    values = [code(t, v) for v in reaching_values(index, use)]
    assert values == ["rate", "lr", "0.1"]


def test_distributed_samplers_and_shuffle_in_kwargs():
    t = probe(
        "import torch\nfrom torch.utils.data.distributed import DistributedSampler\n"
        "s = DistributedSampler(ds)\nkw = dict(batch_size=8)\nkw2 = {'batch_size': 8, 'shuffle': True}\n"
        "a = f(s)\nb = f(kw2)\n"
    )
    assert is_distributed_sampler(t, [n for n in m.findall(t.module, m.Name("s"))][-1])
    assert not is_distributed_sampler(t, [n for n in m.findall(t.module, m.Name("kw"))][-1])
    found = kwargs_literal(t, [n for n in m.findall(t.module, m.Name("kw2"))][-1])
    assert found is not None and found[1] == 1  # the dict, and where "shuffle" is in it


def test_training_facts_find_tapes_their_steps_and_loops():
    t = probe(
        "import tensorflow as tf\n"
        "@tf.function\n"
        "def step(x, y):\n"
        "    with tf.GradientTape() as tape:\n"
        "        loss = loss_fn(y, model(x))\n"
        "    grads = tape.gradient(loss, model.trainable_variables)\n"
        "    opt.apply_gradients(zip(grads, model.trainable_variables))\n"
        "for x, y in ds:\n"
        "    step(x, y)\n"
    )
    facts = training_facts(t)
    assert [tape.name for tape in facts.tapes] == ["tape"]
    assert [code(t, a) for a in facts.tapes[0].applies] == [
        "opt.apply_gradients(zip(grads, model.trainable_variables))"
    ]
    assert [code(t, s.loops[0]).splitlines()[0] for s in facts.sites] == ["for x, y in ds:"]
    assert [code(t, call) for _, call in facts.sites[0].chain] == ["step(x, y)"]


def test_the_training_dataset_is_traced_back_to_its_source():
    t = probe(
        "import tensorflow as tf\n"
        "def make():\n"
        "    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10).batch(4)\n"
        "train = make()\n"
        "test = tf.data.Dataset.from_tensor_slices((tx, ty)).batch(4)\n"
        "for xb, yb in train:\n"
        "    with tf.GradientTape() as tape:\n"
        "        loss = f(xb, yb)\n"
        "    opt.apply_gradients(zip(tape.gradient(loss, v), v))\n"
        "for xb, yb in test:\n"
        "    print(xb)\n"
    )
    uses = training_dataset_uses(t)
    assert len(uses) == 1
    _, candidates = uses[0]
    trace = trace_dataset(t, file_index(t), candidates[0].expr)
    assert trace.source is not None
    assert code(t, trace.source) == "tf.data.Dataset.from_tensor_slices((x, y))"
    assert trace.source_name == "tensorflow.data.Dataset.from_tensor_slices"


def test_sets_epoch_finds_a_set_epoch_call_on_that_receiver_inside_that_loop():
    t = probe("""
        for epoch in range(3):
            loader.sampler.set_epoch(epoch)
            for x in loader:
                pass
        for epoch in range(3):
            other.set_epoch(epoch)
    """)
    first, second = m.findall(t.module, m.For(iter=m.Call(func=m.Name("range"))))
    assert sets_epoch(t, first, "loader.sampler")
    assert not sets_epoch(t, first, "other")  # not in this loop
    assert sets_epoch(t, second, "other")
    assert not sets_epoch(t, second, "loader.sampler")
