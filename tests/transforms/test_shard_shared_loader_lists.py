"""shard_shared_loader for a project's own batch-iterator class (``__next__`` over ``self.samples``,
read from a file and shuffled without a seed) gets its list split by rank before the shuffle,
behind a constructor flag that only the training construction sets; a class that draws batches
from DataLoaders it builds gets their samplers (``shard_dataloader``) and a new epoch per pass."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DATA = '''\
import numpy as np
import tensorflow as tf


class Batches(object):
    """Batches of lines of a file."""

    def __init__(self, split, batch_size=2):
        self.path = "train.txt" if split == "train" else "test.txt"
        self.batch_size = batch_size
        self.samples = self.read_samples()
        self.count = int(np.ceil(len(self.samples) / self.batch_size))
        self.step = 0

    def read_samples(self):
        with open(self.path) as f:
            lines = [line.strip() for line in f.readlines() if line.strip()]
        np.random.shuffle(lines)
        samples = []
        for line in lines:
            samples.append(float(line))
        return samples

    def __iter__(self):
        return self

    def __next__(self):
        if self.step < self.count:
            start = self.step * self.batch_size
            self.step += 1
            return tf.constant([self.samples[i % len(self.samples)]
                                for i in range(start, start + self.batch_size)])
        self.step = 0
        raise StopIteration

    def __len__(self):
        return self.count
'''

TRAIN = '''\
import tensorflow as tf
from loaders.batches import Batches

model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.SGD(0.1)
trainset = Batches("train")
testset = Batches("test")
for epoch in range(2):
    for x in trainset:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x[:, None]) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    for x in testset:
        print(float(tf.reduce_mean(model(x[:, None]))))
'''


def _convert(tmp_path: Path, data: str = DATA) -> tuple[str, str, dict]:
    # ``loaders/`` has no __init__.py: a namespace package to train.py next to it.
    (tmp_path / "loaders").mkdir()
    (tmp_path / "loaders" / "batches.py").write_text(data)
    (tmp_path / "train.py").write_text(TRAIN)
    done = subprocess.run(
        [sys.executable, "-m", "sdp_convert", ".", "--report", "r.json", "--report-format",
         "json", "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    return ((tmp_path / "loaders" / "batches.py").read_text(),
            (tmp_path / "train.py").read_text(), report)


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, str, str, dict]:
    tree = tmp_path_factory.mktemp("project")
    return (tree, *_convert(tree))


def _data_part(report: dict) -> dict:
    [entry] = [f for f in report["files"] if f["path"] == "train.py"]
    return entry["contract"]["parts"]["data"]


def test_the_training_instance_splits_its_list_before_the_unseeded_shuffle(converted):
    _, data, train, report = converted
    assert "    def __init__(self, split, batch_size=2, shard=False):\n" \
           "        self.shard = shard\n" in data
    assert ("            lines = [line.strip() for line in f.readlines() if line.strip()]\n"
            "        if self.shard:\n"
            "            lines = sdp.shard(lines)\n") in data
    assert data.index("sdp.shard(lines)") < data.index("np.random.shuffle(lines)")
    assert "import sdp_runtime.tensorflow as sdp\n" in data and "sdp.init()" not in data
    assert 'trainset = Batches("train", shard=True)\n' in train
    assert 'testset = Batches("test")\n' in train  # the evaluation data stays whole
    assert _data_part(report) == {"state": "holds", "detail": "training data split",
                                  "noted": False}
    notes = [c["message"] for c in report["changes"] if c["manual"]]
    assert not any("not sharded" in n or "not split" in n for n in notes), notes
    assert "SGD(0.1 * sdp.size())" in train


def test_the_split_list_gives_every_rank_its_own_samples_and_the_same_batch_count(
        converted, monkeypatch):
    """The converted class, run as rank 0 and rank 1 of 2 through the runtime's ``sdp.shard``:
    disjoint parts of the file's 5 lines (3 each, the first line repeated to fill), the same
    number of batches on both; the test instance reads all 5."""
    from sdp_runtime import _comm

    tmp_path, data, _, _ = converted
    (tmp_path / "train.txt").write_text("1\n2\n3\n4\n5\n")
    (tmp_path / "test.txt").write_text("1\n2\n3\n4\n5\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_comm, "is_initialized", lambda: True)
    monkeypatch.setattr(_comm, "size", lambda: 2)
    parts, counts = [], []
    for rank in (0, 1):
        monkeypatch.setattr(_comm, "rank", lambda rank=rank: rank)
        scope: dict = {"__name__": "batches"}
        exec(compile(data, "batches.py", "exec"), scope)
        train = scope["Batches"]("train", shard=True)
        parts.append(sorted(train.samples))
        counts.append(len(train))
        assert sorted(scope["Batches"]("test").samples) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert parts == [[1.0, 3.0, 5.0], [1.0, 2.0, 4.0]]
    assert counts == [2, 2]


def test_a_list_from_an_unsorted_listing_is_not_split(tmp_path: Path):
    """``os.listdir`` order is not promised the same on every rank: no split, the data stays
    'unknown' with its note (and the evaluation instance is left alone too)."""
    unsorted = DATA.replace("import numpy as np\n", "import os\nimport numpy as np\n").replace(
        "        with open(self.path) as f:\n"
        "            lines = [line.strip() for line in f.readlines() if line.strip()]\n",
        "        lines = [name for name in os.listdir(self.path)]\n")
    data, train, report = _convert(tmp_path, unsorted)
    assert "shard" not in data and "shard=True" not in train
    assert _data_part(report)["state"] == "unknown"


def test_the_shape_is_recognised_in_one_file():
    import libcst as cst
    from sdp_convert.program.model import FileModel
    from sdp_convert.program.sample_lists import list_split

    fm = FileModel.from_source(textwrap.dedent(DATA))
    [cls] = [s for s in fm.module.body if isinstance(s, cst.ClassDef)]
    split = list_split(fm, cls)
    assert split is not None
    assert (split.name, split.attr, split.flag) == ("lines", "samples", "shard")
    assert fm.module.code_for_node(split.before).strip() == "np.random.shuffle(lines)"


BALANCED = '''\
import torch
from torch.utils.data import DataLoader


class BalancedBatches(object):
    """Batches drawn from several sources at once."""

    def __init__(self, sources, batch_size):
        self.loaders = []
        self.iterators = []
        for source in sources:
            loader = DataLoader(source, batch_size=batch_size, shuffle=True)
            self.loaders.append(loader)
            self.iterators.append(iter(loader))

    def get_batch(self):
        parts = []
        for i, iterator in enumerate(self.iterators):
            try:
                (x,) = next(iterator)
            except StopIteration:
                self.iterators[i] = iter(self.loaders[i])
                (x,) = next(self.iterators[i])
            parts.append(x)
        return torch.cat(parts, 0)
'''

LOOP = '''\
import torch
from torch.utils.data import DataLoader, TensorDataset
from balanced import BalancedBatches

model = torch.nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
sources = [TensorDataset(torch.arange(8.0)[:, None]), TensorDataset(torch.arange(4.0)[:, None])]
train_data = BalancedBatches(sources, 2)
valid_loader = DataLoader(TensorDataset(torch.arange(4.0)[:, None]), batch_size=2)
step = 0
while True:
    x = train_data.get_batch()
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    if step % 2 == 0:
        with torch.no_grad():
            print(sum(float(model(v).sum()) for (v,) in valid_loader))
    if step == 6:
        break
'''


def test_loaders_a_class_draws_from_get_a_sampler_where_built_and_a_new_epoch_per_pass(
        tmp_path: Path):
    """Shape 3 of issue 37: DataLoaders built in a class of one module, their batches pulled
    with next() by a method the training loop of another module calls (``get_batch()``), each
    iterator restarted where it runs out. The sampler goes where the loaders are built, the
    sampler's own epoch count goes up at each restart, the validation loader stays whole, and
    the rate is scaled (the data is split)."""
    (tmp_path / "balanced.py").write_text(BALANCED)
    (tmp_path / "train.py").write_text(LOOP)
    done = subprocess.run(
        [sys.executable, "-m", "sdp_convert", ".", "--report", "r.json", "--report-format",
         "json", "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    balanced = (tmp_path / "balanced.py").read_text()
    train = (tmp_path / "train.py").read_text()
    assert ("            loader_sampler = torch.utils.data.distributed.DistributedSampler(\n"
            "                source, num_replicas=sdp.size(), rank=sdp.rank(), shuffle=True\n"
            "            )\n"
            "            loader = DataLoader(source, batch_size=batch_size, "
            "sampler=loader_sampler)\n") in balanced
    assert ("            except StopIteration:\n"
            "                self.loaders[i].sampler.set_epoch(self.loaders[i].sampler.epoch + 1)\n"
            "                self.iterators[i] = iter(self.loaders[i])\n") in balanced
    assert ("valid_loader = DataLoader(TensorDataset(torch.arange(4.0)[:, None]), "
            "batch_size=2)\n") in train
    assert "lr=0.1 * sdp.size())" in train
    report = json.loads((tmp_path / "r.json").read_text())
    assert _data_part(report)["state"] == "holds"
    assert not [c for c in report["changes"] if c["manual"]]

    # The converted class as rank 0 and rank 1 of 2: disjoint halves of each source, the same
    # number of batches per pass on both, and a new order after each restart.
    import torch

    sdp = type("sdp", (), {"size": staticmethod(lambda: 2)})
    halves, orders = [], []
    for rank in (0, 1):
        sdp.rank = staticmethod(lambda rank=rank: rank)
        source = torch.utils.data.TensorDataset(torch.arange(16.0)[:, None])
        scope: dict = {"sdp": sdp}
        exec(compile(balanced.replace("import sdp_runtime.torch as sdp\n", ""), "b.py", "exec"),
             scope)
        batches = scope["BalancedBatches"]([source], 2)
        seen = [batches.get_batch().flatten().tolist() for _ in range(8)]
        halves.append(sorted(v for b in seen[:4] for v in b))
        orders.append((seen[:4], seen[4:]))
    assert sorted(halves[0] + halves[1]) == [float(v) for v in range(16)]
    assert not set(halves[0]) & set(halves[1])
    assert all(first != second for first, second in orders)  # a new order each pass
