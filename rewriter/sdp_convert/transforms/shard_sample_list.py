"""Split the sample list of a project's own batch-iterator class by rank, where the list is made,
for the training instance only.

Before (``data.py``; ``train.py`` iterates ``Dataset("train")`` in its training loop)::

    class Dataset:
        def __init__(self, split):
            self.path = TRAIN if split == "train" else TEST
            self.annotations = self.load_annotations()
            self.num_batchs = int(np.ceil(len(self.annotations) / self.batch_size))

        def load_annotations(self):
            with open(self.path) as f:
                annotations = [line.strip() for line in f.readlines()]
            np.random.shuffle(annotations)
            return annotations

After::

    class Dataset:
        def __init__(self, split, shard=False):
            self.shard = shard
            ...

        def load_annotations(self):
            with open(self.path) as f:
                annotations = [line.strip() for line in f.readlines()]
            if self.shard:
                annotations = sdp.shard(annotations)
            np.random.shuffle(annotations)
            return annotations

    trainset = Dataset("train", shard=True)     # train.py
    testset = Dataset("test")                   # whole, as before

Why: the class reads the whole file on every worker, each worker in its own unseeded order, so
the workers' batches overlap. Split after the list is read in file order (the same on every
worker) and before the shuffle, each worker gets its own ``ceil(n / size)`` samples (the first
ones repeated to fill, as ``DistributedSampler`` pads), and the counts the class derives from the
list (samples, batches per epoch) are the same on every worker. Which lists qualify is
``program.sample_lists.list_split``'s proof; the whole-program contract asks for the repair
(``repair:shard_list`` in the class's module, ``repair:shard_list_call`` at the training
construction) when the data a training loop reads comes from such a class.

Also (torch): a class that builds DataLoaders and draws batches from them with ``next()``,
restarting a loader's iterator where it runs out (``except StopIteration: self.iters[i] =
iter(self.loaders[i])``), gets a ``DistributedSampler`` per loader from ``shard_dataloader``
(``repair:shard_loader``); the restart is this transform's (``repair:restart_epoch``): the
sampler's own epoch count goes up before the new pass,
``self.loaders[i].sampler.set_epoch(self.loaders[i].sampler.epoch + 1)``, so each pass draws a
new order, the same on every rank (every rank restarts at the same step: the sampler gives each
the same number of samples).
"""

from __future__ import annotations

import libcst as cst

from ..base import Transform
from ..program.project import repairs_of
from ..program.sample_lists import ListSplit, list_split
from ..program.syntax import append_arg


def _keyword(name: str, value: str) -> cst.Arg:
    return cst.Arg(keyword=cst.Name(name), value=cst.parse_expression(value),
                   equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                         whitespace_after=cst.SimpleWhitespace("")))


class ShardSampleList(Transform):
    DESCRIPTION = (
        "Split the sample list a project's batch-iterator class reads, by rank, before it is "
        "shuffled, behind a constructor flag only the training construction sets."
    )
    FRAMEWORKS = frozenset({"tensorflow", "torch"})
    PROJECT_ROLES = frozenset({"repair:shard_list", "repair:shard_list_call",
                               "repair:restart_epoch"})

    def prepare(self, module: cst.Module) -> None:
        self._splits: dict[cst.FunctionDef, ListSplit] = {}  # __init__ -> its split
        self._calls: dict[cst.Call, str] = {}  # training construction -> flag
        if "shard_tf_dataset" in self.fm.skip:
            return  # the user splits the data by hand
        for repair, node in repairs_of(self.fm, "shard_list"):
            cls = next((a for a in self.ancestors(node) if isinstance(a, cst.ClassDef)), None)
            split = list_split(self.fm, cls) if cls is not None else None
            if split is None or split.call is not node or split.flag != repair.detail:
                continue
            self._plan(split)
        for repair, node in repairs_of(self.fm, "shard_list_call"):
            if isinstance(node, cst.Call) and not any(
                a.keyword is not None and a.keyword.value == repair.detail for a in node.args
            ):
                self._calls[node] = repair.detail
                self.record(node, (
                    f"pass {repair.detail}=True: this construction feeds the training loop, so "
                    f"its sample list is split by rank (the other constructions stay whole)"))
        for _, node in repairs_of(self.fm, "restart_epoch"):
            self._restart(node)

    def _restart(self, node: cst.CSTNode) -> None:
        """``iter(loader)`` that starts a new pass where ``next()`` ran out (a class drawing
        batches from loaders the contract gave a DistributedSampler): the sampler's own epoch
        count goes up first, so each pass has a new order, the same on every rank."""
        stmt = self.enclosing_statement(node)
        if not (isinstance(node, cst.Call) and len(node.args) == 1 and isinstance(
                stmt, cst.SimpleStatementLine)) or "set_epoch" in self.module.code_for_node(
                self.parent(stmt) or stmt):
            return
        sampler = f"{self.module.code_for_node(node.args[0].value)}.sampler"
        call = f"{sampler}.set_epoch({sampler}.epoch + 1)"
        self.insert_before(stmt, cst.parse_statement(call + "\n"))
        self.record(node, f"call {call} before a new pass over the loader starts, so that each "
                    "pass draws a new order (the same on every rank)")

    def _plan(self, split: ListSplit) -> None:
        self._splits[split.init] = split
        self.add_runtime_import()
        body = split.init.body.body
        first = body[0]
        if (len(body) > 1 and isinstance(first, cst.SimpleStatementLine)
                and isinstance(first.body[0], cst.Expr)
                and isinstance(first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))):
            first = body[1]  # after the docstring
        self.insert_before(first, cst.parse_statement(f"self.{split.flag} = {split.flag}\n"))
        name = split.name
        self.insert_before(split.before, cst.parse_statement(
            f"if self.{split.flag}:\n    {name} = {self.sdp}.shard({name})\n"))
        self.record(split.call, (
            f"split {name}, the sample list {split.cls.name.value} reads (self.{split.attr}), by "
            f"rank in {split.method.name.value}() when the new {split.flag}= flag is set: "
            f"{self.sdp}.shard gives each worker its own ceil(n / size) samples (the first ones "
            f"repeated to fill, as DistributedSampler pads), before the shuffle, so the samples "
            f"and batches per epoch it counts are the same on every worker"))

    def leave_Parameters(
        self, original_node: cst.Parameters, updated_node: cst.Parameters
    ) -> cst.Parameters:
        function = self.parent(original_node)
        split = self._splits.get(function) if isinstance(function, cst.FunctionDef) else None
        if split is None:
            return updated_node
        param = cst.Param(name=cst.Name(split.flag), default=cst.Name("False"),
                          equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                whitespace_after=cst.SimpleWhitespace("")))
        if isinstance(updated_node.star_arg, (cst.Param, cst.ParamStar)):
            return updated_node.with_changes(
                kwonly_params=[*updated_node.kwonly_params, param])
        return updated_node.with_changes(params=[*updated_node.params, param])

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        flag = self._calls.get(original_node)
        if flag is None:
            return updated_node
        args = append_arg(list(updated_node.args), _keyword(flag, "True"), updated_node)
        return updated_node.with_changes(args=args)
