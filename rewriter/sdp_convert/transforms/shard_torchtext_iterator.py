"""Split the training examples a legacy torchtext iterator batches: ``sdp.shard(dataset)``.

Before::

    train = Dataset(examples=data["train"], fields=fields)
    val = Dataset(examples=data["valid"], fields=fields)
    train_iterator = BucketIterator(train, batch_size=64, device=device, train=True)
    val_iterator = BucketIterator(val, batch_size=64, device=device)

After::

    train_iterator = BucketIterator(sdp.shard(train), batch_size=64, device=device, train=True)
    val_iterator = BucketIterator(val, batch_size=64, device=device)

Why: a torchtext ``Iterator``/``BucketIterator`` (``torchtext.data`` before 0.9,
``torchtext.legacy.data`` until 0.12) batches and shuffles its dataset's ``examples`` itself and
takes no sampler, so every rank would train on all of the data. ``sdp.shard(train)`` is a copy of
the dataset holding every ``sdp.size()``-th example from this rank's on, ``ceil(n / size)`` on
every rank (the first examples again at the end where the count does not divide, as
``DistributedSampler`` pads), so every rank makes the same number of batches; the iterator's
shuffle and bucketing then run on each rank's part. The dataset object itself stays whole for
anything else that reads it.

Decisions (``program.example_lists``):

* Only an iterator whose loops are all training loops; one that feeds evaluation stays whole
  (every rank scores all of the validation data, as before).
* Only where the examples are in the same order on every rank: the dataset is a name bound once
  to a torchtext dataset constructor (``Dataset(examples=...)``, ``TranslationDataset(...)``,
  ``TabularDataset(...)``) that draws no random number and shuffles nothing (not ``.split()``,
  a random split). Otherwise ``shard_dataloader``'s manual note stays.
* Not with ``batch_size_fn=`` (batches counted in tokens: the ranks would make different
  numbers of batches) or ``**kwargs``.
* The learning rate is then scaled as for a sharded DataLoader (``scale_learning_rate``).
"""

from __future__ import annotations

import libcst as cst

from ..base import Transform
from ..program.example_lists import ExampleSplit, example_splits
from ..program.syntax import code


class ShardTorchtextIterator(Transform):
    DESCRIPTION = (
        "Hand a legacy torchtext iterator that feeds training this rank's part of its "
        "dataset's examples (sdp.shard)."
    )
    FRAMEWORKS = frozenset({"torch"})

    def prepare(self, module: cst.Module) -> None:
        self._splits: dict[cst.Call, ExampleSplit] = {
            split.iterator: split for split in example_splits(self.fm) if not split.done
        }
        for call, split in self._splits.items():
            self.add_runtime_import()
            name = code(split.dataset.value)
            self.record(call, (
                f"{code(call.func)}({self.sdp}.shard({name}), ...): each rank batches its own "
                f"part of {name}'s examples (every {self.sdp}.size()-th, the same count on every "
                "rank, padded as DistributedSampler pads); the iterator's shuffle runs on that "
                "part"))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        split = self._splits.get(original_node)
        if split is None:
            return updated_node
        index = original_node.args.index(split.dataset)
        arg = updated_node.args[index]
        value = cst.parse_expression(f"{self.sdp}.shard({code(arg.value)})")
        args = list(updated_node.args)
        args[index] = arg.with_changes(value=value)
        return updated_node.with_changes(args=args)
