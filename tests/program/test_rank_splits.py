"""program.rank_splits: data an SMP script splits by dp_rank itself, and what the answer of
program.sharding (is this file's training data split?) becomes with it."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from sdp_convert.program.rank_splits import made_for_rank, split_by_rank
from sdp_convert.program.sharding import training_data

from .helpers import probe

SMP = """\
import smdistributed.modelparallel.torch as smp
import torch
from torchnet.dataset import SplitDataset

smp.init()
"""
LOOP = """\
for x, y in train_loader:
    loss_mb = train_step(model, x, y)
    optimizer.step()
"""


def _loader(t) -> cst.Call:
    return next(c for c in m.findall(t.module, m.Call(func=m.Attribute(attr=m.Name("DataLoader")))))


def test_split_dataset_selected_by_dp_rank_is_this_ranks_part():
    t = probe(SMP + """\
dataset = SplitDataset(dataset, partitions={"0": 0.5, "1": 0.5})
dataset.select(f"{smp.dp_rank()}")
train_loader = torch.utils.data.DataLoader(dataset, batch_size=8)
""" + LOOP)
    assert split_by_rank(t, _loader(t))
    assert training_data(t).sharded


def test_the_same_loader_without_the_select_is_not_split():
    t = probe(SMP + """\
dataset = SplitDataset(dataset, partitions={"0": 0.5, "1": 0.5})
dataset.select("0")
train_loader = torch.utils.data.DataLoader(dataset, batch_size=8)
""" + LOOP)
    assert not split_by_rank(t, _loader(t))


def test_loader_factory_given_the_rank_through_a_name():
    t = probe(SMP + """\
from data_pipeline import create_pretraining_dataloader

def train(model, optimizer, args):
    dp_rank = smp.dp_rank() if not args.prescaled_batch else smp.rdp_rank()
    dp_size = smp.dp_size() if not args.prescaled_batch else smp.rdp_size()
    train_dataloader = create_pretraining_dataloader(paths, 4, dp_rank=dp_rank, dp_size=dp_size)
    for batch_idx, (ids, mask) in enumerate(train_dataloader):
        loss = train_step(model, ids, mask).reduce_mean()
        optimizer.step()
""")
    loop = next(iter(m.findall(t.module, m.For())))
    assert isinstance(loop, cst.For) and made_for_rank(t, loop.iter)
    assert training_data(t).sharded


def test_a_factory_given_no_rank_is_not_a_split():
    t = probe(SMP + """\
from data_pipeline import create_pretraining_dataloader

def train(model, optimizer, args):
    train_dataloader = create_pretraining_dataloader(paths, 4, seed=args.seed)
    for batch_idx, (ids, mask) in enumerate(train_dataloader):
        loss = train_step(model, ids, mask).reduce_mean()
        optimizer.step()
""")
    loop = next(iter(m.findall(t.module, m.For())))
    assert isinstance(loop, cst.For) and not made_for_rank(t, loop.iter)
    assert not training_data(t).sharded
