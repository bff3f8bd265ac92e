"""Split the training data of a loader factory that builds the evaluation loaders too: a flag that
only the training calls set gives its DataLoader a DistributedSampler.

Before::

    def get_data_loader(dataset, batch_size, shuffle=False):
        data_loader = DataLoader(dataset=dataset, batch_size=batch_size, shuffle=shuffle)
        return data_loader

    train_loader = get_data_loader(train_data, 64, shuffle=True)
    valid_loader = get_data_loader(valid_data, 64)
    for epoch in range(epochs):
        train(train_loader, model, optimizer)
        evaluate(valid_loader, model)

After::

    def get_data_loader(dataset, batch_size, shuffle=False, shard=False):
        data_loader_sampler = (
            torch.utils.data.distributed.DistributedSampler(
                dataset, num_replicas=sdp.size(), rank=sdp.rank(), shuffle=shuffle
            )
            if shard
            else None
        )
        data_loader = DataLoader(dataset=dataset, batch_size=batch_size,
                                 shuffle=False if shard else shuffle, sampler=data_loader_sampler)
        return data_loader

    train_loader = get_data_loader(train_data, 64, shuffle=True, shard=True)
    valid_loader = get_data_loader(valid_data, 64)
    for epoch in range(epochs):
        train_loader.sampler.set_epoch(epoch)
        train(train_loader, model, optimizer)
        evaluate(valid_loader, model)

Why: a DistributedSampler added where the loader is built (``shard_dataloader``'s edit) would
split the evaluation data as well, each rank scoring its own part. With the flag, only the loaders
that feed training are split; the others are built exactly as before (the flag defaults to off,
also for callers in other modules).

Decisions:

* Which calls train and which evaluate is ``program.sharding.shared_factory``'s answer (the loops
  each call's loader reaches); the edit is ``factory_split``'s plan. Where it cannot be made (a
  ``**`` argument, a sampler of the loader's own that is not a plain ``RandomSampler`` /
  ``SequentialSampler``, a dataset that is not a name) ``shard_dataloader`` keeps its manual note
  naming the callers and this same edit.
* The flag is named ``shard`` (``shard_2``, ... where taken), added after the last parameter
  (keyword-only after ``*args``); the training calls pass ``shard=True``.
* A plain sampler of the loader's own (``sampler=RandomSampler(ds)``, or a name bound to one and
  read only there) stays the sampler when the flag is off; the DistributedSampler takes its
  ``shuffle`` (True for ``RandomSampler``). ``shuffle=`` on the loader becomes
  ``False if shard else <shuffle>`` (DataLoader refuses shuffle next to a sampler).
* ``<loader>.sampler.set_epoch(epoch)`` goes first in the ``for epoch in range(...)`` around each
  training loop, on the caller's variable (``program.sharding.set_epoch_site``); a manual note
  where there is none.

The same flag for a project's own batch-iterator class, asked by the whole-program contract
(``program.sample_lists``): a class whose ``__next__`` indexes ``self.annotations``, read from a
file in order and shuffled without a seed (``np.random.shuffle(annotations)``), serving training
and evaluation (``Dataset("train")``, ``Dataset("test")``), gets ``shard=False`` on ``__init__``
(stored first, ``self.shard = shard``) and, right before the shuffle, ``if self.shard:
annotations = sdp.shard(annotations)`` (``repair:shard_list``): every rank ``ceil(n / size)``
samples, the first ones repeated to fill, as ``DistributedSampler`` pads, so the samples and
batches per epoch the class counts are the same on every rank; only the training construction
passes ``shard=True`` (``repair:shard_list_call``). A class that draws batches with ``next()``
from DataLoaders it builds gets their sampler from ``shard_dataloader`` (``repair:shard_loader``)
and, where it restarts an iterator that ran out (``except StopIteration: self.iters[i] =
iter(self.loaders[i])``), ``self.loaders[i].sampler.set_epoch(self.loaders[i].sampler.epoch +
1)`` first (``repair:restart_epoch``): a new order each pass, the same on every rank.
"""

from __future__ import annotations

import libcst as cst

from ..base import Transform
from ..program.builders import conditional_statement, fresh_name, torch_spelling
from ..program.flow import epoch_loop, loader_sites
from ..program.loaders import LOADERS, loader_base_name, sets_epoch
from ..program.project import repairs_of
from ..program.sample_lists import ListSplit, list_split
from ..program.scopes import assigned_binding, runs_whenever, training_loops
from ..program.sharding import FactorySplit, factory_split, set_epoch_site
from ..program.syntax import append_arg


def _keyword(name: str, value: str) -> cst.Arg:
    return cst.Arg(
        keyword=cst.Name(name),
        value=cst.parse_expression(value),
        equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        ),
    )


class ShardSharedLoader(Transform):
    DESCRIPTION = (
        "Give a loader factory shared by training and evaluation a flag that only the training "
        "calls set, adding a DistributedSampler (and set_epoch each epoch); the same for a "
        "project's batch-iterator class, whose sample list the flag splits before its shuffle."
    )
    FRAMEWORKS = frozenset({"torch", "tensorflow"})
    PROJECT_ROLES = frozenset({"repair:shard_list", "repair:shard_list_call",
                               "repair:restart_epoch"})

    def prepare(self, module: cst.Module) -> None:
        self._taken: dict[cst.CSTNode, set[str]] = {}
        #: loader call -> (its plan, its sampler's name, the flag)
        self._loaders: dict[cst.Call, tuple[FactorySplit, str, str]] = {}
        self._functions: dict[cst.FunctionDef, str] = {}  # factory -> its flag
        self._callers: dict[cst.Call, str] = {}  # training call -> the flag it sets
        self._epochs: set[tuple[int, str]] = set()
        self._strip: set[cst.CSTNode] = set()  # statements whose leading lines moved up
        self._lists: dict[cst.FunctionDef, ListSplit] = {}  # __init__ -> its list's split
        self._list_calls: dict[cst.Call, str] = {}  # training construction -> flag
        if "shard_dataloader" in self.fm.skip:
            return  # the user splits the data by hand (``--skip shard_dataloader``)
        self._sample_lists()
        if self.fm.info.framework != "torch":
            return
        for call in self.calls_to(*LOADERS):
            split = factory_split(self.fm, call)
            if split is not None:
                self._plan(call, split)

    def _plan(self, call: cst.Call, split: FactorySplit) -> None:
        function = split.shared.function
        flag = self._functions.get(function)
        if flag is None:
            flag = self._functions[function] = fresh_name(self.fm, self._taken, "shard", function)
        own = assigned_binding(self.fm, call)
        sampler = fresh_name(self.fm, self._taken, loader_base_name(own) + "_sampler", function)
        self._loaders[call] = (split, sampler, flag)
        stmt = self.enclosing_statement(call)
        assert stmt is not None
        torch = torch_spelling(self.fm, self.add_import)
        args = [split.dataset, f"num_replicas={self.sdp}.size()", f"rank={self.sdp}.rank()",
                f"shuffle={split.shuffle}"]
        new = conditional_statement(self.fm, sampler,
                                    f"{torch}.utils.data.distributed.DistributedSampler", args,
                                    flag, split.fallback)
        if isinstance(stmt, cst.SimpleStatementLine) and stmt.leading_lines:
            # The statement's comment and blank lines go above the sampler.
            new = new.with_changes(leading_lines=stmt.leading_lines)
            self._strip.add(stmt)
        self.insert_before(stmt, new)
        self.add_runtime_import()
        helper = function.name.value
        for caller in split.shared.train:
            self._callers[caller] = flag
        self.record(call, (
            f"give the DataLoader {helper}() builds a DistributedSampler ({sampler}, "
            f"shuffle={split.shuffle}) when its new {flag}= flag is set, so that each rank reads "
            f"its own shard of the training data; only the training calls set it "
            f"({', '.join(split.shared.train_names)}); the loaders for "
            f"{split.shared.others} stay whole"))
        self._set_epochs(call, split, own, sampler, stmt)

    def _sample_lists(self) -> None:
        """The whole-program contract's repairs of a batch-iterator class's sample list (and of
        the loaders a class draws from): the flag, the split, the training construction."""
        for repair, node in repairs_of(self.fm, "shard_list"):
            cls = next((a for a in self.ancestors(node) if isinstance(a, cst.ClassDef)), None)
            split = list_split(self.fm, cls) if cls is not None else None
            if split is None or split.call is not node or split.flag != repair.detail:
                continue
            self._plan_list(split)
        for repair, node in repairs_of(self.fm, "shard_list_call"):
            if isinstance(node, cst.Call) and not any(
                a.keyword is not None and a.keyword.value == repair.detail for a in node.args
            ):
                self._list_calls[node] = repair.detail
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

    def _plan_list(self, split: ListSplit) -> None:
        self._lists[split.init] = split
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

    def _set_epochs(self, call: cst.Call, split: FactorySplit, own: object, sampler: str,
                    stmt: cst.BaseStatement) -> None:
        sites, flow = loader_sites(self.fm, call)
        loops = training_loops(self.fm)
        found = unbound = False
        for site in sites:
            if site.loop not in loops:
                continue
            where = set_epoch_site(self.fm, site, own, sampler, stmt, flow)  # type: ignore[arg-type]
            if where is None or where.inside or where.receiver == sampler:
                continue  # no epoch loop, or one that cannot see the caller's loader
            loop, receiver = where.loop, where.receiver
            holder = epoch_loop(self.fm, site)
            if holder is not None and holder[1] is not None and holder[1].kind == "assign" and (
                not runs_whenever(self.fm, holder[1].stmt, loop)
            ):
                unbound = True  # bound on some paths to the loop only (``if __name__ ...``)
                continue
            found = True
            key = (id(loop), receiver)
            if key in self._epochs or sets_epoch(self.fm, loop, receiver) or where.before is None:
                continue
            self._epochs.add(key)
            set_epoch = f"{receiver}.set_epoch({where.counter})"
            self.insert_before(where.before, cst.parse_statement(set_epoch + "\n"))
            self.record(loop, f"call {set_epoch} at the start of each epoch")
        if not found and split.shuffle not in ("False", "None", "0"):
            calls = " and ".join(f"{name}.sampler.set_epoch(epoch)"
                                 for name in split.shared.train_names)
            why = ("the epoch loop can run where the loader is not bound, so it is not put "
                   "there" if unbound else "found no `for epoch in range(...)` loop, nor a loop "
                   "counting its passes over the loader, to put it in")
            self.record(call, f"call {calls} at the start of every epoch ({why}), or every epoch "
                        "sees the same order", manual=True)

    # -- the rewrite ----------------------------------------------------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        flag = self._callers.get(original_node) or self._list_calls.get(original_node)
        if flag is not None:
            args = append_arg(list(updated_node.args), _keyword(flag, "True"), updated_node)
            return updated_node.with_changes(args=args)
        planned = self._loaders.get(original_node)
        if planned is None or len(updated_node.args) != len(original_node.args):
            return updated_node
        split, sampler, flag = planned
        args = list(updated_node.args)
        if split.shuffle_arg is not None:
            arg = args[split.shuffle_arg]
            shuffle = self.module.code_for_node(arg.value)
            args[split.shuffle_arg] = arg.with_changes(
                value=cst.parse_expression(f"False if {flag} else {shuffle}"))
        if split.sampler_arg is not None:
            args[split.sampler_arg] = args[split.sampler_arg].with_changes(value=cst.Name(sampler))
        else:
            args = append_arg(args, _keyword("sampler", sampler), updated_node)
        return updated_node.with_changes(args=args)

    def leave_Parameters(
        self, original_node: cst.Parameters, updated_node: cst.Parameters
    ) -> cst.Parameters:
        function = self.parent(original_node)
        flag = self._functions.get(function) if isinstance(function, cst.FunctionDef) else None
        listed = self._lists.get(function) if isinstance(function, cst.FunctionDef) else None
        flag = listed.flag if listed is not None else flag
        if flag is None:
            return updated_node
        param = cst.Param(name=cst.Name(flag), default=cst.Name("False"),
                          equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                whitespace_after=cst.SimpleWhitespace("")))
        if isinstance(updated_node.star_arg, (cst.Param, cst.ParamStar)):
            return updated_node.with_changes(
                kwonly_params=_appended(list(updated_node.kwonly_params), param))
        return updated_node.with_changes(params=_appended(list(updated_node.params), param))

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        if original_node in self._strip:
            return updated_node.with_changes(leading_lines=())
        return updated_node


def _appended(params: list[cst.Param], new: cst.Param) -> list[cst.Param]:
    """``params`` with ``new`` last, keeping a trailing comma where there was one."""
    if params and isinstance(params[-1].comma, cst.Comma):
        return [*params, new.with_changes(comma=params[-1].comma)]
    if params:
        params[-1] = params[-1].with_changes(
            comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return [*params, new]
