"""Every note says what is true (issue 30, section 7): each note kind, shown where it is right and
absent where it would be wrong.

One table: a note's text (a fragment of it), a snippet where the note is true (it must be
reported), and a snippet where it would be false (it must not be). The whole pipeline converts
each snippet, as a user's run does.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sdp_convert.base import Options
from sdp_convert.engine import convert

SDP_CONVERT = str(Path(sys.executable).with_name("sdp-convert"))


def report(source: str) -> list[str]:
    result = convert(textwrap.dedent(source).encode(), Options(line_length=10_000))
    return [f"[{c.transform}] {c.message}" for c in result.changes]


TF_LOOP = """\
    for xb, yb in {data}:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""
TF_HEAD = """\
import numpy as np
import tensorflow as tf

model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.SGD(0.01)
"""


def tf_script(setup: str, data: str) -> str:
    return TF_HEAD + textwrap.dedent(setup) + textwrap.dedent(TF_LOOP.format(data=data))


ITERATOR = """\
class Batches:
    def __init__(self, x, y, size):
        self.x, self.y, self.size = x, y, size

    def __iter__(self):
        order = np.arange(len(self.x))
        np.random.shuffle(order)
        for start in range(0, {stop}, self.size):
            pick = order[start:start + self.size]
            yield self.x[pick], self.y[pick]


"""

TORCH_HEAD = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""
TORCH_STEP = """\
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""

WRAPPER = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


class Scheduled:
    def __init__(self, optimizer):
        self._optimizer = optimizer
        self.n = 0

    def step_and_update_lr(self):
        self.n += 1
{update}        self._optimizer.step()


model = torch.nn.Linear(4, 1)
opt = Scheduled(torch.optim.Adam(model.parameters()))
loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
for x, y in loader:
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step_and_update_lr()
"""
SETS_LR = """\
        for group in self._optimizer.param_groups:
            group["lr"] = 0.01 * min(1.0, self.n / 100)
"""

DRAWN = TF_HEAD + """\
from tqdm import tqdm

for step in tqdm(range(100)):
    xb = tf.random.normal((32, 8))
    yb = tf.reduce_sum(xb, axis=1)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb) - yb))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""

HOROVOD = """\
import io
import os
import tempfile

import horovod.torch as hvd
import torch

hvd.init()
model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size()),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
for x, y in torch.randn(8, 2, 4, 1):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
{save}
"""
TEMP_SAVE = """\
with tempfile.TemporaryDirectory() as tmp:
    torch.save(model.state_dict(), os.path.join(tmp, "m.pt"))
    model.load_state_dict(torch.load(os.path.join(tmp, "m.pt")))
"""
LOG_WRITE = TORCH_HEAD + """\
import os

loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)))
for x, y in loader:
""" + TORCH_STEP + """\
with open({name}, "w") as f:
    f.write("done")
"""

ENCODER = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Linear(4, 4)
        self.dec = torch.nn.Linear(4, 1)

    def encode(self, x):
        return self.enc(x)

    def forward(self, x):
        return self.dec(self.encode(x))


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
for x, y in loader:
    opt.zero_grad()
{encode}    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""

OWN_DISTRIBUTION = """\
import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--distributed", action="store_true")
parser.add_argument("--local_rank", type=int, default={local_rank})
args = parser.parse_args()
{gate}dist.init_process_group("gloo")
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in torch.randn(8, 2, 4, 1):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""

# pytorch/examples imagenet: the switch is worked out from two options after parsing.
DERIVED_DISTRIBUTION = """\
import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--world-size", default={world_size}, type=int)
parser.add_argument("--multiprocessing-distributed", action="store_true")
args = parser.parse_args()
args.distributed = args.world_size > 1 or args.multiprocessing_distributed
if args.distributed:
    dist.init_process_group("gloo")
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in torch.randn(8, 2, 4, 1):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""

RANDOM_BATCHES = """\
x = np.random.rand(640, 8).astype("float32")
y = x.sum(axis=1, keepdims=True)


def get_batch():
    idx = np.random.randint(0, 640, 32)
    return x[idx], y[idx]


for step in range(100):
    xb, yb = get_batch()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb) - yb))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""

#: Training data drawn by a helper (never split) with the rate set anew every step; ``{lr}`` is
#: that statement, or nothing.
KERAS_RATE_SET = TF_HEAD + RANDOM_BATCHES + "{lr}"
TORCH_RATE_SET = TORCH_HEAD + """\
def get_batch():
    return torch.randn(8, 4), torch.randn(8, 1)


for step in range(100):
    x, y = get_batch()
{lr}""" + TORCH_STEP

def drawn(script: str) -> str:
    """``script`` with its loader's batches drawn by a helper instead (data never split)."""
    return script.replace(
        "loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), "
        "batch_size=8)\nfor x, y in loader:\n",
        "def get_batch():\n    return torch.randn(8, 4), torch.randn(8, 1)\n\n\n"
        "for step in range(100):\n    x, y = get_batch()\n")


DRAWN_FULL_BATCH = TORCH_HEAD + """\
{seed}x, y = torch.randn(64, 4), torch.randn(64, 1)
for epoch in range(10):
""" + TORCH_STEP

#: (id, note fragment, a snippet where it is true, a snippet where it would be false)
# A script started by a launcher that passes --local_rank, with a rank handed to it as a flag
# (``init_method="env://"``), or one that starts its own processes and gives each its rank.
RANK_GIVEN = """\
import argparse

import torch
import torch.distributed as dist
{spawn_import}
parser = argparse.ArgumentParser()
parser.add_argument("--distributed", action="store_true")
parser.add_argument("--node_rank", type=int, default=-1)
{local_rank}

def run(gpu, args):
    if args.distributed:
        dist.init_process_group("gloo", init_method="env://", rank={rank})
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in torch.randn(8, 2, 4, 1):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


if __name__ == "__main__":
    args = parser.parse_args()
    {start}
"""
LAUNCHER_PASSES_LOCAL_RANK = RANK_GIVEN.format(
    spawn_import="", rank="args.node_rank", start="run(args.local_rank, args)",
    local_rank='parser.add_argument("--local_rank", type=int, default=0)')
SPAWNS_ITSELF = RANK_GIVEN.format(
    spawn_import="import torch.multiprocessing as mp\n", rank="args.node_rank * 2 + gpu",
    start="mp.spawn(run, nprocs=2, args=(args,))", local_rank="")
ARGS_ONLY = RANK_GIVEN.format(spawn_import="", rank="args.node_rank", start="run(0, args)",
                              local_rank="")

CASES = [
    (
        "class_of_the_script_not_a_pipeline",
        "Batches is a class of this script, not a tf.data pipeline",
        tf_script(ITERATOR.format(stop="len(self.x)"), "Batches(x, y, 32)"),
        tf_script(ITERATOR.format(stop="len(order)"), "Batches(x, y, 32)"),
    ),
    (
        "apply_shard_suggested_only_for_what_may_be_a_pipeline",
        ".apply(sdp.shard) right after the source",
        tf_script("", "load_data()"),
        tf_script(ITERATOR.format(stop="len(self.x)"), "Batches(x, y, 32)"),
    ),
    (
        "numpy_array_gets_sdp_shard_advice",
        "np.array_split() makes a NumPy array: give each worker its part with sdp.shard(...)",
        tf_script("batches = np.array_split(np.zeros((64, 8)), 8)\n", "batches"),
        tf_script(
            "batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)\n", "batches"
        ),
    ),
    (
        "tfds_shuffled_files_overlap",
        "tfds.load(shuffle_files=True) reads the files in a different order on each worker",
        tf_script(
            "import tensorflow_datasets as tfds\n"
            "ds = tfds.load('mnist', split='train', shuffle_files=True, as_supervised=True)\n"
            "ds = ds.batch(32)\n",
            "ds",
        ),
        tf_script(
            "import tensorflow_datasets as tfds\n"
            "ds = tfds.load('mnist', split='train', shuffle_files=True, as_supervised=True,\n"
            "               read_config=tfds.ReadConfig(shuffle_seed=7))\n"
            "ds = ds.batch(32)\n",
            "ds",
        ),
    ),
    (
        "tfds_shuffled_files_lr_not_scaled",
        "[scale_keras_learning_rate] SGD: learning rate 0.01 * sdp.size()",
        tf_script(
            "import tensorflow_datasets as tfds\n"
            "ds = tfds.load('mnist', split='train', shuffle_files=False, as_supervised=True)\n"
            "ds = ds.batch(32)\n",
            "ds",
        ),
        tf_script(
            "import tensorflow_datasets as tfds\n"
            "ds = tfds.load('mnist', split='train', shuffle_files=True, as_supervised=True)\n"
            "ds = ds.batch(32)\n",
            "ds",
        ),
    ),
    (
        "list_files_shuffled_overlap",
        "list_files shuffles the file names differently on each worker",
        tf_script(
            "files = tf.data.Dataset.list_files('data/*.tfrecord')\n"
            "ds = files.interleave(tf.data.TFRecordDataset).batch(32)\n",
            "ds",
        ),
        tf_script(
            "files = tf.data.Dataset.list_files('data/*.tfrecord', shuffle=False)\n"
            "ds = files.interleave(tf.data.TFRecordDataset).batch(32)\n",
            "ds",
        ),
    ),
    (
        "split_after_an_unseeded_shuffle",
        "the training and the evaluation data are split after this shuffle",
        tf_script(
            "ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(100).batch(8)\n"
            "test = ds.take(2)\n",
            "ds.skip(2)",
        ),
        tf_script(
            "ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(100).batch(8)\n"
            "for xb, yb in ds.take(1):\n"
            "    print(xb.shape)\n",
            "ds",
        ),
    ),
    (
        "preview_is_after_no_split",
        "after the split of the training data",
        tf_script(
            "ds = tf.data.Dataset.from_tensor_slices((x, y))\n"
            "train, test = ds.take(48), ds.skip(48)\n"
            "train = train.shuffle(48).batch(8)\n",
            "train",
        ),
        tf_script(
            "ds = tf.data.Dataset.from_tensor_slices((x, y))\n"
            "for xb, yb in ds.take(1):\n"
            "    print(xb.shape)\n"
            "ds = ds.shuffle(64).batch(8)\n",
            "ds",
        ),
    ),
    (
        "batches_drawn_inside_the_loop",
        "this loop reads no dataset: it draws its batches inside (tf.random.normal(...))",
        DRAWN,
        tf_script("ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)\n", "ds"),
    ),
    (
        "built_by_names_a_call_that_makes_the_data",
        "training data not sharded (built by",
        tf_script("", "load_data()"),
        DRAWN,
    ),
    (
        "no_dataloader_found_only_where_none_is_built",
        "no DataLoader feeding this training loop was found",
        TORCH_HEAD + "for x, y in batches_from_somewhere():\n" + TORCH_STEP,
        TORCH_HEAD
        + "loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8)\n"
        + "gen = (b for b in loader)\n"
        + "for step in range(8):\n    x, y = next(gen)\n" + TORCH_STEP,
    ),
    (
        "lr_written_into_param_groups",
        "learning rate written into param_groups: scale the new value by sdp.size()",
        TORCH_HEAD
        + "loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)))\n"
        + "for x, y in loader:\n"
        + "    for group in opt.param_groups:\n        group['lr'] = 0.05\n" + TORCH_STEP,
        TORCH_HEAD
        + "loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)))\n"
        + "for x, y in loader:\n" + TORCH_STEP,
    ),
    (
        "wrapper_sets_the_rate_every_step",
        "Adam: learning rate left as it is: Scheduled sets it anew in the parameter groups",
        WRAPPER.format(update=SETS_LR),
        WRAPPER.format(update=""),
    ),
    (
        "keras_rate_set_while_training_is_the_one_to_scale",
        "left as it is: no sharded training data was found; it is set anew while training "
        "(`optimizer.learning_rate.assign(0.01 * (1 - step / 100))`): scale the rate set there",
        KERAS_RATE_SET.format(lr="    optimizer.learning_rate.assign(0.01 * (1 - step / 100))\n"),
        KERAS_RATE_SET.format(lr=""),
    ),
    (
        "torch_rate_set_in_the_groups_is_the_one_to_scale",
        "it is set anew while training (`group[\"lr\"] = 0.1 * (1 - step / 100)`): scale the "
        "rate set there",
        TORCH_RATE_SET.format(lr="    for group in opt.param_groups:\n"
                                 "        group[\"lr\"] = 0.1 * (1 - step / 100)\n"),
        TORCH_RATE_SET.format(lr=""),
    ),
    (
        "unsplit_rate_set_by_a_wrapper_names_the_wrapper",
        "it is set anew while training (Scheduled writes it into the parameter groups",
        drawn(WRAPPER.format(update=SETS_LR)),
        drawn(WRAPPER.format(update="")),
    ),
    (
        "inner_rate_scaled_only_when_the_wrapper_leaves_it",
        "Adam: default learning rate 0.001 written out, * sdp.size()",
        WRAPPER.format(update=""),
        WRAPPER.format(update=SETS_LR),
    ),
    (
        "same_gradient_only_where_every_rank_has_the_same_tensors",
        "every rank computes the same gradient",
        DRAWN_FULL_BATCH.format(seed="torch.manual_seed(0)\n"),
        DRAWN_FULL_BATCH.format(seed=""),
    ),
    (
        "unseeded_full_batch_is_each_ranks_own_draw",
        "on tensors each rank draws for itself (torch.randn(64, 4), no seed)",
        DRAWN_FULL_BATCH.format(seed=""),
        DRAWN_FULL_BATCH.format(seed="torch.manual_seed(0)\n"),
    ),
    (
        "random_batches_drawn_in_a_helper_are_no_full_batch",
        "full-batch training, every worker sees the same data",
        TF_HEAD + RANDOM_BATCHES.replace("xb, yb = get_batch()", "xb, yb = x, y").replace(
            'np.random.rand(640, 8).astype("float32")', 'np.ones((640, 8), "float32")'),
        TF_HEAD + RANDOM_BATCHES,
    ),
    (
        "random_batches_drawn_in_a_helper_are_no_full_batch_torch",
        "full-batch training",
        TORCH_HEAD + "x, y = torch.ones(64, 4), torch.ones(64, 1)\n"
        + "for epoch in range(10):\n" + TORCH_STEP,
        TORCH_HEAD + "data_x, data_y = torch.ones(640, 4), torch.ones(640, 1)\n\n\n"
        "def get_batch():\n    idx = torch.randint(0, 640, (32,))\n"
        "    return data_x[idx], data_y[idx]\n\n\n"
        "for step in range(100):\n    x, y = get_batch()\n" + TORCH_STEP,
    ),
    (
        "full_batch_training",
        "full-batch training (the same tensors every step)",
        DRAWN_FULL_BATCH.format(seed=""),
        TORCH_HEAD
        + "loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)))\n"
        + "for x, y in loader:\n" + TORCH_STEP,
    ),
    (
        "batches_an_object_hands_out_are_no_full_batch",
        "full-batch training (the same tensors every step)",
        DRAWN_FULL_BATCH.format(seed=""),
        TORCH_HEAD + "from dataset import Batches\n\ntrain_dataset = Batches()\n"
        "while True:\n    x, y = train_dataset.get_batch()\n" + TORCH_STEP,
    ),
    (
        "an_optimizer_over_a_list_filled_from_the_wrapped_models_parameters",
        "could not tell which model this optimizer trains",
        "import torch\nfrom helpers import trainable\n\nmodel = torch.nn.Linear(4, 1)\n"
        "model = torch.nn.DataParallel(model).to('cuda')\n"
        "opt = torch.optim.SGD(trainable(), lr=0.1)\n"
        "for x, y in torch.utils.data.DataLoader(data):\n" + TORCH_STEP,
        "import torch\n\nmodel = torch.nn.Linear(4, 1)\n"
        "model = torch.nn.DataParallel(model).to('cuda')\nparams = []\n"
        "for p in filter(lambda p: p.requires_grad, model.parameters()):\n"
        "    params.append(p)\n"
        "opt = torch.optim.SGD(params, lr=0.1)\n"
        "for x, y in torch.utils.data.DataLoader(data):\n" + TORCH_STEP,
    ),
    (
        "no_optimizer_steps",
        "gradients are computed but no optimizer steps",
        "import torch\n\nmodel = torch.nn.Linear(4, 1)\n"
        "for x in torch.randn(8, 2, 4):\n    model(x).sum().backward()\n"
        "    print(model.weight.grad.norm())\n",
        WRAPPER.format(update=""),
    ),
    (
        "keras_weights_read_before_fit",
        "it reads model's weights before fit",
        TF_HEAD + "model.compile(optimizer=optimizer, loss='mse')\n"
        "initial = model.get_weights()\nmodel.fit(x, y, epochs=1)\n",
        TF_HEAD + "model.compile(optimizer=optimizer, loss='mse')\n"
        "model.fit(x, y, epochs=1)\nfinal = model.get_weights()\n",
    ),
    (
        "keras_lr_left_for_unsplit_data",
        "SGD: 0.01 left as it is",
        TF_HEAD + "model.compile(optimizer=optimizer, loss='mse')\n"
        "model.fit(tf.data.Dataset.list_files('d/*').map(load), epochs=1)\n",
        TF_HEAD + "model.compile(optimizer=optimizer, loss='mse')\n"
        "model.fit(x, y, epochs=1)\n",
    ),
    (
        "horovod_save_into_a_temporary_directory_stays_each_ranks_own",
        "torch.save(...) now runs on rank 0 only",
        HOROVOD.format(save='torch.save(model.state_dict(), "m.pt")'),
        HOROVOD.format(save=TEMP_SAVE),
    ),
    (
        "horovod_save_into_a_buffer_stays_each_ranks_own",
        "torch.save(...) now runs on rank 0 only",
        HOROVOD.format(save='torch.save(model.state_dict(), "m.pt")'),
        HOROVOD.format(save="buffer = io.BytesIO()\ntorch.save(model.state_dict(), buffer)"),
    ),
    (
        "a_file_named_after_the_process_is_each_ranks_own",
        'open(..., "w") runs on rank 0 only',
        LOG_WRITE.format(name='"log.txt"'),
        LOG_WRITE.format(name='f"log-{os.getpid()}.txt"'),
    ),
    (
        "a_model_method_under_no_grad_loses_no_gradient",
        "encode(...) runs the wrapped module around DDP's forward",
        ENCODER.format(encode="    z = model.encode(x).sum()\n"),
        ENCODER.format(encode="    with torch.no_grad():\n        z = model.encode(x)\n"),
    ),
    (
        "launch_as_before_only_where_the_distribution_is_always_on",
        "already distributed with torch.distributed; launch it as before",
        OWN_DISTRIBUTION.format(local_rank=-1, gate=""),
        OWN_DISTRIBUTION.format(local_rank=-1, gate="if args.distributed:\n    "),
    ),
    (
        "a_store_true_flag_in_front_is_named_with_its_launch",
        "but only when `args.distributed` (args.distributed is False by default: started as "
        "usual, it runs on one process); to run it on N processes, launch it with `torchrun "
        "--nproc_per_node=N SCRIPT.py --distributed ...`",
        OWN_DISTRIBUTION.format(local_rank=-1, gate="if args.distributed:\n    "),
        OWN_DISTRIBUTION.format(local_rank=-1, gate="if args.distributed or True:\n    "),
    ),
    (
        "a_flag_worked_out_from_other_flags_is_named_with_their_defaults",
        "(args.distributed is False by default, being `args.world_size > 1 or "
        "args.multiprocessing_distributed` with args.multiprocessing_distributed = False, "
        "args.world_size = -1: started as usual, it runs on one process)",
        DERIVED_DISTRIBUTION.format(world_size=-1),
        DERIVED_DISTRIBUTION.format(world_size=2),
    ),
    (
        "a_local_rank_flag_in_front_is_named_with_its_launch",
        "but only when `args.local_rank != -1` (args.local_rank is -1 by default",
        OWN_DISTRIBUTION.format(local_rank=-1, gate="if args.local_rank != -1:\n    "),
        OWN_DISTRIBUTION.format(local_rank=0, gate="if args.local_rank != -1:\n    "),
    ),
    (
        "its_own_launcher_only_where_it_starts_its_processes",
        "with args.distributed set, as its own launcher does",
        SPAWNS_ITSELF,
        LAUNCHER_PASSES_LOCAL_RANK,
    ),
    (
        "a_local_rank_option_names_the_launcher_that_passes_it",
        "launch it with `python -m torch.distributed.launch --nproc_per_node=N SCRIPT.py ...` "
        "with args.distributed set (it passes each process --local-rank since PyTorch 2.0: add "
        "that spelling to the parser's --local_rank; torchrun passes none, it sets LOCAL_RANK in "
        "the environment instead)",
        LAUNCHER_PASSES_LOCAL_RANK,
        ARGS_ONLY,
    ),
]


@pytest.mark.parametrize(("text", "right"), [(c[1], c[2]) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_the_note_is_there_where_it_is_true(text: str, right: str):
    notes = report(right)
    assert any(text in n for n in notes), "\n".join(notes)


@pytest.mark.parametrize(("text", "wrong"), [(c[1], c[3]) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_the_note_is_absent_where_it_would_be_false(text: str, wrong: str):
    notes = report(wrong)
    assert not any(text in n for n in notes), "\n".join(notes)


def test_no_note_is_reported_twice_at_one_place():
    for _, _, right, wrong in CASES:
        for source in (right, wrong):
            result = convert(textwrap.dedent(source).encode(), Options(line_length=10_000))
            seen = [(c.line, c.transform, c.message) for c in result.changes]
            assert len(seen) == len(set(seen)), seen


# -- issue 38: inserted code that runs, and notes that are true ------------------------------------


def convert_text(source: str) -> tuple[str, list[str]]:
    """The converted text and its report lines (``[transform] (manual) message``)."""
    result = convert(textwrap.dedent(source).encode(), Options(line_length=10_000))
    return result.output.decode(), [
        f"[{c.transform}] {'(manual) ' if c.manual else ''}{c.message}" for c in result.changes
    ]


BRANCH_LOADERS = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def main(ds="a"):
    data_a = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    data_b = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    if ds == "a":
        loader = DataLoader(data_a, batch_size=8, shuffle=True)
    elif ds == "b":
        loader = DataLoader(data_b, batch_size=8, shuffle=True)
    else:
        raise ValueError(ds)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()


main()
"""


def test_a_loader_chosen_in_branches_gets_set_epoch_on_the_loader_the_loop_reads():
    out, notes = convert_text(BRANCH_LOADERS)
    # Each branch's loader gets its own sampler; the epoch loop, after the branches, sets the
    # epoch of whichever the loop reads (the branch-local names are unbound on the other path).
    assert out.count("DistributedSampler(") == 2, out
    assert out.count(".set_epoch(epoch)") == 1 and "    loader.sampler.set_epoch(epoch)\n" in out
    assert "[shard_dataloader] call loader.sampler.set_epoch(epoch) at the start of each epoch" in (
        notes)
    assert not any("(manual)" in n for n in notes), notes
    namespace: dict[str, object] = {}
    exec(compile(out.replace("\nmain()\n", "\n"), "train.py", "exec"), namespace)
    for ds in ("a", "b"):  # one process (no launcher): both paths run to the end
        namespace["main"](ds)  # type: ignore[operator]


def test_inserted_code_reading_a_name_some_path_leaves_unbound_is_refused(monkeypatch):
    """Today's converter (before issue 38) read each branch's sampler in the epoch loop:
    UnboundLocalError at the first epoch. Such a conversion is not written, and says why."""
    import sdp_convert.program.sharding as analysis

    monkeypatch.setattr(analysis, "runs_whenever", lambda *args: True)  # that converter
    result = convert(BRANCH_LOADERS.encode(), Options(line_length=10_000))
    assert result.output == BRANCH_LOADERS.encode()
    notes = [c.message for c in result.changes]
    assert all(c.transform == "sdp_convert" and c.manual for c in result.changes), notes
    for name in ("loader_sampler", "loader_sampler_2"):
        assert any(f"not converted: the inserted code reads `{name}` in main() on a path that "
                   "does not bind it (UnboundLocalError when that path runs)" in n
                   for n in notes), notes


PREDICTIONS = """\
import json

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.tensorboard import SummaryWriter


def predict(model, loader):
    model.eval()
    with torch.no_grad():
        return torch.cat([model(x) for x, _ in loader])


def evaluate(model, loader):
    return float(predict(model, loader).mean())


data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
writer = SummaryWriter("runs")
for epoch in range(2):
    model.train()
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    writer.add_scalar("score", evaluate(model, loader), epoch)
torch.save(predict(model, loader), "preds.pt")
with open("preds.json", "w") as f:
    json.dump(predict(model, loader).tolist(), f)
torch.save(model.state_dict(), "model.pt")
"""


def test_a_write_that_runs_the_wrapped_model_through_helpers_stays_on_every_rank():
    """Issue 38: ``torch.save(predict(model, loader), p)`` went under ``if sdp.rank() == 0:``,
    and predict() runs the DDP model's forward (a collective): rank 0 waited alone."""
    out, notes = convert_text(PREDICTIONS)
    assert 'if sdp.rank() == 0:\n    torch.save(model.state_dict(), "model.pt")' in out
    for kept in ('\ntorch.save(predict(model, loader), "preds.pt")\n',
                 '\nwith open("preds.json", "w") as f:\n',
                 '\nwriter = SummaryWriter("runs")\n',
                 '\n    writer.add_scalar("score", evaluate(model, loader), epoch)\n'):
        assert kept in out, out
    assert ("[guard_rank0_writes] (manual) torch.save(predict(model, loader), \"preds.pt\") writes "
            "on every rank, but the statement also calls predict(...), which runs model(...), "
            "which every rank must run together: not moved onto rank 0") in "\n".join(notes)
    assert any("with open(\"preds.json\", \"w\") as f: writes on every rank, but the statement "
               "also calls predict(...)" in n for n in notes), notes
    # The writer is used where a guard cannot go: it stays (None on the other ranks would crash).
    assert any("SummaryWriter(...) writes on every rank, and its handle is used where a guard "
               "cannot go (`writer.add_scalar(\"score\", evaluate(model, loader), epoch)` also "
               "calls evaluate(...), which runs predict(...), which runs model(...)" in n
               for n in notes), notes
    # Where no helper runs the model, the write moves onto rank 0 as before.
    plain = PREDICTIONS.replace("save(predict(model, loader)", "save(torch.zeros(3)").replace(
        "dump(predict(model, loader)", "dump(torch.zeros(3)").replace(
        "\"score\", evaluate(model, loader)", "\"score\", 0.5")
    out, notes = convert_text(plain)
    assert 'if sdp.rank() == 0:\n    torch.save(torch.zeros(3), "preds.pt")' in out
    assert not any("every rank must run together" in n for n in notes), notes


def test_inserted_code_that_moves_a_collective_under_a_rank_test_is_refused(monkeypatch):
    """The converter before issue 38 followed no helper: ``predict(...)`` went onto rank 0 with
    the write. Such a conversion is not written, and says why."""
    import sdp_convert.program.ranks as ranks

    monkeypatch.setattr(ranks, "reaches_collective", lambda *args: None)  # that converter
    source = PREDICTIONS.replace("writer = SummaryWriter(\"runs\")\n", "").replace(
        "    writer.add_scalar(\"score\", evaluate(model, loader), epoch)\n", "")
    result = convert(source.encode(), Options(line_length=10_000))
    assert result.output == source.encode()
    notes = [c.message for c in result.changes]
    assert all(c.transform == "sdp_convert" and c.manual for c in result.changes), notes
    assert any("not converted: the conversion runs predict(...) only where `sdp.rank() == 0` "
               "holds, a condition that can differ between ranks, and it runs model(...), which "
               "every rank must run together" in n and "deadlock" in n for n in notes), notes


UTILS_DUMP = """\
import torch


def dump_predictions(model, loader, path):
    model.eval()
    preds = []
    with torch.no_grad():
        for x, _ in loader:
            preds.append(model(x))
    torch.save(torch.cat(preds), path)


def save_checkpoint(model, path):
    torch.save(model.state_dict(), path)
"""
TRAIN_DUMP = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

from utils import dump_predictions, save_checkpoint


def main():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=8)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        model.train()
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    dump_predictions(model, loader, "preds.pt")
    save_checkpoint(model, "model.pt")
    print("done", flush=True)


if __name__ == "__main__":
    main()
"""


def test_a_helper_of_another_module_that_runs_the_model_is_not_moved_onto_rank_0(
    tmp_path: Path,
):
    """Issue 38: ``dump_predictions(model, loader, p)`` (utils.py runs the model's forward, then
    saves) went under ``if sdp.rank() == 0:`` in train.py: rank 0 waited alone in DDP's forward.
    It stays on every rank; its write is noted where it is; the checkpoint helper still moves."""
    (tmp_path / "utils.py").write_text(UTILS_DUMP)
    (tmp_path / "train.py").write_text(TRAIN_DUMP)
    done = subprocess.run([SDP_CONVERT, "--diff", "."], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert "+        dump_predictions(model" not in done.stdout, done.stdout
    assert '+    if sdp.rank() == 0:\n+        save_checkpoint(model, "model.pt")' in done.stdout
    # Its write goes to rank 0 in the helper itself (the whole-program contract's repair).
    assert "+    if sdp.rank() == 0:\n+        torch.save(torch.cat(preds), path)" in done.stdout
    assert "utils.py:10:5: [guard_rank0_writes] torch.save(...) runs on rank 0 only" in (
        done.stderr)


EVAL_HELPER = """\
import torch


def validation(model, loader):
    total = 0.0
    for x, y in loader:
        total += float(torch.nn.functional.mse_loss(model(x), y))
    return total
"""
TRAIN_VALIDATES = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

from evaluate import validation


def main():
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    valid = DataLoader(data, batch_size=8)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        with open("log.txt", "a") as log:
            model.eval()
            with torch.no_grad():
                loss = validation(model, valid)
            model.train()
            log.write(f"{epoch} {loss}\\n")
            torch.save(model.state_dict(), "best.pt")


if __name__ == "__main__":
    main()
"""


def _project(tmp_path: Path, files: dict[str, str]) -> dict[str, object]:
    from sdp_convert.runner import Config, Job, run_jobs

    for name, text in files.items():
        (tmp_path / name).write_text(text)
    outcomes = run_jobs([Job(tmp_path / n, n, None) for n in files],
                        Config(Options(line_length=10_000), mode="check"), workers=1)
    return {o.path: o for o in outcomes}


def test_a_log_block_that_validates_through_another_modules_helper_guards_only_its_writes(
    tmp_path: Path,
):
    """deep-text-recognition: ``with open(log, "a") as log:`` around ``validation(model, ...)``
    of test.py went under ``if sdp.rank() == 0:`` whole: rank 0 ran the DDP forward alone. The
    opening is conditional, the writes are guarded, the validation runs on every rank."""
    outcomes = _project(tmp_path, {"evaluate.py": EVAL_HELPER, "train.py": TRAIN_VALIDATES})
    out = outcomes["train.py"].output.decode()
    assert ('with open("log.txt", "a") if sdp.rank() == 0 else contextlib.nullcontext() as log:'
            in out), out
    assert ("            with torch.no_grad():\n"
            "                loss = validation(model, valid)\n") in out
    assert ('            if sdp.rank() == 0:\n                log.write(f"{epoch} {loss}\\n")\n'
            '                torch.save(model.state_dict(), "best.pt")\n') in out, out
    assert not any(c.transform == "sdp_convert" for c in outcomes["train.py"].changes)


def test_inserted_code_that_moves_another_modules_validation_under_a_rank_test_is_refused(
    tmp_path: Path, monkeypatch,
):
    """The converter that followed no helper of another module guarded the whole block; the
    inserted-code check, told which functions of the other modules reach a collective, refuses
    such a conversion and says why."""
    import sdp_convert.program.ranks as ranks

    monkeypatch.setattr(ranks, "_helper_of_another_module", lambda *args: None)
    outcomes = _project(tmp_path, {"evaluate.py": EVAL_HELPER, "train.py": TRAIN_VALIDATES})
    result = outcomes["train.py"]
    notes = [c.message for c in result.changes]
    assert result.output is None or result.output.decode() == TRAIN_VALIDATES, notes
    assert any("not converted: the conversion runs validation(...) only where `sdp.rank() == 0` "
               "holds" in n and "model(...)" in n and "deadlock" in n for n in notes), notes


SUBCLASSED_STEP = """\
import numpy as np
import tensorflow as tf


class Base(tf.keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(x, training=True) - y))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


class Model(Base):
    def __init__(self):
        super().__init__()
        self.dense = tf.keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x)


x = np.random.RandomState(0).rand(64, 8).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = Model()
model.compile(optimizer=tf.keras.optimizers.SGD(0.01))
model.fit(x, y, batch_size=8, epochs=1)
"""


def test_a_model_inheriting_an_averaging_train_step_gets_no_distributed_optimizer():
    """Issue 38: ``Model(Base)``, ``Base.train_step`` wrapping its tape: compile's optimizer was
    wrapped in DistributedOptimizer too (gradients averaged twice), beside a note saying not to."""
    out, notes = convert_text(SUBCLASSED_STEP)
    assert "tape = sdp.DistributedGradientTape(tape)" in out
    assert "DistributedOptimizer" not in out, out
    assert ("[wrap_keras_fit] optimizer not wrapped: Model.train_step averages its gradients "
            "(DistributedGradientTape) already") in notes
    assert not any("(manual)" in n for n in notes), notes


def test_inserted_code_that_averages_one_model_twice_is_refused(monkeypatch):
    import sdp_convert.program.training as training

    monkeypatch.setattr(training, "_inherited", lambda *args: None)  # the converter before 38
    result = convert(SUBCLASSED_STEP.encode(), Options(line_length=10_000))
    assert result.output == SUBCLASSED_STEP.encode()
    notes = [c.message for c in result.changes]
    assert any("not converted: the conversion averages the gradients of `model` twice: its "
               "optimizer is a DistributedOptimizer and Base.train_step wraps its tape in "
               "DistributedGradientTape" in n for n in notes), notes


def test_the_same_data_note_is_not_repeated_at_each_loop():
    """Issue 38: two loops over ``load_data()`` got the same manual note twice (and two
    markers to delete for one fix)."""
    source = tf_script("", "load_data()") + textwrap.dedent(TF_LOOP.format(data="load_data()"))
    _, notes = convert_text(source)
    said = [n for n in notes if "training data not sharded (built by load_data())" in n]
    assert len(said) == 1, notes


SAMPLES_EVERY_N_STEPS = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
from torchvision.utils import save_image

model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8, shuffle=True)


def sample_images(done):
    with torch.no_grad():
        fake = model(torch.randn(5, 4))
    save_image(fake, "images/%d.png" % done)


for epoch in range(2):
    for i, (x,) in enumerate(loader):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        done = epoch * len(loader) + i
        if done % 10 == 0:
            sample_images(done)
"""


def test_a_step_count_made_from_a_sharded_loaders_length_is_the_same_on_every_rank():
    """Eco check (pytorch-gan cyclegan): the loader got ``sampler=DistributedSampler(...,
    rank=sdp.rank())``, so ``len(loader)`` and the step count made from it were taken for values
    that differ between ranks, and the whole file was refused ("a condition that can differ
    between ranks ... deadlock") for a helper that runs the model every 10 steps. A
    DistributedSampler has the same length on every rank: the sampling runs on every rank
    together, and only the image write goes to rank 0."""
    out, notes = convert_text(SAMPLES_EVERY_N_STEPS)
    assert not any("deadlock" in n for n in notes), notes
    assert "sampler=loader_sampler" in out and "DistributedDataParallel(model" in out, out
    assert "        if done % 10 == 0:\n            sample_images(done)\n" in out, out
    assert '    if sdp.rank() == 0:\n        save_image(fake, "images/%d.png" % done)' in out, out
    # A step count that really differs between ranks still keeps the model's forward off it.
    per_rank = SAMPLES_EVERY_N_STEPS.replace("done = epoch * len(loader) + i",
                                             "done = epoch * len(loader) + i + sdp.rank()")
    per_rank = "import sdp_runtime.torch as sdp\n" + per_rank
    out, notes = convert_text(per_rank)
    assert "        if done % 10 == 0:\n            sample_images(done)\n" in out, out


GENERATOR_FIT = """\
import numpy as np
import tensorflow as tf
from generator import BatchGenerator

model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
train_generator = BatchGenerator(batch_size=8)
model.fit(train_generator, steps_per_epoch=len(train_generator) * 2, epochs=3)
"""


def test_steps_are_not_divided_for_data_the_conversion_leaves_whole():
    """Eco check (keras-yolo3): ``steps_per_epoch`` went ``// sdp.size()`` for a generator the
    converter could not split (its own note says "training data not sharded"): each worker
    trained on the first 1/N of the same batches. Where the data is split (arrays given to
    ``fit``), the steps are divided as before."""
    out, notes = convert_text(GENERATOR_FIT)
    assert "steps_per_epoch=len(train_generator) * 2," in out, out
    assert not any("steps_per_epoch" in n for n in notes), notes
    assert any("training data not sharded" in n for n in notes), notes
    arrays = GENERATOR_FIT.replace("from generator import BatchGenerator\n", "").replace(
        "train_generator = BatchGenerator(batch_size=8)\n",
        "x, y = np.zeros((64, 4)), np.zeros((64, 1))\n").replace(
        "model.fit(train_generator, steps_per_epoch=len(train_generator) * 2, epochs=3)",
        "model.fit(x, y, batch_size=8, steps_per_epoch=8, epochs=3)")
    out, notes = convert_text(arrays)
    assert "sdp.shard(x)" in out and "steps_per_epoch=8 // sdp.size()" in out, out


TWO_EXPERIMENTS = """\
import numpy as np
import tensorflow as tf
from generator import BatchGenerator

x, y = np.zeros((64, 4)), np.zeros((64, 1))
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="rmsprop", loss="mse")
model.fit(x, y, batch_size=8, epochs=3)

model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
model.fit(BatchGenerator(batch_size=8), epochs=3)
"""


def test_each_compile_is_scaled_by_the_data_of_its_own_fits():
    """Eco check (a Keras book's notebook of several experiments): the first experiment's
    arrays were split by the conversion, yet its rate was left "as it is: the training data is
    not split" (true only of a later experiment's generator), next to the edit that split
    them. Each compile is decided by its own fits."""
    out, notes = convert_text(TWO_EXPERIMENTS)
    assert "sdp.shard(x), sdp.shard(y)" in out, out
    assert "RMSprop(learning_rate=0.001 * sdp.size())" in out, out
    assert "SGD(0.1)" in out and "0.1 * sdp.size()" not in out, out
    unscaled = [n for n in notes if "left as it is" in n]
    assert len(unscaled) == 1 and "SGD: 0.1 left as it is" in unscaled[0], notes



BUILD_VOCAB = """\
import pickle


class Vocabulary:
    def __init__(self):
        self.words = {}


def main(path):
    vocab = Vocabulary()
    with open(path, "wb") as f:
        pickle.dump(vocab, f)


if __name__ == "__main__":
    main("vocab.pkl")
"""
TRAIN_WITH_VOCAB = """\
import pickle

import torch

from build_vocab import Vocabulary


def main():
    with open("vocab.pkl", "rb") as f:
        vocab = pickle.load(f)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4)),
                                         batch_size=8)
    for (x,) in loader:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


if __name__ == "__main__":
    main()
"""


def test_a_preprocessing_script_the_training_only_imports_a_class_from_gets_no_runtime_call(
    tmp_path: Path,
):
    """yunjey-captioning: train.py imports ``Vocabulary`` from build_vocab.py, whose write runs
    only when build_vocab.py is run as a script (its ``__main__`` block calls ``main()``), where
    nothing initialises the runtime: ``if sdp.rank() == 0:`` there made ``python build_vocab.py``
    die with NotInitializedError. The write does not run in the training program: left alone."""
    from sdp_convert.runner import Config, Job, run_jobs

    (tmp_path / "build_vocab.py").write_text(BUILD_VOCAB)
    (tmp_path / "train.py").write_text(TRAIN_WITH_VOCAB)
    jobs = [Job(tmp_path / p, p, tmp_path / p) for p in ("build_vocab.py", "train.py")]
    outcomes = run_jobs(jobs, Config(Options()), workers=1)
    assert (tmp_path / "build_vocab.py").read_text() == BUILD_VOCAB
    assert "sdp.init()" in (tmp_path / "train.py").read_text()
    assert not [c for o in outcomes if o.path == "build_vocab.py" for c in o.changes]


SR_DATA = """\
import tarfile
from os import makedirs, remove
from os.path import basename, exists, join

import torch
from six.moves import urllib


def download_bsd300(dest="dataset"):
    output_image_dir = join(dest, "BSDS300/images")

    if not exists(output_image_dir):
        makedirs(dest)
        url = "http://www2.eecs.berkeley.edu/Research/Projects/CS/vision/bsds/BSDS300-images.tgz"
        data = urllib.request.urlopen(url)

        file_path = join(dest, basename(url))
        with open(file_path, 'wb') as f:
            f.write(data.read())

        with tarfile.open(file_path) as tar:
            for item in tar:
                tar.extract(item, dest)

        remove(file_path)

    return output_image_dir


def get_training_set():
    root = download_bsd300()
    return torch.utils.data.TensorDataset(torch.randn(32, 4))
"""
SR_MAIN = """\
import torch

from data import get_training_set

train_set = get_training_set()
loader = torch.utils.data.DataLoader(train_set, batch_size=8, shuffle=True)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for (x,) in loader:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
"""


def test_a_download_extracted_then_deleted_runs_whole_on_rank_0_then_every_rank_waits(
    tmp_path: Path,
):
    """pytorch-examples super_resolution: only the write of the .tgz went under rank 0, while
    every rank opened the URL, unpacked the archive and deleted it, with no barrier. The whole
    ``if not exists(...):`` (download, extraction, deletion) runs on rank 0, then a barrier."""
    from sdp_convert.runner import Config, Job, run_jobs

    (tmp_path / "data.py").write_text(SR_DATA)
    (tmp_path / "main.py").write_text(SR_MAIN)
    jobs = [Job(tmp_path / p, p, tmp_path / p) for p in ("data.py", "main.py")]
    run_jobs(jobs, Config(Options()), workers=1)
    data = (tmp_path / "data.py").read_text()
    assert "    if sdp.rank() == 0:\n        if not exists(output_image_dir):\n" in data, data
    assert "            remove(file_path)\n    sdp.barrier()\n" in data, data
    assert data.count("sdp.rank() == 0") == 1, data


MINI_TRAINER = """\
from collections import defaultdict

import torch


class Trainer:
    def __init__(self, model, dataset):
        self.model = model
        self.dataset = dataset
        self.callbacks = defaultdict(list)
        self.iter_num = 0

    def set_callback(self, onevent, callback):
        self.callbacks[onevent] = [callback]

    def trigger_callbacks(self, onevent):
        for callback in self.callbacks.get(onevent, []):
            callback(self)

    def run(self):
        opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(self.dataset, batch_size=8, shuffle=True)
        for (x,) in loader:
            opt.zero_grad()
            self.model(x).pow(2).mean().backward()
            opt.step()
            self.iter_num += 1
            self.trigger_callbacks("on_batch_end")
"""
MINI_ENTRY = """\
import torch

from trainer import Trainer

if __name__ == "__main__":
    model = torch.nn.Linear(4, 1)
    trainer = Trainer(model, torch.utils.data.TensorDataset(torch.randn(32, 4)))

    def batch_end_callback(trainer):
        if trainer.iter_num % 2 == 0:
            print("saving model")
            torch.save(model.state_dict(), "model.pt")

    trainer.set_callback("on_batch_end", batch_end_callback)
    trainer.run()
"""


def test_a_write_in_a_callback_the_training_runs_goes_to_rank_0(tmp_path: Path):
    """minGPT's chargpt.py: ``torch.save`` in ``batch_end_callback``, which
    ``trainer.set_callback('on_batch_end', ...)`` hands to the Trainer's loop, ran on every rank
    with no note (a function nothing calls by name was taken for one that never runs)."""
    from sdp_convert.runner import Config, Job, run_jobs

    (tmp_path / "trainer.py").write_text(MINI_TRAINER)
    (tmp_path / "chargpt.py").write_text(MINI_ENTRY)
    jobs = [Job(tmp_path / p, p, tmp_path / p) for p in ("trainer.py", "chargpt.py")]
    run_jobs(jobs, Config(Options()), workers=1)
    entry = (tmp_path / "chargpt.py").read_text()
    guarded = (
        "            if sdp.rank() == 0:\n"
        '                torch.save(model.state_dict(), "model.pt")'
    )
    assert guarded in entry, entry


YOLO_CALLBACKS = """\
from keras.callbacks import ModelCheckpoint, TensorBoard


class CustomTensorBoard(TensorBoard):
    def on_batch_end(self, batch, logs=None):
        super().on_batch_end(batch, logs)


class CustomModelCheckpoint(ModelCheckpoint):
    def __init__(self, model_to_save, **kwargs):
        super().__init__(**kwargs)
        self.model_to_save = model_to_save
"""
YOLO_TRAIN = """\
import numpy as np
import tensorflow as tf
from keras.callbacks import EarlyStopping

from callbacks import CustomModelCheckpoint, CustomTensorBoard


def create_callbacks(saved_weights_name, tensorboard_logs, model_to_save):
    early_stop = EarlyStopping(monitor="loss", patience=7)
    checkpoint = CustomModelCheckpoint(model_to_save=model_to_save, filepath=saved_weights_name)
    tensorboard = CustomTensorBoard(log_dir=tensorboard_logs)
    return [early_stop, checkpoint, tensorboard]


def main():
    model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
    callbacks = create_callbacks("best.h5", "logs", model)
    x = np.zeros((64, 8), "float32")
    model.fit(x, x[:, :1], epochs=2, callbacks=callbacks)


if __name__ == "__main__":
    main()
"""


def test_writing_callbacks_a_project_function_builds_for_fit_run_on_rank_0(tmp_path: Path):
    """keras-yolo3: ``create_callbacks()`` returns ``CustomModelCheckpoint``/
    ``CustomTensorBoard`` (subclasses of Keras' writing callbacks, in callbacks.py), handed to
    ``fit``: they wrote on every rank with no note."""
    from sdp_convert.runner import Config, Job, run_jobs

    (tmp_path / "callbacks.py").write_text(YOLO_CALLBACKS)
    (tmp_path / "train.py").write_text(YOLO_TRAIN)
    jobs = [Job(tmp_path / p, p, tmp_path / p) for p in ("callbacks.py", "train.py")]
    run_jobs(jobs, Config(Options()), workers=1)
    train = (tmp_path / "train.py").read_text()
    assert (
        "    return [early_stop] + ([checkpoint, tensorboard] if sdp.rank() == 0 else [])\n"
        in train
    ), train


LEAF_ENGINE = '''\
import torch
from tqdm import tqdm


def Train(dataset, dataloader, model, optimizer, device):
    model.train()
    num_batches = int(len(dataset) / dataloader.batch_size)
    tk0 = tqdm(dataloader, total=num_batches)
    for step, batch in enumerate(tk0):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(batch[0].to(device)), batch[1].to(device))
        loss.backward()
        optimizer.step()
    tk0.close()
'''
LEAF_TRAIN = '''\
import torch
import engine


def run(fold):
    device = torch.device("cpu")
    train_ds = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 2))
    train_dl = torch.utils.data.DataLoader(train_ds, 16)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=3e-3)
    for epoch in range(3):
        engine.Train(train_ds, train_dl, model, optimizer, device)


if __name__ == "__main__":
    run(0)
'''


def test_a_loader_handed_to_another_modules_loop_through_a_progress_bar_is_split_where_built(
    tmp_path: Path,
):
    """leaf-disease-kfold: ``tk0 = tqdm(dataloader, total=n)`` over a parameter, the loader built
    in the entry. Once converted, ``disable=sdp.rank() != 0`` on the bar was read as a split by
    rank: the contract found the data split, nothing was repaired, and the loop kept a false "no
    DataLoader feeding this training loop was found" while the learning rate was scaled."""
    from sdp_convert.runner import Config, Job, run_jobs

    (tmp_path / "engine.py").write_text(LEAF_ENGINE)
    (tmp_path / "train.py").write_text(LEAF_TRAIN)
    jobs = [Job(tmp_path / p, p, tmp_path / p) for p in ("engine.py", "train.py")]
    run_jobs(jobs, Config(Options()), workers=1)
    entry = (tmp_path / "train.py").read_text()
    assert "sampler=train_dl_sampler" in entry and "DistributedSampler(" in entry, entry
    assert "lr=3e-3 * sdp.size()" in entry
    loop = (tmp_path / "engine.py").read_text()
    assert "sdp-convert: manual" not in loop, loop


SCRIPT_HELPER = '''\
import torch


def evaluate(model, path):
    with open(path, "w") as f:
        f.write(str(sum(p.sum().item() for p in model.parameters())))


if __name__ == "__main__":
    evaluate(torch.nn.Linear(4, 1), "eval.txt")
'''
TINY_TRAINING = '''\
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), 2)
for (x,) in loader:
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
'''
SCRIPT_TRAIN = (
    "import torch\n\nfrom evaluate import evaluate\n\n" + TINY_TRAINING
    + 'evaluate(model, "eval.txt")\n'
)


def test_a_helper_with_its_own_main_block_initialises_there_when_run_alone(tmp_path: Path):
    """yolov3-tf2 (pythonlessons): evaluate_mAP.py, whose writes the training runs, got
    `if sdp.rank() == 0:` guards and no init: `python evaluate_mAP.py` stopped with
    NotInitializedError. Its `__main__` block now initialises first; imported, it does not."""
    import subprocess
    import sys

    from sdp_convert.runner import Config, Job, run_jobs

    (tmp_path / "evaluate.py").write_text(SCRIPT_HELPER)
    (tmp_path / "train.py").write_text(SCRIPT_TRAIN)
    jobs = [Job(tmp_path / p, p, tmp_path / p) for p in ("evaluate.py", "train.py")]
    run_jobs(jobs, Config(Options()), workers=1)
    helper = (tmp_path / "evaluate.py").read_text()
    assert "if sdp.rank() == 0:" in helper, helper
    assert 'if __name__ == "__main__":\n    sdp.init()\n    evaluate(' in helper, helper
    assert helper.count("sdp.init()") == 1
    done = subprocess.run([sys.executable, "evaluate.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "eval.txt").exists()


VOC_DATA = '''\
import os
import tarfile

import torch
from torchvision.datasets.utils import download_url


def download_extract(url, root, filename, md5):
    download_url(url, root, filename, md5)
    with tarfile.open(os.path.join(root, filename), "r") as tar:
        tar.extractall(path=root)


class VOCSegmentation(torch.utils.data.Dataset):
    def __init__(self, root, download=False):
        if download:
            download_extract("http://x.org/voc.tar", root, "voc.tar", None)
        self.x = torch.randn(32, 4)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i]
'''
VOC_MAIN = '''\
import torch

from voc import VOCSegmentation

train_set = VOCSegmentation("data", download=True)
loader = torch.utils.data.DataLoader(train_set, batch_size=8, shuffle=True)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x in loader:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
'''


def test_a_data_modules_download_url_runs_with_its_extraction_on_rank_0(tmp_path: Path):
    """deeplabv3plus datasets/voc.py: the extraction went to rank 0, but torchvision's
    ``download_url`` before it ran on every rank: on a first run each rank wrote the same tar
    while rank 0 checked and unpacked it, unnoted."""
    from sdp_convert.runner import Config, Job, run_jobs

    (tmp_path / "voc.py").write_text(VOC_DATA)
    (tmp_path / "main.py").write_text(VOC_MAIN)
    jobs = [Job(tmp_path / p, p, tmp_path / p) for p in ("voc.py", "main.py")]
    run_jobs(jobs, Config(Options()), workers=1)
    data = (tmp_path / "voc.py").read_text()
    assert ("    if sdp.rank() == 0:\n        download_url(url, root, filename, md5)\n"
            "        with tarfile.open") in data, data
    assert "            tar.extractall(path=root)\n    sdp.barrier()\n" in data, data


REUSED_MODEL_NAME = """\
import sdp_runtime.tensorflow as sdp
import tensorflow as tf


class CustomModel(tf.keras.Model):
    def train_step(self, data):
        with tf.GradientTape() as tape:
            loss = self.compiled_loss(data[1], self(data[0]))
        tape = sdp.DistributedGradientTape(tape)
        grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        return {{}}


model = {first}
model.compile(optimizer={first_opt})
model = {second}
model.compile(optimizer={second_opt})
"""


@pytest.mark.parametrize(("first", "second", "twice"), [
    ("CustomModel(inputs, outputs)", "tf.keras.Sequential([])", False),
    ("tf.keras.Sequential([])", "CustomModel(inputs, outputs)", True),
], ids=["subclass_then_plain", "plain_then_subclass"])
def test_averaged_twice_reads_the_model_a_reused_name_holds_at_each_compile(first, second, twice):
    """dlwp-ch7 notebook: `model` is a plain Sequential in eight cells and a CustomModel (its
    train_step wraps the tape) in two; every DistributedOptimizer compile of a plain one was
    refused as 'averaged twice'."""
    from sdp_convert import inserted

    plain = "tf.keras.optimizers.SGD(0.1)"
    wrapped = f"sdp.keras.DistributedOptimizer({plain})"
    custom_first = first.startswith("Custom")
    source = REUSED_MODEL_NAME.format(first=first, second=second, first_opt=plain,
                                      second_opt=plain)
    output = REUSED_MODEL_NAME.format(
        first=first, second=second, first_opt=plain if custom_first else wrapped,
        second_opt=wrapped)
    found = inserted.problems(source.encode(), output.encode())
    assert bool([w for _, w in found if "twice" in w]) is twice, found


SAVE_HELPER = '''\
import torch


def save(obj, path):
    torch.save(obj, path)
'''
SAVE_TRAIN = (
    "import torch\n\nimport saving\n\n" + TINY_TRAINING
    + 'saving.save(model.state_dict(), "model.pt")\n'
)
SAVE_EVAL = '''\
import torch

import saving

model = torch.nn.Linear(4, 1)
saving.save(model(torch.ones(2, 4)), "predictions.pt")
'''


def test_an_evaluation_script_whose_writes_are_guarded_initialises_itself(tmp_path: Path):
    """cyclegan-tf2's test.py: a script of its own, imported by nothing, whose calls of the
    project's image writer the contract put under `if sdp.rank() == 0:` with no init:
    `python test.py` would stop with NotInitializedError. It initialises after its imports."""
    import subprocess
    import sys

    from sdp_convert.runner import Config, Job, run_jobs

    for name, text in (("saving.py", SAVE_HELPER), ("train.py", SAVE_TRAIN),
                       ("evaluate.py", SAVE_EVAL)):
        (tmp_path / name).write_text(text)
    jobs = [Job(tmp_path / p, p, tmp_path / p) for p in ("saving.py", "train.py", "evaluate.py")]
    run_jobs(jobs, Config(Options()), workers=1)
    script = (tmp_path / "evaluate.py").read_text()
    if "sdp.rank()" in script:
        assert "\nsdp.init()\n" in script, script
    done = subprocess.run([sys.executable, "evaluate.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "predictions.pt").exists()
