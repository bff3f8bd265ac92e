"""``program.sharding``: is the training data split between the ranks (or will it be)?"""

from __future__ import annotations

import libcst.matchers as m
from sdp_convert.program.sharding import input_optimisation, loader_problem, training_data

from .helpers import find, probe

TORCH_HEAD = """\
import torch
from torch.utils.data import DataLoader

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""


def kind(source: str) -> tuple[bool, str]:
    data = training_data(probe(source))
    return data.sharded, data.kind


def test_a_plain_training_loader_will_be_sharded():
    assert kind(
        TORCH_HEAD + "for x in DataLoader(ds, batch_size=8):\n"
        "    model(x).sum().backward()\n    opt.step()\n"
    ) == (True, "sharded")


def test_a_loader_with_its_own_sampler_cannot_be_sharded_and_says_why():
    source = (
        TORCH_HEAD + "loader = DataLoader(ds, sampler=RandomSampler(ds))\n"
        "for x in loader:\n    model(x).sum().backward()\n    opt.step()\n"
    )
    assert kind(source) == (False, "not sharded")
    t = probe(source)
    call = find(t, m.Call(func=m.Name("DataLoader")))
    assert "its own sampler" in (loader_problem(t, call) or "")


def test_a_loader_with_a_distributed_sampler_is_sharded_already():
    assert kind(
        TORCH_HEAD + "from torch.utils.data.distributed import DistributedSampler\n"
        "loader = DataLoader(ds, sampler=DistributedSampler(ds))\n"
        "for x in loader:\n    model(x).sum().backward()\n    opt.step()\n"
    ) == (True, "sharded")


def test_the_same_tensors_every_step_is_full_batch():
    assert kind(
        TORCH_HEAD + "for epoch in range(10):\n"
        "    model(features).sum().backward()\n    opt.step()\n"
    ) == (False, "full batch")


def test_batches_sliced_by_hand_are_not_full_batch():
    assert kind(
        TORCH_HEAD + "for i in range(0, len(x), 8):\n"
        "    model(x[i : i + 8]).sum().backward()\n    opt.step()\n"
    ) == (False, "not found")


def test_a_gym_environment_is_reinforcement_learning():
    assert kind(
        "import gymnasium as gym\n" + TORCH_HEAD + "env = gym.make('CartPole-v1')\n"
        "for episode in range(10):\n    model(x).sum().backward()\n    opt.step()\n"
    ) == (False, "environment")


TF_HEAD = """\
import tensorflow as tf

model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
opt = tf.keras.optimizers.SGD(0.1)
"""
TF_STEP = """\
    with tf.GradientTape() as tape:
        loss = model(x)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
"""


def test_a_tf_data_pipeline_will_be_sharded():
    assert kind(
        TF_HEAD + "for x in tf.data.Dataset.from_tensor_slices(data).batch(8):\n" + TF_STEP
    ) == (True, "sharded")


def test_from_tensors_without_unbatch_is_one_element_and_not_shardable():
    assert kind(
        TF_HEAD + "for x in tf.data.Dataset.from_tensors(data).batch(8):\n" + TF_STEP
    ) == (False, "not sharded")
    assert kind(
        TF_HEAD + "for x in tf.data.Dataset.from_tensors(data).unbatch().batch(8):\n" + TF_STEP
    ) == (True, "sharded")


def test_fit_on_arrays_or_lists_of_arrays_is_split_but_data_of_unknown_origin_is_not():
    fit = "model.compile(optimizer=opt, loss='mse')\nmodel.fit({x})\n"
    assert kind(TF_HEAD + fit.format(x="x_train, y_train")) == (True, "sharded")
    assert kind(TF_HEAD + fit.format(x="[x_a, x_b], y_train")) == (True, "sharded")  # sdp.shard
    assert kind(TF_HEAD + fit.format(x="make_batches()")) == (False, "not sharded")


def test_a_tf_loop_over_the_same_tensors_is_full_batch():
    assert kind(TF_HEAD + "for step in range(100):\n" + TF_STEP) == (False, "full batch")


def test_data_drawn_anew_every_step_is_not_full_batch():
    assert kind(
        TORCH_HEAD + "for step in range(10):\n"
        "    model(torch.randn(8, 4)).sum().backward()\n    opt.step()\n"
    ) == (False, "not found")


def test_an_input_optimised_on_no_data_is_not_data_parallel():
    style = (
        "import torch\nimage = torch.rand(1, 3, 8, 8).requires_grad_(True)\n"
        "opt = torch.optim.Adam([image], lr=0.02)\n"
        "for step in range(10):\n    cnn(image).sum().backward()\n    opt.step()\n"
    )
    t = probe(style)
    assert t.module.code_for_node(input_optimisation(t)) == "image"
    # Weights kept as plain tensors, trained on batches: data-parallel.
    batches = style.replace("for step in range(10):", "for x in batches:")
    assert input_optimisation(probe(batches)) is None
    # A model's parameters: not an input.
    model = style.replace("[image]", "cnn.parameters()")
    assert input_optimisation(probe(model)) is None
